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
# Git packages of the lock are vendored as importCargoLock vendors them, in either case: a fixed-output clone of the
# repository at the locked commit whose hash is cargoLock.outputHashes."NAME-VERSION" (named and hashed as nixpkgs'
# fetchgit names and hashes it), the package's folder copied out of it, and a cargo source replacement per git source.
# The build itself sees what a nixpkgs build sees: stdenv's programs (stdenvTools) and the toolchain on PATH, the bin/
# of declared inputs, pkg-config modules of declared inputs only, HOME=/homeless-shelter, `--target` output layout;
# a package with an unfree licence is refused as nixpkgs' check-meta refuses it.
{ lib, host, system, stdenvTools }:
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
    "strictDeps" "postPatch" "preBuild" "postBuild" "preCheck" "postCheck" "preInstall" "postInstall" "installPhase"
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
    else checkMeta args;

  # nixpkgs' check-meta: an unfree licence refuses evaluation unless NIXPKGS_ALLOW_UNFREE=1 (with --impure).
  checkMeta = args:
    let
      license = (args.meta or { }).license or [ ];
      unfree = builtins.filter (l: builtins.isAttrs l && !(l.free or true)) (if builtins.isList license then license else [ license ]);
      name = args.name or "${args.pname}-${args.version}";
    in
    if unfree == [ ] || builtins.getEnv "NIXPKGS_ALLOW_UNFREE" == "1" then args
    else throw ''
      Package ‘${name}’ has an unfree license (‘${names (map (l: l.shortName or "unknown") unfree)}’), refusing to evaluate.

      a) To temporarily allow unfree packages, you can use an environment variable
         for a single invocation of the nix tools.

           $ export NIXPKGS_ALLOW_UNFREE=1

         Note: When using `nix shell`, `nix build`, `nix develop`, etc with a flake,
               then pass `--impure` in order to allow use of environment variables.
    '';

  cratesIo = "registry+https://github.com/rust-lang/crates.io-index";
  startsWith = prefix: text: builtins.substring 0 (builtins.stringLength prefix) text == prefix;
  realChecksum = value: builtins.isString value && builtins.match "[0-9a-f]{64}" value != null;

  # The lock parsed as importCargoLock parses it: its format version (v1 and v2 locks have none: 2) and its [[package]]
  # entries; version 1 locks keep checksums in [metadata]. A file without packages (not a Cargo.lock) gives none:
  # cargo reports it at build time, as it does without vendoring.
  parseLock = lock:
    let
      text = if lock ? lockFile then builtins.readFile lock.lockFile else lock.lockFileContents;
      parsed = builtins.fromTOML text;
      packages = if builtins.isList (parsed.package or null) then parsed.package else [ ];
      legacy = pkg: if pkg ? source then parsed.metadata."checksum ${pkg.name} ${pkg.version} (${pkg.source})" or null else null;
    in
    {
      inherit text;
      version = parsed.version or 2;
      packages = map (pkg: pkg // { checksum = pkg.checksum or (legacy pkg); }) packages;
    };

  # The crates to fetch by checksum, or null when the lock keeps to the local directory source.
  vendoredCrates = packages:
    let
      fromCratesIo = builtins.filter (pkg: (pkg.source or "") == cratesIo) packages;
      elsewhere = builtins.filter (pkg: pkg ? source && pkg.source != cratesIo && !(startsWith "git+" pkg.source)) packages;
      label = list: names (map (pkg: "${pkg.name} ${pkg.version}") list);
    in
    if fromCratesIo == [ ] || !(builtins.all (pkg: realChecksum pkg.checksum) fromCratesIo) then null
    else if builtins.all (pkg: (host.registryChecksums."${pkg.name}-${pkg.version}" or null) == pkg.checksum) fromCratesIo then null
    else if elsewhere != [ ] then fail "crates from registries other than crates.io (${label elsewhere}) are not implemented by this stand-in; build with --nixpkgs pinned"
    else fromCratesIo;

  # One crate as nixpkgs fetches it: a fixed-output download whose sha256 is the lock's checksum.
  fetchCrate = pkg: import <nix/fetchurl.nix> {
    name = "crate-${pkg.name}-${pkg.version}.tar.gz";
    url = "${host.cratesioStaticUrl}/crates/${pkg.name}/${pkg.name}-${pkg.version}.crate";
    sha256 = pkg.checksum;
  };

  # A git source as importCargoLock parses it: git+URL[?rev=VALUE|?tag=VALUE|?branch=VALUE]#COMMIT (or null).
  parseGit = source:
    let
      parts = builtins.match ''git\+([^?]+)(\?(rev|tag|branch)=(.*))?#(.*)'' source;
      kind = builtins.elemAt parts 2;
    in
    if parts == null then null
    else { url = builtins.elemAt parts 0; commit = builtins.elemAt parts 4; }
      // lib.optionalAttrs (kind != null) { inherit kind; value = builtins.elemAt parts 3; };

  # The name nixpkgs' fetchgit gives a clone: the repository's base name less .git (and the like), a dash and the
  # commit's first 7 digits; the stand-in uses it too, so a hash mismatch names the same derivation with either.
  fetchName = url: commit:
    let
      pieces = builtins.filter builtins.isString (builtins.split ":" url);
      last = builtins.elemAt pieces (builtins.length pieces - 1);
      trimmed = if builtins.match ".*/" last != null then builtins.substring 0 (builtins.stringLength last - 1) last else last;
      stripExtensions = name:
        let stripped = builtins.match "(.*)\\.(git|tar|zip|gz|tgz|bz|tbz|bz2|tbz2|lzma|txz|xz|zstd)" name;
        in if stripped == null then name else stripExtensions (builtins.head stripped);
    in
    "${stripExtensions (baseNameOf trimmed)}-${builtins.substring 0 7 commit}";

  # The repository at the locked commit as fetchgit makes it (submodules included, no .git): a fixed-output clone by
  # the host's git, whose recursive sha256 is the outputHashes entry.
  fetchGitTree = { url, commit, hash }: lib.hostDerivation {
    name = fetchName url commit;
    inherit system url commit;
    builder = host.bash;
    args = [ "-e" ./fetch-git.sh ];
    PATH = host.path;
    outputHashMode = "recursive";
    outputHashAlgo = "sha256";
    outputHash = hash;
  };

  # One git package as a vendored crate: its folder in the clone (found with cargo metadata, as importCargoLock finds
  # it: workspace repositories keep it in a subfolder), with an empty .cargo-checksum.json.
  gitCrate = tree: pkg: lib.hostDerivation {
    name = "${pkg.name}-${pkg.version}";
    inherit system tree;
    builder = host.bash;
    args = [ "-e" ./git-crate.sh ];
    PATH = host.path;
    RUSTUP_HOME = host.rustupHome;
    crateName = pkg.name;
  };

  # importCargoLock's error for a git package without a hash (its first sentence word for word, as users search it).
  missingHash = pkg: throw ''
    No hash was found while vendoring the git dependency ${pkg.name}-${pkg.version}. Add its hash to the
    `outputHashes` argument of `importCargoLock` (the `cargoLock` attribute set of `buildRustPackage`):

    outputHashes = {
      "${pkg.name}-${pkg.version}" = "<hash>";
    };
  '';

  # outputHashes (NAME-VERSION -> hash) keyed by locked commit, as importCargoLock keys it: the packages of one
  # repository share one clone; a key that names no git package of the lock is an error.
  hashesByCommit = packages: outputHashes:
    let
      commits = builtins.listToAttrs (map (pkg: { name = "${pkg.name}-${pkg.version}"; value = (parseGit pkg.source).commit; }) packages);
      entry = key: {
        name = commits.${key} or (throw "A hash was specified for ${key}, but there is no corresponding git dependency.");
        value = outputHashes.${key};
      };
    in
    builtins.listToAttrs (map entry (builtins.attrNames outputHashes));

  tomlString = text: "\"${builtins.replaceStrings [ "\\" "\"" ] [ "\\\\" "\\\"" ] text}\"";

  # %XX escapes of printable ASCII decoded: version 4 locks percent-encode a git source's rev, tag or branch.
  printable = " !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";
  hexDigit = char: builtins.head (builtins.filter
    (i: builtins.substring i 1 "0123456789abcdef" == char || builtins.substring i 1 "0123456789ABCDEF" == char)
    (builtins.genList (i: i) 16));
  percentDecode = text: lib.concatStringsSep "" (map
    (part:
      if builtins.isString part then part
      else
        let code = 16 * hexDigit (builtins.substring 0 1 (builtins.head part)) + hexDigit (builtins.substring 1 1 (builtins.head part));
        in if code >= 32 && code < 127 then builtins.substring (code - 32) 1 printable else "%${builtins.head part}")
    (builtins.split "%([0-9A-Fa-f]{2})" text));

  # The source replacement for one git source, as importCargoLock writes it into the vendor directory's cargo config.
  gitSourceConfig = lockVersion: pkg:
    let
      git = parseGit pkg.source;
      value = if lockVersion >= 4 then percentDecode git.value else git.value;
    in
    "[source.${tomlString pkg.source}]\ngit = ${tomlString git.url}\n"
    + (if git ? kind then "${git.kind} = ${tomlString value}\n" else "")
    + "replace-with = \"vendored-sources\"\n";

  # The lock's git packages as vendored crates, and one source replacement per git source (in the lock's order).
  gitVendored = lock: parsed:
    let
      packages = builtins.filter (pkg: startsWith "git+" (pkg.source or "")) parsed.packages;
      unparsed = builtins.filter (pkg: parseGit pkg.source == null) packages;
      byCommit = hashesByCommit packages (lock.outputHashes or { });
      tree = pkg:
        let git = parseGit pkg.source; in
        if byCommit ? ${git.commit} then fetchGitTree { inherit (git) url commit; hash = byCommit.${git.commit}; }
        else if lock.allowBuiltinFetchGit or false then builtins.fetchGit { inherit (git) url; rev = git.commit; allRefs = true; submodules = true; }
        else missingHash pkg;
      sources = builtins.foldl' (seen: pkg: if builtins.elem pkg.source seen then seen else seen ++ [ pkg.source ]) [ ] packages;
      first = source: builtins.head (builtins.filter (pkg: pkg.source == source) packages);
    in
    if unparsed != [ ] then fail "cannot handle the crate source ${(builtins.head unparsed).source}"
    else builtins.deepSeq byCommit {
      crates = map (pkg: gitCrate (tree pkg) pkg) packages;
      config = lib.concatStringsSep "\n" (map (source: gitSourceConfig parsed.version (first source)) sources);
    };

  # The fetched crates unpacked into NAME-VERSION/ folders with .cargo-checksum.json, and the git packages' folders
  # beside them: a cargo directory source; .cargo/config.toml holds the git sources' replacements.
  # Cargo.lock goes in too, as importCargoLock puts it there: each lock has its own vendor directory.
  vendorDir = crates: git: lockText: lib.hostDerivation {
    name = "cargo-vendor-dir";
    inherit system;
    builder = host.bash;
    args = [ "-e" ./vendor-crates.sh ];
    PATH = host.path;
    crates = lines (map (pkg: "${pkg.name} ${pkg.version} ${pkg.checksum} ${fetchCrate pkg}") crates);
    gitCrates = lines (map (crate: "${crate.name} ${crate}") git.crates);
    gitSources = git.config;
    cargoLockText = lockText;
  } // { gitPackages = git.crates; };

  build = args:
    let
      lock = args.cargoLock;
      parsed = parseLock lock;
      crates = vendoredCrates parsed.packages;
      git = gitVendored lock parsed;
      drv = lib.hostDerivation ({
        name = args.name or "${args.pname}-${args.version}";
        inherit system;
        builder = host.bash;
        args = [ "-e" ./cargo-build.sh ];
        PATH = "${stdenvTools}/bin:${host.toolchainBin}";
        hostTriple = host.hostTriple;
        flakebotStdenv = stdenvTools;
        flakebotKnownLibraries = lib.concatStringsSep " " (builtins.concatLists (builtins.attrValues host.libraries));
        RUSTUP_HOME = host.rustupHome;
        flakebotRegistry = host.registry;
        # crates.io's packages come from the vendor directory when fetched, else from the local directory source.
        flakebotCratesIo = if crates == null then "flakebot-local" else "vendored-sources";
        flakebotVendorDir = if crates == null && git.crates == [ ] then "" else vendorDir (if crates == null then [ ] else crates) git parsed.text;
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
        installPhase = args.installPhase or "";
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
