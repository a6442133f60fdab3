# Builder of the stand-in's placeholder inputs and host-tool links (run as `bash -e host-input.sh`).
set -euo pipefail
mkdir -p "$out/nix-support" "$out/bin"
printf '%s\n' "$note" > "$out/nix-support/flakebot-host"
# $tools are the ones the host has: the builder may not see $toolDir (the host toolchain is not in its sandbox).
for tool in $tools; do
  ln -s "$toolDir/$tool" "$out/bin/$tool"
done
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
