"""Where the crate sits in a checkout, as cargo sees it (`cargo metadata`), and its Cargo.lock."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from flakebot.cargo.runner import Cargo
from flakebot.errors import AcquireError

logger = logging.getLogger(__name__)


def cargo_error(stderr: str) -> str:
    """The part of cargo's stderr that says what went wrong, on one line: its error and the causes cargo gives,
    "failed to download ...: failed to verify the checksum of `csv v1.1.6 ...`"."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("error")), max(len(lines) - 3, 0))
    parts = [line.removeprefix("error:").strip() for line in lines[first : first + 6] if line != "Caused by:"]
    return ": ".join(part for part in parts if part)[:400]


def metadata(cargo: Cargo, cwd: Path, no_deps: bool = True) -> dict[str, Any]:
    """`cargo metadata --format-version 1` of the package or workspace whose Cargo.toml is in `cwd` (a host call)."""
    args = ["metadata", "--format-version", "1"] + (["--no-deps"] if no_deps else [])
    result = cargo.run(args, cwd, timeout=300)
    if result.returncode != 0:
        raise AcquireError(f"cargo metadata failed: {cargo_error(result.stderr)}", fix="check the crate's Cargo.toml")
    return dict(json.loads(result.stdout))


def locate(cargo: Cargo, root: Path, name: str) -> tuple[str, str]:
    """(directory of package `name` relative to `root`, "" at the root; its version)."""
    if not (root / "Cargo.toml").is_file():
        raise AcquireError(
            "there is no Cargo.toml at the top of the source",
            fix="choose a crate whose repository is a cargo package or workspace",
        )
    packages = metadata(cargo, root)["packages"]
    for package in packages:
        if package["name"] == name:
            relative = os.path.relpath(Path(package["manifest_path"]).resolve().parent, root.resolve())
            return ("" if relative == "." else relative), str(package["version"])
    members = ", ".join(sorted(p["name"] for p in packages)) or "none"
    raise AcquireError(
        f"crate {name} is not in the cargo workspace found there (members: {members})",
        fix="check the crate's repository URL, or pass --method archive to use the published .crate",
    )


def root_package(cargo: Cargo, root: Path) -> str:
    """The name of the package a tree stands for: the one at its top, else the workspace's only member."""
    if not (root / "Cargo.toml").is_file():
        raise AcquireError(
            "there is no Cargo.toml at the top of the source", fix="start from a cargo package or workspace"
        )
    packages = metadata(cargo, root)["packages"]
    local = [p for p in packages if p.get("source") is None]  # path packages: the tree's own, not dependencies
    top = [p for p in local if Path(p["manifest_path"]).resolve().parent == root.resolve()]
    if len(top) == 1 or len(local) == 1:
        return str((top or local)[0]["name"])
    members = ", ".join(sorted(p["name"] for p in local)) or "none"
    raise AcquireError(
        f"the workspace has several packages ({members})", fix="name the one to start from with --crate NAME"
    )


def workspace_root(cargo: Cargo, crate_path: Path) -> Path:
    return Path(metadata(cargo, crate_path)["workspace_root"])
