# Builder of the stand-in's cargo vendor directory (run as `bash -e vendor-crates.sh`), as nixpkgs' importCargoLock
# makes it: each fetched .crate (a gzip'd tar of NAME-VERSION/) unpacked into $out/NAME-VERSION/ with a
# .cargo-checksum.json naming the lock's checksum, so cargo accepts the folder as that locked package; each git
# package's folder linked as $out/NAME-VERSION; the git sources' replacements in $out/.cargo/config.toml; the lock.
set -euo pipefail
mkdir -p "$out/.cargo"
while read -r name version checksum crate; do
  if [ -z "$name" ]; then continue; fi
  mkdir "$out/$name-$version"
  tar -xzf "$crate" -C "$out/$name-$version" --strip-components=1 --no-same-owner --no-same-permissions
  printf '{"files":{},"package":"%s"}' "$checksum" > "$out/$name-$version/.cargo-checksum.json"
done <<< "$crates"
while read -r key crate; do
  if [ -z "$key" ]; then continue; fi
  ln -s "$crate" "$out/$key"
done <<< "$gitCrates"
printf '%s' "$gitSources" > "$out/.cargo/config.toml"
printf '%s' "$cargoLockText" > "$out/Cargo.lock"
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
