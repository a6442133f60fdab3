"""The trust boundary in one place: which steps run on the host, and what of a model-touched tree they may use.

Trusted host steps (network allowed; no model-written code runs; nothing in the tree steers them):

    search, clone/fork             crate metadata and git objects, no build
    cargo fetch/add/metadata/      from a neutral cwd with --manifest-path, minimal environment, flakebot's
    generate-lockfile              own CARGO_HOME and a pinned toolchain (flakebot.cargo.runner)
    copying the tree               copy_sources: drops STEERING files, refuses links leaving the tree
    rendering and `nix eval`       flakebot's own flake.nix; evaluation reads Cargo.toml/Cargo.lock as data
    of the flake, nix build        builds (build.rs, proc macros, checks) as nixbld users in Nix's sandbox, with
                                   every nix call's options from flakebot.nix.command.machine_options
    catalog writes                 only after every check passed (stages/instruct.py)

Everything else that compiles or runs code the model touched (build scripts, proc macros, tests, the
built tool for examples and verification) runs in flakebot.sandbox, never as root with capabilities.
"""

from __future__ import annotations

import os
from pathlib import Path

from flakebot.errors import NixError

# Files that steer cargo or rustup when present anywhere above the working directory: a model that
# plants them could make a host-side cargo run its program (build.rustc-wrapper) or fetch a toolchain.
STEERING_DIRS = (".cargo",)
STEERING_PREFIXES = ("rust-toolchain",)


def steering_reason(rel: Path | str) -> str:
    """Why the workspace path `rel` is refused to writes and left out of host copies; '' when it is fine."""
    parts = Path(rel).parts
    if any(part in STEERING_DIRS for part in parts[:-1]) or (parts and parts[-1] in STEERING_DIRS):
        return f"{rel} is cargo configuration (.cargo/): it could make cargo run other programs"
    if parts and parts[-1].startswith(STEERING_PREFIXES):
        return f"{rel} is a rustup toolchain file: it could make rustup pick or download another toolchain"
    return ""


def check_link(tree: Path, rel: str) -> None:
    """Refuse the symlink `tree/rel` when it points outside `tree` (or nowhere); links inside are fine."""
    link = tree / rel
    target = Path(os.path.realpath(link))
    if not target.is_relative_to(Path(os.path.realpath(tree))) or not target.exists():
        raise NixError(
            f"{rel} is a symbolic link to {os.readlink(link)}, outside the crate: refusing to copy it",
            fix=f"remove the link {rel} (a build script or the model made it) and package again",
            link=rel,
        )
