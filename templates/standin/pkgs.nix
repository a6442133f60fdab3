# legacyPackages.<system> of the stand-in: rustPlatform, mkShell, host tools and native-input placeholders.
{ lib, host, system }:
let
  # A derivation standing for a nixpkgs package the build takes from the host instead.
  hostInput = name: derivation {
    name = "${name}-host";
    inherit system;
    builder = host.bash;
    args = [ "-e" ./host-input.sh ];
    PATH = host.path;
    note = "flakebot host stand-in for nixpkgs' ${name}: builds use the host's own ${name}";
    tools = "";
    toolDir = "";
  };

  # A derivation whose bin/ links host programs from `dir` (for devShells: `nix develop` runs them on the host, so
  # the links name host paths, which builds never see; only tools the host has are linked).
  hostTool = name: dir: tools: derivation {
    name = "${name}-host";
    inherit system;
    builder = host.bash;
    args = [ "-e" ./host-input.sh ];
    PATH = host.path;
    note = "flakebot host stand-in for nixpkgs' ${name}: links to the host toolchain";
    tools = lib.concatStringsSep " " tools;
    toolDir = dir;
  };

  toolchainTool = name: tools:
    hostTool name host.hostToolchainBin (builtins.filter (tool: builtins.elem tool host.hostToolchainTools) tools);

  placeholders = builtins.foldl'
    (acc: path: lib.recursiveUpdate acc (lib.setAttrByPath (builtins.filter builtins.isString (builtins.split "\\." path)) (hostInput path)))
    { }
    host.nativeInputs;

  mkShell = { name ? "nix-shell", packages ? [ ], inputsFrom ? [ ], nativeBuildInputs ? [ ], buildInputs ? [ ], shellHook ? "", ... }@args:
    derivation {
      inherit name system;
      # `nix develop` runs its get-env.sh with this builder; it writes the environment to each of $outputs.
      outputs = [ "out" ];
      builder = host.bash;
      args = [ "-e" ./host-input.sh ];
      PATH = lib.concatStringsSep ":" (map (p: "${p}/bin") packages ++ [ host.path ]);
      note = "flakebot host stand-in mkShell";
      tools = "";
      toolDir = "";
      # inputsFrom is accepted (generated devShells pass the package) but not merged: the host PATH already has its tools.
      inherit packages nativeBuildInputs buildInputs shellHook;
    };
in
lib.recursiveUpdate placeholders {
  inherit lib mkShell;
  stdenv = { hostPlatform = { inherit system; }; buildPlatform = { inherit system; }; };
  rustPlatform = {
    buildRustPackage = import ./rust.nix { inherit lib host system; };
  };
  cargo = toolchainTool "cargo" [ "cargo" ];
  rustc = toolchainTool "rustc" [ "rustc" "rustdoc" ];
  clippy = toolchainTool "clippy" [ "cargo-clippy" "clippy-driver" ];
  rustfmt = toolchainTool "rustfmt" [ "rustfmt" "cargo-fmt" ];
  rust-analyzer = toolchainTool "rust-analyzer" [ "rust-analyzer" ];
  # `nix develop` starts its shell from bashInteractive.
  bashInteractive = hostTool "bash-interactive" (dirOf host.bash) [ "bash" ];
}
