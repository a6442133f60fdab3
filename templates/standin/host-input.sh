# Builder of the stand-in's placeholder inputs and host-tool links (run as `bash -e host-input.sh`): each line of
# $links is `RELATIVE-PATH HOST-PATH`, made a symlink $out/RELATIVE-PATH -> HOST-PATH (bin/perl, lib/pkgconfig/zlib.pc).
set -euo pipefail
mkdir -p "$out/nix-support"
printf '%s\n' "$note" > "$out/nix-support/flakebot-host"
if [ -n "${libraries:-}" ]; then printf '%s\n' "$libraries" > "$out/nix-support/flakebot-libraries"; fi
# Only paths the host has are listed: the builder may not see them (the host toolchain is not in its sandbox).
while read -r relative target; do
  if [ -z "$relative" ]; then continue; fi
  mkdir -p "$(dirname "$out/$relative")"
  ln -s "$target" "$out/$relative"
done <<< "$links"
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
