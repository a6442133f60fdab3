# Builder of the stand-in's placeholder inputs and host-tool links (run as `bash -e host-input.sh`).
set -euo pipefail
mkdir -p "$out/nix-support" "$out/bin"
printf '%s\n' "$note" > "$out/nix-support/flakebot-host"
for tool in $tools; do
  if [ -e "$toolDir/$tool" ]; then
    ln -s "$toolDir/$tool" "$out/bin/$tool"
  fi
done
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
