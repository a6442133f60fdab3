# Builder of the stand-in's git fetch (run as `bash -e fetch-git.sh`), a fixed-output derivation: the repository $url
# at commit $commit, as nixpkgs' fetchgit leaves it (submodules checked out, every .git removed), so its recursive
# hash is the one cargoLock.outputHashes gives for nixpkgs too.
set -euo pipefail
export HOME="$NIX_BUILD_TOP/home" GIT_CONFIG_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0
mkdir -p "$HOME"
git init -q "$out"
cd "$out"
git remote add origin "$url"
# A server that refuses unadvertised commits gets asked for every branch and tag instead (as nix-prefetch-git does).
if ! git fetch -q --depth 1 origin "$commit"; then
  git fetch -q origin '+refs/heads/*:refs/remotes/origin/*' '+refs/tags/*:refs/tags/*'
fi
git -c advice.detachedHead=false checkout -q "$commit"
if [ -f .gitmodules ]; then git submodule update -q --init --recursive; fi
find "$out" -name .git -prune -exec rm -rf {} +
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
