"""A published crate's files as the workspace keeps them: copy, strip registry artefacts, read provenance.

What a packaged crate carries that the workspace must not keep, and why:

- `.cargo-checksum.json`: a directory source's list of the pristine files' SHA-256 sums (Debian's
  reads `"package": "Could not get crate checksum"`). Cargo reads it only when the directory is a
  registry/vendor source; in an editable path crate it is dead weight that turns false at the
  first edit, and if the tree were ever vendored again cargo would reject every edited file.
- `.cargo_vcs_info.json`, `Cargo.toml.orig`: written by `cargo package`, which refuses to
  package a tree that already contains them ("invalid inclusion of reserved file name").
  The upstream commit named in `.cargo_vcs_info.json` is kept in the origin record instead.
- `.cargo-ok`: cargo's marker that an extraction finished.
- `debian/`: Debian's packaging (patches, copyright). The patches are already applied to the
  sources in /usr/share/cargo/registry; their names are kept in the origin record, the
  directory is not part of the crate and would otherwise end up in the tool's flake.
- `target/`, `.git/`: build output and another repository's history, if a local crate has them.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from flakebot.errors import AcquireError
from flakebot.safefs import links_leaving
from flakebot.trust import git_reason

logger = logging.getLogger(__name__)

REGISTRY_FILES = {".cargo-checksum.json", ".cargo_vcs_info.json", "Cargo.toml.orig", ".cargo-ok"}
# flakebot-deps: the Nix deps derivation's skeleton (nix/skeleton.py), which flakebot writes into every flake it
# makes; a crate copied from a catalogued flake (improve) starts without it, and one a model plants is never used.
NOT_COPIED = REGISTRY_FILES | {"debian", "target", ".git", "flakebot-deps"}


def provenance(crate_dir: Path) -> dict[str, Any]:
    """What a packaged crate says about where it came from: upstream commit, Debian patches."""
    found: dict[str, Any] = {}
    try:
        vcs = json.loads((crate_dir / ".cargo_vcs_info.json").read_text())
        found["upstream_revision"] = str(vcs["git"]["sha1"])
        if vcs.get("path_in_vcs"):
            found["upstream_path"] = str(vcs["path_in_vcs"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as exc:  # provenance is a nicety: note it, carry on
        logger.debug("unreadable .cargo_vcs_info.json in %s: %s", crate_dir, exc)
    series = crate_dir / "debian" / "patches" / "series"
    if series.is_file():
        patches = [
            line.split()[0] for line in series.read_text().splitlines() if line.strip() and not line.startswith("#")
        ]
        found["debian_patches"] = patches
    return found


def copy_crate(source: Path, dest: Path) -> None:
    """Copy a crate directory into the existing empty directory `dest`, leaving out NOT_COPIED at its top and any
    .git below it (flakebot.trust.git_reason)."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        top = {n for n in names if n in NOT_COPIED} if Path(directory) == source else set()
        return top | {n for n in names if git_reason(n)}

    shutil.copytree(source, dest, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    _make_writable(dest)


def strip_registry_files(crate_dir: Path) -> None:
    """Remove NOT_COPIED entries from the top of an extracted crate."""
    from flakebot.fsutil import remove_tree

    for name in NOT_COPIED:
        remove_tree(crate_dir / name)


def _make_writable(root: Path) -> None:
    # Registry copies may be read-only (root-owned 0444 files); the agent must be able to edit them.
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def refuse_links_leaving(root: Path) -> None:
    """Refuse a tree holding a symbolic link that points outside it (absolute, '..' past the top, or resolving
    there), as it is cloned, copied or unpacked: every later host step (the acceptance test, the edit tools, the
    flake copy) would otherwise meet it first. Links inside the tree are kept."""
    leaving = links_leaving(root)
    if leaving:
        rel, target = leaving[0]
        more = f" (and {len(leaving) - 1} more)" if len(leaving) > 1 else ""
        raise AcquireError(
            f"{rel} is a symbolic link to {target}, outside the crate's tree{more}: refusing to use the tree",
            fix="remove the link from the repository (or pick another crate); links may only point inside the tree",
            link=rel,
            target=target,
        )
