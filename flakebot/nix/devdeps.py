"""Dev-dependencies that do not resolve against the crate source in use, and manifests without them.

cargo resolves dev-dependencies with everything else, so one test helper the registry lacks (or has in
a version the requirement does not match) stops Cargo.lock, and with it the build of a binary that
never uses it. The verdict is cargo's, never a reading of its error text: resolve with every
dev-dependency left out; only when that works were dev-dependencies the trouble. Each is then put
back, one at a time, and kept when cargo still resolves; the rest stay out, each with cargo's reason.

    drop_unresolvable(root, manifests, resolve) -> [Dropped] (manifests rewritten), or None
    member_manifests(metadata)                  -> the Cargo.toml of every workspace member
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tomlkit

from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

# `dev_dependencies` is cargo's old spelling, still accepted.
DEV_TABLES = ("dev-dependencies", "dev_dependencies")

# Resolves the workspace as its manifests now stand: "" when cargo succeeds, else cargo's error.
Resolver = Callable[[], str]


@dataclass(frozen=True)
class DevDependency:
    """One dev-dependency entry: the manifest declaring it, its table (a path of keys) and its key."""

    manifest: str  # relative to the workspace root
    table: tuple[str, ...]
    name: str

    def where(self) -> str:
        return f"{self.manifest} [{'.'.join(self.table)}]"


@dataclass(frozen=True)
class Dropped:
    """A dev-dependency left out of the packaged copy, and cargo's reason."""

    name: str
    manifest: str
    table: str
    reason: str

    def notice(self) -> str:
        return f"dev-dependency {self.name} ({self.manifest}) left out: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def lock_without_unresolvable(cargo: Any, root: Path, timeout: float) -> list[Dropped] | None:
    """After `cargo generate-lockfile` failed at `root` (a copy flakebot owns): generate it without the
    dev-dependencies that stop it. Returns those left out, or None when they were not the trouble."""
    listed = cargo.run(["metadata", "--format-version", "1", "--no-deps"], root, timeout=timeout)
    if listed.returncode != 0:
        return None

    def resolve() -> str:
        result = cargo.run(["generate-lockfile"], root, timeout=timeout)
        return "" if result.returncode == 0 else cargo_reason(result.stderr)

    return drop_unresolvable(root, member_manifests(json.loads(listed.stdout), root), resolve)


def cargo_reason(stderr: str) -> str:
    """cargo's first error line with the line after it (the candidates it found), without the `error: ` prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((i for i, line in enumerate(lines) if line.startswith("error")), None)
    if first is None:
        return lines[-1] if lines else "cargo failed without a message"
    detail = (
        lines[first + 1]
        if first + 1 < len(lines) and not lines[first + 1].startswith(("location searched", "required by", "Caused by"))
        else ""
    )
    return f"{lines[first].removeprefix('error: ')} {detail}".strip()


def member_manifests(metadata: dict[str, Any], root: Path) -> list[str]:
    """The Cargo.toml of every workspace member (from `cargo metadata --no-deps`), relative to `root`."""
    members = set(metadata.get("workspace_members", []))
    found = [Path(p["manifest_path"]).resolve() for p in metadata.get("packages", []) if p["id"] in members]
    return sorted(str(path.relative_to(root.resolve())) for path in found if path.is_relative_to(root.resolve()))


def drop_unresolvable(root: Path, manifests: list[str], resolve: Resolver) -> list[Dropped] | None:
    """Leave out of the manifests under `root` the dev-dependencies without which cargo resolves.

    Returns what was dropped (the manifests then stay rewritten), or None when cargo does not resolve even
    without any dev-dependency (the manifests are restored: the trouble is elsewhere)."""
    originals = {rel: (root / rel).read_text() for rel in manifests}
    entries = [entry for rel, text in originals.items() for entry in dev_dependencies(rel, text)]
    if not entries:
        return None
    _write(root, originals, set(entries))
    if error := resolve():
        logger.info("cargo does not resolve even without dev-dependencies: %s", error)
        _write(root, originals, set())
        return None
    return _put_back(root, originals, entries, resolve)


def _put_back(root: Path, originals: dict[str, str], entries: list[DevDependency], resolve: Resolver) -> list[Dropped]:
    """Restore each entry in turn, keeping those cargo still resolves with; the others are dropped with cargo's reason."""
    left_out = set(entries)
    dropped: list[Dropped] = []
    for entry in entries:
        left_out.discard(entry)
        _write(root, originals, left_out)
        if error := resolve():
            left_out.add(entry)
            dropped.append(Dropped(entry.name, entry.manifest, ".".join(entry.table), error))
    _write(root, originals, left_out)
    if resolve():  # put back together they may still clash: then none of those restored is kept
        logger.warning("dev-dependencies resolve one by one but not together; leaving all out")
        _write(root, originals, set(entries))
        kept = [e for e in entries if e not in left_out]
        dropped += [
            Dropped(e.name, e.manifest, ".".join(e.table), "resolves alone but not with the others") for e in kept
        ]
    logger.info("dev-dependencies left out: %s", ", ".join(d.name for d in dropped))
    return dropped


def dev_dependencies(manifest: str, text: str) -> list[DevDependency]:
    """Every dev-dependency entry of one Cargo.toml, plain and per-target, in file order."""
    document = tomlkit.parse(text)
    found = [DevDependency(manifest, (table,), name) for table in DEV_TABLES for name in _keys(document.get(table))]
    for cfg, section in (document.get("target") or {}).items():
        found += [
            DevDependency(manifest, ("target", cfg, table), name)
            for table in DEV_TABLES
            for name in _keys(section.get(table))
        ]
    return found


def _keys(table: Any) -> list[str]:
    return [str(key) for key in table] if isinstance(table, dict) else []


def _write(root: Path, originals: dict[str, str], left_out: set[DevDependency]) -> None:
    """Each manifest as it was, less the entries in `left_out` (tomlkit keeps the rest of the file as written)."""
    for rel, text in originals.items():
        document = tomlkit.parse(text)
        for entry in (e for e in left_out if e.manifest == rel):
            table: Any = document
            for key in entry.table:
                table = table[key]
            del table[entry.name]
        Tree(root).write_text(rel, tomlkit.dumps(document))  # the acquired tree: no link in it followed
