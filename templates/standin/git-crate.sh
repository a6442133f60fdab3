# Builder of one vendored git package (run as `bash -e git-crate.sh`), as importCargoLock makes it: the folder of the
# package named $crateName in the clone $tree (the top-level manifest's workspace first, else every Cargo.toml in the
# tree), copied with an empty .cargo-checksum.json, which cargo accepts for a git source.
set -euo pipefail
export HOME="$NIX_BUILD_TOP/home" CARGO_HOME="$NIX_BUILD_TOP/cargo-home"
mkdir -p "$HOME" "$CARGO_HOME"
if ! command -v jq > /dev/null; then
  echo "the host stand-in finds git packages with jq, which this machine lacks: install jq (apt-get install jq)" >&2
  exit 1
fi

manifest_of() {
  cargo metadata --format-version 1 --no-deps --offline --manifest-path "$1" 2>/dev/null \
    | jq -r --arg name "$crateName" '.packages[] | select(.name == $name) | .manifest_path'
}

found=""
if [ -f "$tree/Cargo.toml" ]; then found=$(manifest_of "$tree/Cargo.toml" || true); fi
if [ -z "$found" ]; then
  while IFS= read -r manifest; do
    found=$(manifest_of "$manifest" || true)
    if [ -n "$found" ]; then break; fi
  done < <(find "$tree" -name Cargo.toml | sort)
fi
if [ -z "$found" ]; then
  echo "Cannot find path for crate '$crateName' in the tree in: $tree" >&2
  exit 1
fi
echo "Found crate $crateName at $found"
if grep -Eq '(^|[.{ ,])workspace *= *true' "$found"; then
  echo "crate $crateName inherits values from its workspace (workspace = true), which this stand-in does not resolve; build with --nixpkgs pinned" >&2
  exit 1
fi
cp -rL "$(dirname "$found")" "$out"
chmod -R u+w "$out"
printf '{"files":{},"package":null}' > "$out/.cargo-checksum.json"
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
