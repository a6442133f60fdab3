"""The pinned nixpkgs (nixos-25.05) and the flake.lock that records it.

nixpkgs 25.11 and later refuse Nix < 2.18 (Debian ships 2.8), so generated flakes pin nixos-25.05.
The node is a real lock entry (rev + narHash), as in ../shared/fixtures/nixpkgs-pins.json.
"""

from __future__ import annotations

import json
from typing import Any

NIXPKGS_BRANCH = "nixos-25.05"

PINNED_NIXPKGS: dict[str, Any] = {
    "lastModified": 1753345091,
    "narHash": "sha256-CdX2Rtvp5I8HGu9swBmYuq+ILwRxpXdJwlpg8jvN4tU=",
    "owner": "NixOS",
    "repo": "nixpkgs",
    "rev": "3ff0e34b1383648053bba8ed03f201d3466f90c9",
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
