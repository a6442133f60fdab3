# Builder of the stand-in's buildRustPackage (run as `bash -e cargo-build.sh`): the host's cargo, offline,
# against the crates nix fetched by the lock's checksums ($flakebotVendorDir) or else the local directory
# source ($flakebotRegistry), and the lock's git packages (in $flakebotVendorDir too); installs every executable
# cargo built into $out/bin.
set -euo pipefail

# HOME stays Nix's /homeless-shelter, which does not exist and cannot be made: as in nixpkgs, a build or test that
# writes there fails.
export CARGO_HOME="$NIX_BUILD_TOP/cargo-home"
# cargo's target directory where nixpkgs has it: target/ at the source root (cargoBuildHook keeps it there with
# buildAndTestSubdir too), so a preBuild can seed it.
export CARGO_TARGET_DIR="$NIX_BUILD_TOP/source/target"
export CARGO_TERM_COLOR=never
mkdir -p "$CARGO_HOME"
# Declared inputs only, as nixpkgs' setup hooks give them: each one's bin/ on PATH, and pkg-config searches just
# their lib/pkgconfig (never the host's own directories).
pkgConfigDirs="$NIX_BUILD_TOP/no-pkg-config-modules"
flakebotDeclaredLibraries=""
for input in $nativeBuildInputs $buildInputs $nativeCheckInputs $checkInputs; do
  if [ -d "$input/bin" ]; then PATH="$input/bin:$PATH"; fi
  if [ -d "$input/lib/pkgconfig" ]; then pkgConfigDirs="$pkgConfigDirs:$input/lib/pkgconfig"; fi
  if [ -f "$input/nix-support/flakebot-libraries" ]; then
    flakebotDeclaredLibraries="$flakebotDeclaredLibraries $(cat "$input/nix-support/flakebot-libraries")"
  fi
done
# The linker still searches the host's library directories; the C compilers rustc and build scripts call refuse a
# -lNAME of a nixpkgs attribute the build did not declare, and one no attribute of flakebot's table gives (neither
# stdenv's C runtime nor a library the build made under $NIX_BUILD_TOP), with ld's own words (which the build-log
# evidence reads).
stdenvLibraries="c m dl pthread rt util resolv anl nsl gcc gcc_s gcc_eh stdc++ atomic"
mkdir -p "$NIX_BUILD_TOP/cc-wrapper"
for compiler in cc gcc c++ g++; do
  if [ ! -e "$flakebotStdenv/bin/$compiler" ]; then continue; fi
  cat > "$NIX_BUILD_TOP/cc-wrapper/$compiler" <<WRAPPER
#!$BASH
built=()
previous=""
for arg in "\$@"; do  # -LDIR or -L DIR (rustc's spelling)
  if [ "\$previous" = -L ]; then arg="-L\$arg"; fi
  case "\$arg" in -L$NIX_BUILD_TOP/*|-L/nix/store/*) built+=("\${arg#-L}") ;; esac
  previous="\$arg"
done
refuse() {
  echo "/usr/bin/ld: cannot find -l\$1: No such file or directory (flakebot stand-in: \$2)" >&2
  echo "collect2: error: ld returned 1 exit status" >&2
  exit 1
}
for arg in "\$@"; do
  case "\$arg" in
    -l[!:]*)
      name="\${arg#-l}"
      if [[ " $flakebotKnownLibraries " == *" \$name "* ]]; then
        if [[ " $flakebotDeclaredLibraries " != *" \$name "* ]]; then refuse "\$name" "its nixpkgs attribute is not declared"; fi
      elif [[ " $stdenvLibraries " != *" \$name "* ]]; then
        found=""
        for dir in "\${built[@]}"; do
          if [ -e "\$dir/lib\$name.a" ] || [ -e "\$dir/lib\$name.so" ]; then found=1; fi
        done
        if [ -z "\$found" ]; then refuse "\$name" "no nixpkgs attribute in flakebot's table gives it"; fi
      fi ;;
  esac
done
exec "$flakebotStdenv/bin/$compiler" "\$@"
WRAPPER
  chmod +x "$NIX_BUILD_TOP/cc-wrapper/$compiler"
done
PATH="$NIX_BUILD_TOP/cc-wrapper:$PATH"
export PATH PKG_CONFIG_LIBDIR="$pkgConfigDirs" PKG_CONFIG_PATH=""
# The source configuration nixpkgs' cargoSetupHook writes for importCargoLock's vendor directory: crates.io replaced
# by the vendor directory ($flakebotCratesIo = vendored-sources) or by the local directory source, each git source
# replaced by the vendor directory (its .cargo/config.toml).
{
  printf '[source.crates-io]\nreplace-with = "%s"\n\n' "$flakebotCratesIo"
  if [ "$flakebotCratesIo" = flakebot-local ]; then
    printf '[source.flakebot-local]\ndirectory = "%s"\n\n' "$flakebotRegistry"
  fi
  if [ -n "$flakebotVendorDir" ]; then
    # cargoSetupHook copies the vendor directory into the build directory (named without its hash), so crates' paths,
    # which cargo's fingerprints hash, are the same in every build: a deps derivation's output stays fresh here.
    cp -rL "$flakebotVendorDir" "$NIX_BUILD_TOP/cargo-vendor-dir"
    chmod -R u+w "$NIX_BUILD_TOP/cargo-vendor-dir"
    printf '[source.vendored-sources]\ndirectory = "%s"\n\n' "$NIX_BUILD_TOP/cargo-vendor-dir"
    cat "$flakebotVendorDir/.cargo/config.toml"
    printf '\n'
  fi
  printf '[net]\noffline = true\n'
} > "$CARGO_HOME/config.toml"

# As nixpkgs' unpackPhase: timestamps kept (the store's), so cargo decides freshness as it does there.
cp -r --preserve=timestamps "$src" "$NIX_BUILD_TOP/source"
chmod -R u+w "$NIX_BUILD_TOP/source"
cd "$NIX_BUILD_TOP/source"
if [ -n "$cargoLockFile" ]; then cp "$cargoLockFile" Cargo.lock; chmod u+w Cargo.lock; fi
if [ -n "$cargoLockContents" ]; then printf '%s' "$cargoLockContents" > Cargo.lock; fi
eval "$postPatch"

# nixpkgs builds with --target the host triple: output in target/TRIPLE/PROFILE, RUSTFLAGS not given to build scripts.
case "$buildType" in
  release) profile=(--release --target "$hostTriple"); profileDir="$hostTriple/release" ;;
  debug) profile=(--target "$hostTriple"); profileDir="$hostTriple/debug" ;;
  *) profile=(--profile "$buildType" --target "$hostTriple"); profileDir="$hostTriple/$buildType" ;;
esac

mapfile -t buildFlags < <(printf '%s' "$cargoBuildFlags")
mapfile -t testFlags < <(printf '%s' "$cargoTestFlags")
mapfile -t testArgs < <(printf '%s' "$checkFlags")
features=()
if [ -n "$buildNoDefaultFeatures" ]; then features+=(--no-default-features); fi
if [ -n "$buildFeatures" ]; then features+=(--features "$buildFeatures"); fi
checkFeatureFlags=()
if [ -n "$checkNoDefaultFeatures" ]; then checkFeatureFlags+=(--no-default-features); fi
if [ -n "$checkFeatures" ]; then checkFeatureFlags+=(--features "$checkFeatures"); fi

# cargoBuildHook runs preBuild at the source root, then enters buildAndTestSubdir.
eval "$preBuild"
if [ -n "$buildAndTestSubdir" ]; then cd "$buildAndTestSubdir"; fi
echo "flakebot stand-in: cargo build ${profile[*]} ${features[*]} ${buildFlags[*]}"
cargo build --frozen "${profile[@]}" "${features[@]}" "${buildFlags[@]}"
eval "$postBuild"

if [ -n "$doCheck" ]; then
  eval "$preCheck"
  echo "flakebot stand-in: cargo test ${profile[*]} ${checkFeatureFlags[*]} ${testFlags[*]}"
  cargo test --frozen "${profile[@]}" "${checkFeatureFlags[@]}" "${testFlags[@]}" -- "${testArgs[@]}"
  eval "$postCheck"
fi

# An installPhase replaces cargoInstallHook (and its preInstall and postInstall), as in nixpkgs; it runs at the
# source root.
cd "$NIX_BUILD_TOP/source"
if [ -n "$installPhase" ]; then
  eval "$installPhase"
else
  eval "$preInstall"
  mkdir -p "$out/bin"
  for file in "$CARGO_TARGET_DIR/$profileDir"/*; do
    case "$file" in *.so | *.so.* | *.a | *.rlib | *.d | *.dylib) continue ;; esac
    if [ -f "$file" ] && [ -x "$file" ]; then cp "$file" "$out/bin/"; fi
  done
  eval "$postInstall"
fi
# End with a builtin: see DESIGN.md (Nix kills a builder whose last command closed its output early).
exit 0
