#!/usr/bin/env bash
# make bench: the usual set-up plus the P8 corpus, real binary crates from Debian's registry
# (benchmarks/perf/corpus.py CORPUS; a test keeps the two lists in step).
set -euo pipefail
cd "$(dirname "$0")/.."
# The host stand-in links the host's own C libraries: libonig-dev is bat's oniguruma (nixpkgs' `oniguruma`
# in a pinned build); Debian's onig_sys crate brings only the runtime library.
BENCH_APT_PACKAGES="librust-hexyl-dev librust-dotenv-dev librust-lscolors-dev librust-sha1collisiondetection-dev librust-cargo-lock-dev librust-git-absorb-dev librust-pleaser-dev librust-cbindgen-dev librust-lalrpop-dev librust-bat-dev librust-sniffglue-dev librust-bindgen-dev librust-grcov-dev librust-rav1e-dev librust-sequoia-sop-dev librust-cargo-c-dev libonig-dev" \
  exec bash scripts/setup.sh
