# rustPlatform.buildRustPackage for the stand-in: the host's cargo, offline, against a local directory source.
# Arguments are checked against nixpkgs' real buildRustPackage: an attribute nixpkgs does not accept
# is an error here too, so a flake that builds with the stand-in also evaluates with real nixpkgs.
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
    "useFetchCargoVendor" # deprecated in 25.05 (always on); nothing is vendored here
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

  build = args:
    let
      lock = args.cargoLock;
      drv = derivation ({
        name = args.name or "${args.pname}-${args.version}";
        inherit system;
        builder = host.bash;
        args = [ "-e" ./cargo-build.sh ];
        PATH = host.path;
        RUSTUP_HOME = host.rustupHome;
        flakebotRegistry = host.registry;
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
