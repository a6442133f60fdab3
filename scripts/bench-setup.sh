#!/usr/bin/env bash
# make bench: the usual set-up plus the P8 corpus, real binary crates from Debian's registry
# (benchmarks/perf/corpus.py CORPUS, chosen by the rule written there; a test keeps the two lists in step).
set -euo pipefail
cd "$(dirname "$0")/.."
# The host stand-in links the host's own C libraries: libonig-dev is bat's oniguruma (nixpkgs' `oniguruma`
# in a pinned build); Debian's onig_sys crate brings only the runtime library. The programs build scripts run come
# with Debian's own dependencies: nasm (rav1e's nasm-rs), curl-config (cargo-c's curl-sys: libcurl4-gnutls-dev).
BENCH_APT_PACKAGES="librust-resource-proof-dev librust-dotenv-dev librust-git-absorb-dev librust-libslirp-dev librust-hexyl-dev librust-lscolors-dev librust-cargo-binutils-dev librust-sequoia-sop-dev librust-rustdoc-stripper-dev librust-cargo-c-dev librust-cargo-lock-dev librust-filespooler-dev librust-difference-dev librust-protobuf-codegen-dev librust-zram-generator-dev librust-markdown-dev librust-xml-rs-dev librust-pleaser-dev librust-sniffglue-dev librust-grcov-dev librust-debcargo-dev librust-pulldown-cmark-dev librust-cbindgen-dev librust-bindgen-dev librust-sha1collisiondetection-dev librust-lalrpop-dev librust-sequoia-wot-dev librust-bat-dev librust-rsass-dev librust-rav1e-dev libonig-dev" \
  exec bash scripts/setup.sh
