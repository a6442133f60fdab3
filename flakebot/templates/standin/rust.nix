# rustPlatform.buildRustPackage for the stand-in: the host's cargo, offline, against the crates of cargoLock.
# Arguments are checked against nixpkgs' real buildRustPackage: an attribute nixpkgs does not accept
# is an error here too, so a flake that builds with the stand-in also evaluates with real nixpkgs.
# Where the crates come from is decided per lock:
# - every crates.io package carries a real checksum (a lock cargo wrote against crates.io or a mirror of it) and the
#   local directory source does not hold them all at those checksums: each crate is a fixed-output fetch by its
#   checksum from host.cratesioStaticUrl, unpacked into one vendor directory, as nixpkgs' importCargoLock does;
#   bytes that differ fail the build with nix's hash mismatch;
# - otherwise the local directory source host.registry, as before: Debian's registry writes "Could not get crate
#   checksum" (or nothing) for some crates, and keeps crates.io's checksum for many others, so a lock it satisfies
#   exactly builds from it without network (cargo checks the same checksums against it).
{ lib, host, system }:
let
  fail = message: throw "flakebot host stand-in for nixpkgs: ${message}";
  names = list: lib.concatStringsSep ", " list;

  # Arguments of nixpkgs' buildRustPackage (pkgs/build-support/rust/build-rust-package), the variables
  # its cargo hooks read, and the stdenv.mkDerivation attributes Rust packages commonly pass.
  accepted = [
    "name" "pname" "version" "src" "srcs" "sourceRoot" "cargoRoot" "cargoDepsName" "cargoPatches" "patches"
    "logLevel" "buildInputs" "nativeBuildInputs" "cargoUpdateHook" "cargoDepsHook" "buildType" "meta"
    "cargoDeps" "cargoLock" "cargoVendorDir" "cargoHash" "checkType" "buildNoDefaultFeatures"
    "checkNoDefaultFeatures" "buildFeatures" "checkFeatures" "useNextest" "auditable" "depsExtraArgs"
    "buildAndTestSubdir" "RUSTFLAGS" "env" "useFetchCargoVendor"
    "cargoBuildFlags" "cargoTestFlags" "checkFlags" "dontCargoBuild" "dontCargoCheck" "dontCargoInstall"
    "dontUseCargoParallelTests"
    "doCheck" "doInstallCheck" "nativeCheckInputs" "checkInputs" "nativeInstallCheckInputs" "installCheckInputs"
    "propagatedBuildInputs" "propagatedNativeBuildInputs" "passthru" "strictDeps" "dontStrip" "separateDebugInfo"
    "outputs" "prePatch" "postPatch" "preConfigure" "postConfigure" "preBuild" "postBuild" "preCheck" "postCheck"
    "preInstall" "postInstall" "preFixup" "postFixup" "preUnpack" "postUnpack" "unpackPhase" "configurePhase"
    "buildPhase" "checkPhase" "installPhase" "installCheckPhase" "enableParallelBuilding" "hardeningDisable"
    "__darwinAllowLocalNetworking" "__structuredAttrs" "dontFixup" "dontPatchShebangs"
  ];

  # The accepted attributes this stand-in really implements; others need real nixpkgs.
  implemented = [
    "name" "pname" "version" "src" "meta" "passthru" "cargoLock" "buildInputs" "nativeBuildInputs"
    "nativeCheckInputs" "checkInputs" "buildType" "buildNoDefaultFeatures" "checkNoDefaultFeatures" "buildFeatures"
    "checkFeatures" "buildAndTestSubdir" "RUSTFLAGS" "env" "cargoBuildFlags" "cargoTestFlags" "checkFlags" "doCheck"
    "strictDeps" "postPatch" "preBuild" "postBuild" "preCheck" "postCheck" "preInstall" "postInstall"
    "useFetchCargoVendor" # deprecated in 25.05 (always on); vendoring here follows cargoLock (see above)
  ];

  cargoLockAccepted = [ "lockFile" "lockFileContents" "outputHashes" "allowBuiltinFetchGit" ];

  lines = list: lib.concatStringsSep "\n" (map toString list);
  flag = value: if value then "1" else "";

  check = args:
    let
      given = builtins.attrNames args;
      unknown = lib.subtractLists accepted given;
      unsupported = lib.subtractLists implemented (lib.subtractLists unknown given);
      lock = args.cargoLock or { };
      lockUnknown = lib.subtractLists cargoLockAccepted (builtins.attrNames lock);
    in
    if unknown != [ ] then fail "rustPlatform.buildRustPackage does not accept ${names unknown} (not an argument of nixpkgs' buildRustPackage)"
    else if unsupported != [ ] then fail "${names unsupported} is valid for nixpkgs' buildRustPackage but not implemented by this offline stand-in; build with --nixpkgs pinned"
    else if !(args ? cargoLock) then fail "buildRustPackage needs cargoLock here (cargoHash and cargoDeps need the network)"
    else if lockUnknown != [ ] then fail "cargoLock does not accept ${names lockUnknown} (nixpkgs' importCargoLock takes ${names cargoLockAccepted})"
    else if !(lock ? lockFile || lock ? lockFileContents) then fail "cargoLock needs lockFile or lockFileContents"
    else if !(args ? name || (args ? pname && args ? version)) then fail "buildRustPackage needs pname and version (or name)"
    else args;

  cratesIo = "registry+https://github.com/rust-lang/crates.io-index";
  startsWith = prefix: text: builtins.substring 0 (builtins.stringLength prefix) text == prefix;
  realChecksum = value: builtins.isString value && builtins.match "[0-9a-f]{64}" value != null;

  # The [[package]] entries of the lock, parsed as importCargoLock parses it; version 1 locks keep checksums in [metadata].
  # A file without them (not a Cargo.lock) gives none: cargo reports it at build time, as it does without vendoring.
  lockPackages = lock:
    let
      parsed = builtins.fromTOML (if lock ? lockFile then builtins.readFile lock.lockFile else lock.lockFileContents);
      packages = if builtins.isList (parsed.package or null) then parsed.package else [ ];
      legacy = pkg: if pkg ? source then parsed.metadata."checksum ${pkg.name} ${pkg.version} (${pkg.source})" or null else null;
    in
    map (pkg: pkg // { checksum = pkg.checksum or (legacy pkg); }) packages;

  # The crates to fetch by checksum, or null when the lock keeps to the local directory source.
  vendoredCrates = lock:
    let
      packages = lockPackages lock;
      fromCratesIo = builtins.filter (pkg: (pkg.source or "") == cratesIo) packages;
      git = builtins.filter (pkg: startsWith "git+" (pkg.source or "")) packages;
      elsewhere = builtins.filter (pkg: pkg ? source && pkg.source != cratesIo && !(startsWith "git+" pkg.source)) packages;
      label = list: names (map (pkg: "${pkg.name} ${pkg.version}") list);
    in
    if fromCratesIo == [ ] || !(builtins.all (pkg: realChecksum pkg.checksum) fromCratesIo) then null
    else if builtins.all (pkg: (host.registryChecksums."${pkg.name}-${pkg.version}" or null) == pkg.checksum) fromCratesIo then null
    else if git != [ ] then fail "git dependencies (${label git}) need cargoLock.outputHashes and a git fetch, which this stand-in does not implement; build with --nixpkgs pinned"
    else if elsewhere != [ ] then fail "crates from registries other than crates.io (${label elsewhere}) are not implemented by this stand-in; build with --nixpkgs pinned"
    else fromCratesIo;

  # One crate as nixpkgs fetches it: a fixed-output download whose sha256 is the lock's checksum.
  fetchCrate = pkg: import <nix/fetchurl.nix> {
    name = "crate-${pkg.name}-${pkg.version}.tar.gz";
    url = "${host.cratesioStaticUrl}/crates/${pkg.name}/${pkg.name}-${pkg.version}.crate";
    sha256 = pkg.checksum;
  };

  # The fetched crates unpacked into NAME-VERSION/ folders with .cargo-checksum.json: a cargo directory source.
  vendorDir = crates: derivation {
    name = "cargo-vendor-dir";
    inherit system;
    builder = host.bash;
    args = [ "-e" ./vendor-crates.sh ];
    PATH = host.path;
    crates = lines (map (pkg: "${pkg.name} ${pkg.version} ${pkg.checksum} ${fetchCrate pkg}") crates);
  };

  build = args:
    let
      lock = args.cargoLock;
      crates = vendoredCrates lock;
      drv = derivation ({
        name = args.name or "${args.pname}-${args.version}";
        inherit system;
        builder = host.bash;
        args = [ "-e" ./cargo-build.sh ];
        PATH = host.path;
        RUSTUP_HOME = host.rustupHome;
        flakebotRegistry = host.registry;
        flakebotVendorDir = if crates == null then "" else vendorDir crates;
        src = args.src;
        cargoLockFile = lock.lockFile or "";
        cargoLockContents = lock.lockFileContents or "";
        buildType = args.buildType or "release";
        cargoBuildFlags = lines (args.cargoBuildFlags or [ ]);
        cargoTestFlags = lines (args.cargoTestFlags or [ ]);
        checkFlags = lines (args.checkFlags or [ ]);
        buildFeatures = lib.concatStringsSep "," (args.buildFeatures or [ ]);
        checkFeatures = lib.concatStringsSep "," (args.checkFeatures or args.buildFeatures or [ ]);
        buildNoDefaultFeatures = flag (args.buildNoDefaultFeatures or false);
        checkNoDefaultFeatures = flag (args.checkNoDefaultFeatures or args.buildNoDefaultFeatures or false);
        buildAndTestSubdir = args.buildAndTestSubdir or "";
        doCheck = flag (args.doCheck or true);
        nativeBuildInputs = args.nativeBuildInputs or [ ];
        buildInputs = args.buildInputs or [ ];
        nativeCheckInputs = args.nativeCheckInputs or [ ];
        checkInputs = args.checkInputs or [ ];
        RUSTFLAGS = if builtins.isList (args.RUSTFLAGS or "") then lib.concatStringsSep " " args.RUSTFLAGS else args.RUSTFLAGS or "";
        postPatch = args.postPatch or "";
        preBuild = args.preBuild or "";
        postBuild = args.postBuild or "";
        preCheck = args.preCheck or "";
        postCheck = args.postCheck or "";
        preInstall = args.preInstall or "";
        postInstall = args.postInstall or "";
      } // (args.env or { }));
    in
    drv // {
      pname = args.pname or drv.name;
      version = args.version or "";
      meta = args.meta or { };
      passthru = args.passthru or { };
    } // (args.passthru or { });
in
args:
if builtins.isFunction args then fail "buildRustPackage (finalAttrs: ...) is not implemented by this stand-in; pass an attribute set"
else build (check args)
