# flakebot itself as a flake (nixpkgs pinned to nixos-26.05 in flake.lock).
#   nix run . -- craft "need a CSV deduper"     run flakebot
#   nix develop                                 python with flakebot's dependencies, cargo, rustc, git
{
  description = "flakebot: a tool factory for agents; describe a need, get back a tested Rust CLI built by Nix";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";

  outputs = { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      forAllSystems = lib.genAttrs [ "x86_64-linux" "aarch64-linux" "x86_64-darwin" "aarch64-darwin" ];

      # pyproject.toml's [project].dependencies, as python3Packages attributes.
      runtimeDeps = ps: with ps; [ groq openai gitpython httpx typer jinja2 tomlkit rich mcp cryptography jsonschema psycopg uvicorn starlette pyjwt ];
      testDeps = ps: with ps; [ pytest pytest-timeout mypy ];

      # Programs flakebot drives: git for workspaces, nix for packaging, cargo/rustc for the edit loop, bwrap for its sandbox.
      toolsFor = pkgs: [ pkgs.git pkgs.nix pkgs.cargo pkgs.rustc ] ++ lib.optionals pkgs.stdenv.hostPlatform.isLinux [ pkgs.bubblewrap ];
    in
    {
      packages = forAllSystems (system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
        in
        {
          default = pkgs.python3Packages.buildPythonApplication {
            pname = "flakebot";
            version = "0.1.0";
            pyproject = true;
            src = ./.;
            build-system = [ pkgs.python3Packages.setuptools ];
            dependencies = runtimeDeps pkgs.python3Packages;
            # nixos-26.05 may ship older minor versions than pyproject.toml's lower bounds; the APIs used are there.
            pythonRelaxDeps = true;
            makeWrapperArgs = [ "--suffix" "PATH" ":" (lib.makeBinPath (toolsFor pkgs)) ];
            # The test suite needs nix, cargo and a crate registry at hand: run it with `nix develop -c make test`.
            doCheck = false;
            pythonImportsCheck = [ "flakebot" ];
            meta = {
              description = "A tool factory for agents: describe a need, get back a tested Rust CLI built by Nix";
              license = lib.licenses.mit;
              mainProgram = "flakebot";
            };
          };
        });

      apps = forAllSystems (system: {
        default = {
          type = "app";
          program = "${self.packages.${system}.default}/bin/flakebot";
        };
      });

      devShells = forAllSystems (system:
        let
          pkgs = nixpkgs.legacyPackages.${system};
        in
        {
          default = pkgs.mkShell {
            packages = [
              (pkgs.python3.withPackages (ps: runtimeDeps ps ++ testDeps ps ++ [ ps.setuptools ]))
              pkgs.ruff
              pkgs.clippy
              pkgs.rustfmt
            ] ++ toolsFor pkgs;
          };
        });
    };
}
