"""The pinned nixpkgs (nixos-26.05, the newest stable branch), its rustc, and the flake.lock that records it.

The node is a real lock entry (rev + narHash + lastModified of 2026-09-26), copied from a public flake.lock:
pr0d1r2/nix-hk, flake.lock at commit 04dda3637ba2bfe20918318c6fe4155dc3617125 (its `nixpkgs` node, ref nixos-26.05).
The same rev is pinned by other public flakes that say it is NixOS 26.05.

rustc of that pin: 1.95.0. nixpkgs' pkgs/development/compilers/rust/1_95.nix (read at nixpkgs commit
01b36d3e2638a5a0b91bb28d95f675eded5c8a8a) sets rustcVersion = "1.95.0", and public flakes pinning nixos-26.05 say
"nixos-26.05 ships rustc 1.95.0" (one at this very rev); a release branch does not move to a new rustc (that is a
mass rebuild, for staging on master only). The nixpkgs tree at the pinned rev itself was not read: its snapshot is
larger than could be fetched here.

nixpkgs 25.11 and later evaluate only with Nix >= 2.18 (lib/minver.nix): an older Nix (Debian's 2.8) builds these
flakes with the host stand-in only (nix.command.resolve_mode).
"""

from __future__ import annotations

import json
from typing import Any

from flakebot.cargo.runner import PINNED_RUSTC  # the pin's rustc (read as said above)

__all__ = [
    "NIXPKGS_BRANCH",
    "NIXPKGS_MIN_NIX",
    "PINNED_NIXPKGS",
    "PINNED_RUSTC",
    "flake_lock",
    "flake_lock_text",
    "version_tuple",
]

NIXPKGS_BRANCH = "nixos-26.05"
# The oldest Nix that evaluates the pinned nixpkgs (its lib/minver.nix).
NIXPKGS_MIN_NIX = "2.18"

PINNED_NIXPKGS: dict[str, Any] = {
    "lastModified": 1790450978,
    "narHash": "sha256-/eLCD/X9kaWJqPR47+fDozEC87Hjmm3i8gJbYmDAD7g=",
    "owner": "NixOS",
    "repo": "nixpkgs",
    "rev": "5e2305d577ca00acbba631b05cb1094d172b29f3",
    "type": "github",
}


def flake_lock(pin: dict[str, Any] | None = None) -> dict[str, Any]:
    """A flake.lock (version 7) whose only input, nixpkgs, is locked to `pin`."""
    locked = dict(pin or PINNED_NIXPKGS)
    original = {"owner": locked["owner"], "ref": NIXPKGS_BRANCH, "repo": locked["repo"], "type": locked["type"]}
    return {
        "nodes": {
            "nixpkgs": {"locked": locked, "original": original},
            "root": {"inputs": {"nixpkgs": "nixpkgs"}},
        },
        "root": "root",
        "version": 7,
    }


def flake_lock_text(pin: dict[str, Any] | None = None) -> str:
    """flake.lock as nix writes it (two-space JSON, sorted keys, trailing newline)."""
    return json.dumps(flake_lock(pin), indent=2, sort_keys=True) + "\n"


def version_tuple(version: str) -> tuple[int, ...]:
    """ "1.95" -> (1, 95, 0): a rust-version or Nix version as comparable numbers (a pre-release tail is ignored)."""
    numbers = []
    for part in version.strip().split(".")[:3]:
        digits = "".join(c for c in part.split("-")[0] if c.isdigit())
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers + [0] * (3 - len(numbers)))
