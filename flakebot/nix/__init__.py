"""Nix: wrap a crate as a pinned flake, build it, smoke-run it, and run it with `nix run`.

    flake.py     package_crate (files → git add → nix build → smoke run → GC root), nix_run, flake_check
    flake_files.py the flake's files: sources copied in, flake.nix from templates/flake.nix.j2, git commit
    build.py     nix build --json with the log tail on failure, the GC root
    smoke.py     the bounded smoke run in the sandbox, with its level (help, usage, runs, starts-only) and evidence
    crate.py     what the flake needs from cargo: Cargo.lock, packages, the chosen binary and its required-features
    skeleton.py  the dependency skeleton (manifests + Cargo.lock, empty sources) the flake's deps derivation builds
    reuse.py     what a build reused: the deps derivation a tool was built on (read from the .drv files), the crates
                 a build compiled
    devdeps.py   dev-dependencies cargo cannot resolve, left out of the copy (asked of cargo, never read from its text)
    gitdeps.py   git dependencies: the clone nix fetches for each (as fetchgit names it), lib.fakeHash
    build_inputs.py native build inputs keyed on crate names in Cargo.lock (as nix-init does); PACKAGES, the one
                 table of what each nixpkgs attribute gives a build (programs, pkg-config modules, -lNAME)
    evidence.py  what a failed build's log asks for (a program, a pkg-config module, -lNAME; a denied lint)
    licenses.py  SPDX expressions → nixpkgs lib.licenses names
    lock.py      the pinned nixpkgs (nixos-26.05) and flake.lock
    standin.py   the host-toolchain stand-in for nixpkgs (offline builds, --nixpkgs host); its host facts and
                 toolchain answers asked once per machine state
    service_outputs.py a service's flake outputs as Nix text: its NixOS module, OCI image and declaration
    builders.py  Nix remote builders (nix_builders): the toolchain feature stand-in builds require, builders'
                 options, what a builder's nix.conf needs, a build a builder failed
    command.py   nix command lines for Nix 2.8 (every one that can build: nixbld users, sandbox), the nixpkgs mode,
                 bounded runs keeping the log tail

May import flakebot.config, errors, fsutil, cargo, sandbox, templates, and source.tree (what a copy leaves out).
"""
