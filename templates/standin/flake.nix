# flakebot's host-toolchain stand-in for nixpkgs, for offline builds on this machine.
# It is NOT nixpkgs: it implements the subset of `lib`, `rustPlatform.buildRustPackage`, `mkShell`
# and the native inputs that flakebot's generated flakes use, building with the host's cargo
# against a local cargo directory source. Rendered by flakebot (host.json: where builds see this machine's toolchain
# and registry, bound under /flakebot by extra-sandbox-paths: readable, not writable, by the nixbld build users).
# Use it with: nix build --override-input nixpkgs path:<this directory> <flake>
{
  description = "flakebot host-toolchain stand-in for nixpkgs (offline builds)";

  outputs = { self }:
    let
      host = builtins.fromJSON (builtins.readFile ./host.json);
      lib = import ./lib.nix { inherit host; };
      packagesFor = system: import ./pkgs.nix { inherit lib host system; };
    in
    {
      inherit lib;
      legacyPackages = lib.genAttrs lib.systems.flakeExposed packagesFor;
    };
}
