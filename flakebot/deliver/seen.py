"""What this machine has seen of each shared catalog: the highest index sequence, and each tool's highest version.

    <catalog_dir>/shared-catalogs.json   {"format": 1, "catalogs": {url: {sequence, digest, signer, seen_at,
                                                                           versions: {tool: version}}}}

flakebot's own data directory, which no cache owner, tool or model writes. `check_and_record` refuses a verified
index older than one seen before (a replay or rollback: The Update Framework's rule), another snapshot under the
same sequence, or one that sets a tool's current version below what was seen; otherwise it records it. A publisher
that really reset a catalog is forgotten by removing the catalog's entry from the file (the error says so).
"""

from __future__ import annotations

import fcntl
import json
import logging
import time
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.deliver.index import Snapshot
from flakebot.deliver.versions import version_key
from flakebot.errors import CatalogError, CatalogTrustError
from flakebot.fsutil import atomic_write_text

logger = logging.getLogger(__name__)

FILE = "shared-catalogs.json"
FORMAT = 1


def state_file(settings: Settings) -> Path:
    return settings.path("catalog_dir") / FILE


def check_and_record(snapshot: Snapshot, settings: Settings) -> None:
    """Refuse `snapshot` when it goes back on what this machine saw of its catalog; else remember it."""
    path = state_file(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_name(f".{FILE}.lock"), "w")
    except OSError as exc:  # without a place to remember it, a rollback could not be told from an update
        raise CatalogError(
            f"cannot record what this machine saw of {snapshot.catalog} in {path.parent} ({exc.strerror})",
            fix="set catalog_dir to a writable directory",
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two readers at once: the higher sequence wins
        state = _read(path)
        before = state["catalogs"].get(snapshot.catalog)
        if before is not None:
            _refuse_rollback(snapshot, before, path)
            if snapshot.sequence == before["sequence"]:
                return
        versions = dict((before or {}).get("versions") or {})
        versions.update({name: tool["version"] for name, tool in snapshot.tools.items()})
        state["catalogs"][snapshot.catalog] = {
            "sequence": snapshot.sequence,
            "digest": snapshot.digest,
            "signer": snapshot.signer,
            "seen_at": time.time(),
            "versions": versions,
        }
        atomic_write_text(path, json.dumps(state, indent=2, sort_keys=True) + "\n")


def last_sequence(catalog: str, settings: Settings) -> int | None:
    """The highest sequence seen of `catalog`'s index, None when it was never read here."""
    before = _read(state_file(settings))["catalogs"].get(catalog)
    return None if before is None else int(before["sequence"])


def _refuse_rollback(snapshot: Snapshot, before: dict[str, Any], path: Path) -> None:
    seen = int(before["sequence"])
    problem = ""
    if snapshot.sequence < seen:
        problem = (
            f"its sequence {snapshot.sequence} is older than the {seen} this machine already saw (a replay or rollback)"
        )
    elif snapshot.sequence == seen and snapshot.digest != before.get("digest"):
        problem = f"it differs from the index of the same sequence {seen} this machine already saw"
    for name, version in sorted((before.get("versions") or {}).items()):
        tool = snapshot.tools.get(name)
        if not problem and tool is not None and version_key(tool["version"]) < version_key(str(version)):
            problem = f"it sets {name} back to {tool['version']} after this machine saw {version} (a rollback)"
    if problem:
        raise rollback(snapshot.catalog, problem, path)


def rollback(catalog: str, problem: str, path: Path) -> CatalogTrustError:
    return CatalogTrustError(
        f"refused the index of the shared catalog {catalog}: {problem}",
        fix=f"ask its publisher to publish again; if they really reset that catalog, remove its entry {json.dumps(catalog)} from {path}",
        catalog=catalog,
        reason="rollback",
    )


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"format": FORMAT, "catalogs": {}}
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path} is unreadable ({exc})", fix=f"restore or remove {path}") from None
    if not isinstance(state, dict) or not isinstance(state.get("catalogs"), dict):
        raise CatalogError(f"{path} has no catalogs table", fix=f"restore or remove {path}")
    return state
