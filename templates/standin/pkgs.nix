# legacyPackages.<system> of the stand-in: rustPlatform, mkShell, host tools and native-input placeholders.
{ lib, host, system }:
let
  # A derivation whose files are symlinks (`links`: relative path -> host path) to host files: the placeholder for a
  # nixpkgs attribute (bin/perl, lib/pkgconfig/zlib.pc: a build sees them only when it declares the attribute), the
  # stdenv programs every build sees, or host toolchain programs for devShells (`nix develop` runs them on the host).
  # `libraries`: the -lNAME names the attribute gives (nix-support/flakebot-libraries; the build's cc refuses the
  # table's other libraries, see cargo-build.sh).
  hostLinks = name: note: links: lib.hostDerivation {
    name = "${name}-host";
    inherit system note;
    builder = host.bash;
    args = [ "-e" ./host-input.sh ];
    PATH = host.path;
    links = lib.concatStringsSep "\n" (map (relative: "${relative} ${links.${relative}}") (builtins.attrNames links));
    libraries = lib.concatStringsSep " " (host.libraries.${name} or [ ]);
  };

  hostInput = name: hostLinks name "flakebot host stand-in for nixpkgs' ${name}: links to the host's own ${name}"
    (host.packages.${name} or { });

  # bin/ links to host programs from `dir` (only tools the host has).
  hostTool = name: dir: tools: hostLinks name "flakebot host stand-in for nixpkgs' ${name}: links to the host toolchain"
    (builtins.listToAttrs (map (tool: { name = "bin/${tool}"; value = "${dir}/${tool}"; }) tools));

  toolchainTool = name: tools:
    hostTool name host.hostToolchainBin (builtins.filter (tool: builtins.elem tool host.hostToolchainTools) tools);

  placeholders = builtins.foldl'
    (acc: path: lib.recursiveUpdate acc (lib.setAttrByPath (builtins.filter builtins.isString (builtins.split "\\." path)) (hostInput path)))
    { }
    (builtins.attrNames host.packages);

  # What nixpkgs' stdenv gives every build (coreutils, sed, grep, awk, tar, gzip, make, a C compiler and linker).
  stdenvTools = hostLinks "stdenv" "flakebot host stand-in for nixpkgs' stdenv: links to host programs"
    (builtins.listToAttrs (map (tool: { name = "bin/${tool}"; value = host.stdenv.${tool}; }) (builtins.attrNames host.stdenv)));

  mkShell = { name ? "nix-shell", packages ? [ ], inputsFrom ? [ ], nativeBuildInputs ? [ ], buildInputs ? [ ], shellHook ? "", ... }@args:
    lib.hostDerivation {
      inherit name system;
      # `nix develop` runs its get-env.sh with this builder; it writes the environment to each of $outputs.
      outputs = [ "out" ];
      builder = host.bash;
      args = [ "-e" ./host-input.sh ];
      PATH = lib.concatStringsSep ":" (map (p: "${p}/bin") packages ++ [ host.path ]);
      note = "flakebot host stand-in mkShell";
      links = "";
      # inputsFrom is accepted (generated devShells pass the package) but not merged: the host PATH already has its tools.
      inherit packages nativeBuildInputs buildInputs shellHook;
    };
in
lib.recursiveUpdate placeholders {
  inherit lib mkShell;
  dockerTools = import ./docker.nix { inherit lib host system; };
  stdenv = { hostPlatform = { inherit system; }; buildPlatform = { inherit system; }; };
  rustPlatform = {
    buildRustPackage = import ./rust.nix { inherit lib host system stdenvTools; };
  };
  cargo = toolchainTool "cargo" [ "cargo" ];
  rustc = toolchainTool "rustc" [ "rustc" "rustdoc" ];
  clippy = toolchainTool "clippy" [ "cargo-clippy" "clippy-driver" ];
  rustfmt = toolchainTool "rustfmt" [ "rustfmt" "cargo-fmt" ];
  rust-analyzer = toolchainTool "rust-analyzer" [ "rust-analyzer" ];
  # `nix develop` starts its shell from bashInteractive.
  bashInteractive = hostTool "bash-interactive" (dirOf host.bash) [ "bash" ];
}
