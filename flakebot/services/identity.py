"""What a service is: the program the user's `up` verified and recorded, never whatever its name means later.

A catalogued name can change its program (a `craft --fresh` of the same need replaces the current version in
place, an `improve` adds a version, `rm` drops it), so a service's launch record (launch.json) carries the program
itself, as `up` found it in the catalog:

    program   {store_path, binary, sha256 of the binary, version, manifest_sha256 (the catalog version's manifest
              as `up` read it), installed_from (the shared catalog and signer, when it was installed)}
    previous  the program the service ran before (what `rollback` goes back to), as recorded when it ran

`restart`, `up --all`, `rollback` and the supervisor's crash restarts start exactly that program: its binary must
still be the file `up` digested (checked), and services/NAME/gcroot (previous-gcroot) are Nix GC roots of the two
store paths, so neither a garbage collection nor a catalog `rm` takes a recorded program away. Only the user's own
commands record another program: `up NAME@VERSION` (an upgrade), `up --replace`, `rollback`. A service whose launch
holds secrets is never started, upgraded, replaced or rolled back by an agent (MCP `service_up`, `service_rollback`):
nothing an agent does over MCP changes which program receives a secret.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import SandboxError, UsageError
from flakebot.services.layout import ServiceDir

logger = logging.getLogger(__name__)

# What a launch keeps of the program it ran, so `rollback` can start exactly that one again.
PROGRAM_FIELDS = ("version", "binary", "spec", "examples", "program")


def digest(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def store_path_of(binary: Path) -> str:
    """The store path holding `binary` (STORE/bin/NAME): what a GC root must keep."""
    return str(binary.parent.parent)


def record(manifest: dict[str, Any], binary: Path) -> dict[str, Any]:
    """The identity of the program `up` is about to start: `manifest` is the catalog version's (service_manifest_of),
    `binary` its built program."""
    shown = {k: v for k, v in manifest.items() if k not in ("catalog_version", "catalog_installed_from")}
    found = {
        "store_path": store_path_of(binary),
        "binary": str(binary),
        "sha256": digest(binary),
        "version": str(manifest.get("catalog_version", "")),
        "manifest_sha256": hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest(),
    }
    if manifest.get("catalog_installed_from"):
        found["installed_from"] = manifest["catalog_installed_from"]
    return found


def program_of(launch: dict[str, Any]) -> dict[str, Any]:
    """A launch's recorded program; a record from before programs were recorded names only its binary (its digest
    is taken now, once: a store path does not change)."""
    program = launch.get("program")
    if isinstance(program, dict) and program.get("binary") and program.get("sha256"):
        return program
    binary = Path(str(launch.get("binary") or "/nonexistent"))
    if not binary.is_file():
        return {"binary": str(binary), "store_path": store_path_of(binary), "sha256": "", "version": ""}
    return {"binary": str(binary), "store_path": store_path_of(binary), "sha256": digest(binary),
            "version": str(launch.get("version", ""))}  # fmt: skip


def checked_binary(name: str, program: dict[str, Any]) -> Path:
    """The recorded program's binary, when it is still the file `up` recorded; a SandboxError naming the fix when
    it is gone or differs (nothing is started then, and what runs keeps running)."""
    binary = Path(str(program.get("binary") or "/nonexistent"))
    again = f"'flakebot up {name} --replace' starts the catalog's current version instead"
    if not binary.is_file():
        raise SandboxError(f"the program service {name} ran ({program.get('store_path')}) is gone", fix=again)
    if not program.get("sha256") or digest(binary) != program["sha256"]:
        raise SandboxError(f"the program service {name} ran ({binary}) is not the file it recorded", fix=again)
    return binary


def snapshot(launch: dict[str, Any]) -> dict[str, Any] | None:
    """What `previous` keeps of `launch`: its program, declaration and examples; None for no launch."""
    if not launch.get("binary"):
        return None
    return {**{k: launch.get(k) for k in PROGRAM_FIELDS}, "program": program_of(launch)}


def previous(earlier: dict[str, Any], version: str) -> dict[str, Any] | None:
    """The program a start of `version` follows, as control.previous_version names its version: the last launch's
    when that ran another version, else the one it followed."""
    last = str(earlier.get("version") or "")
    if last and last != version:
        return snapshot(earlier)
    kept = earlier.get("previous")
    return kept if isinstance(kept, dict) else None


def may_start(
    where: ServiceDir, earlier: dict[str, Any], program: dict[str, Any], *, replace: bool, agent: bool
) -> None:
    """Whether `up` may record `program` for a service that is not running, over its last launch `earlier`.
    A launch holding the user's secrets is the user's: an agent (MCP) never starts it over, and the user's own
    `up` of another program than the one recorded needs --replace (the catalog's name may mean another program
    since: a craft or improve replaced it)."""
    if not earlier.get("secrets"):
        return
    name = where.name
    if agent:
        raise UsageError(
            f"service {name} was started by the user with secrets: an agent cannot start it",
            fix=f"ask the user to run 'flakebot restart {name}'",
        )
    recorded = program_of(earlier)
    if recorded.get("sha256") != program["sha256"] and not replace:
        raise UsageError(
            f"service {name} ran {recorded.get('store_path')} with secrets; the catalog's {name} is now another "
            f"program ({program['store_path']})",
            fix=f"'flakebot restart {name}' runs the program it ran; 'flakebot up {name} --replace --secret ...' "
            "starts the catalog's",
        )


def may_roll_back(name: str, launch: dict[str, Any], *, agent: bool) -> None:
    """Whether a rollback may hand the service's launch to the program it ran before. An agent's (MCP) may not when
    the launch holds the user's secrets: the secrets would go to another program than the one the user last started
    with them. Without secrets the agent goes back only to a program this service already ran (recorded then), as
    the user's rollback does."""
    if agent and launch.get("secrets"):
        raise UsageError(
            f"service {name} was started by the user with secrets: an agent cannot switch its program",
            fix=f"ask the user to run 'flakebot rollback {name}'",
        )


def catalog_change_note(name: str, manifest: dict[str, Any], settings: Settings) -> str:
    """What a craft or improve that catalogued service `name` (its `manifest`) says when a service of that name was
    started here on another program: that service keeps its recorded program, and only the user switches it."""
    if manifest.get("kind") != "service":
        return ""
    try:
        where = ServiceDir.of(name, settings)
    except UsageError:
        return ""
    launch = where.read_json(where.launch_file)
    recorded = launch.get("program") if isinstance(launch.get("program"), dict) else None
    if not recorded or recorded.get("store_path") == manifest.get("store_path"):
        return ""
    return (
        f"service {name} keeps running the program it was started with ({launch.get('version')}, "
        f"{recorded.get('store_path')}); this changed only the catalog. Only the user switches it: 'flakebot up "
        f"{name}@{manifest.get('catalog_version') or 'VERSION'}' while it runs (an upgrade), or 'flakebot up {name} "
        "--replace' when it is stopped"
    )


def hold_roots(where: ServiceDir, launch: dict[str, Any]) -> None:
    """GC roots in the service's directory for the program `launch` runs and the one it rolls back to, whatever the
    catalog holds (a catalog `rm` removes only the catalog's own roots)."""
    where.root.mkdir(parents=True, exist_ok=True)
    for link, program in (("gcroot", launch.get("program")), ("previous-gcroot", (launch.get("previous") or {}).get("program"))):  # fmt: skip
        path = where.root / link
        store = (program or {}).get("store_path") if isinstance(program, dict) else None
        if store and Path(store).exists():
            if path.is_symlink() and os.readlink(path) == str(store):
                continue  # the root it is already: nix keeps an indirect root while its link names the path (an up
                # of the same program again skips 25-40 ms of nix-store)
            from flakebot.deliver.catalog import add_gc_root

            add_gc_root(path, str(store))
        elif link == "previous-gcroot":
            path.unlink(missing_ok=True)


__all__ = [
    "catalog_change_note",
    "checked_binary",
    "hold_roots",
    "may_roll_back",
    "may_start",
    "previous",
    "program_of",
    "record",
    "snapshot",
]
