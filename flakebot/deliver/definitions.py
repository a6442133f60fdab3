"""Every catalogued tool as an MCP definition, made once per version and cached against what it depends on.

A definition is made from the current version's manifest.json by today's code (helpparse reads the recorded
--help, toolcall writes the description). Its stamp is what it depends on: the tool's entry (its digest in the
index: every add, update or remove of the tool changes it) and the code (flakebot's version and the sources of the
modules that make it). A version's manifest is written once, before the version is renamed into place, so the
entry stands for it. Definitions are kept in this process and in the index (catalog.db's definitions table, so a
new server starts warm): a list reads the index's digests in one pass and makes only the changed tools' definitions.
A tenant's catalog (deliver/catalog.py) is listed layer by layer, each catalog's definitions kept apart, its own
shadowing the organisation's of the same name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from functools import cache
from pathlib import Path
from typing import Any

from flakebot.deliver import catalogdb
from flakebot.deliver.catalog import Catalog, read_manifest
from flakebot.errors import CatalogError

logger = logging.getLogger(__name__)

STORE_BUSY_SECONDS = 0.05  # storing definitions is a favour to the next server: never wait behind a craft for it
# catalog root -> name -> (stamp, definition); None for a tool that is not called as one (a service)
_made: dict[Path, dict[str, tuple[str, dict[str, Any] | None]]] = {}
_lock = threading.Lock()


def catalog_definitions(catalog: Catalog) -> list[dict[str, Any]]:
    """Every catalogued tool's MCP definition, sorted by name; a tool whose definition cannot be made is left out
    (one broken entry must not hide the others). Unchanged tools give the same definition objects as before."""
    return [d for _, d in stamped_definitions(catalog).values() if d is not None]


def stamped_definitions(catalog: Catalog) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """catalog_definitions with each tool's stamp, services (None) included, by name in the same order."""
    layers = catalog.layers()
    if len(layers) == 1:
        return _layer_definitions(layers[0])
    merged: dict[str, tuple[str, dict[str, Any] | None]] = {}
    for layer in layers:  # the organisation's, then the tenant's over it
        merged.update(_layer_definitions(layer))
    return dict(sorted(merged.items()))


def _layer_definitions(catalog: Catalog) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """One catalog's (not its layers') stamped definitions."""
    with catalog.index.reading() as db:
        stamps = {name: f"{code_key()}:{digest}" for name, digest in catalogdb.digests(db).items()}
    with _lock:
        made = _made.setdefault(catalog.root, {})
        for name in made.keys() - stamps.keys():
            del made[name]
        stale = [name for name, stamp in stamps.items() if name not in made or made[name][0] != stamp]
        if stale:
            _refresh(catalog, made, stale, stamps)
        return {name: made[name] for name in stamps if name in made}


def service_names(catalog: Catalog) -> set[str]:
    """The catalogued names that are services (started with `up`, not called), known from the same made-once pass
    as catalog_definitions: a list of kinds reads no manifest it read before."""
    return {name for name, (_, definition) in stamped_definitions(catalog).items() if definition is None}


def _refresh(
    catalog: Catalog, kept_here: dict[str, tuple[str, dict[str, Any] | None]], stale: list[str], stamps: dict[str, str]
) -> None:
    """The stale tools' definitions, into `kept_here` (the catalog's in _made): from the index where their stamps
    hold, else made and stored there."""
    with catalog.index.reading() as db:
        stored = catalogdb.definitions(db, stale)
    made: dict[str, tuple[str, str]] = {}
    unmade = [name for name in stale if stored.get(name, ("",))[0] != stamps[name]]
    entries = catalog.tools() if len(unmade) > 64 else {}  # many to make: the entries in one pass
    for name in stale:
        kept = stored.get(name)
        if kept is not None and kept[0] == stamps[name]:
            kept_here[name] = (stamps[name], json.loads(kept[1]))
            continue
        try:
            entry = entries.get(name) or catalog.entry(name)
            if entry is None:  # removed since the digests were read
                continue
            definition = make(entry)
        except (CatalogError, OSError, ValueError) as exc:
            logger.warning("tool %s left out of the tool list: %s", name, exc)
            kept_here.pop(name, None)
            continue
        kept_here[name] = (stamps[name], definition)
        made[name] = (stamps[name], json.dumps(definition))
    if made:
        try:
            with catalog.index.writing(busy=STORE_BUSY_SECONDS, durable=False) as db:
                catalogdb.store_definitions(db, made)
        except CatalogError as exc:  # busy or read-only: this process keeps them
            logger.info("tool definitions not stored in the index: %s", exc)


def make(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A tool's MCP definition from its current version's manifest (None for a service, started with `up`)."""
    from flakebot.deliver.toolcall import mcp_definition

    manifest = read_manifest(Path(entry["dir"]), f"{entry['name']}@{entry['version']}")
    if not manifest.get("nix_run_argv"):
        raise CatalogError(
            f"tool '{entry['name']}' has no manifest",
            fix=f"craft it again with 'flakebot craft --fresh' or remove it with 'flakebot rm {entry['name']}'",
        )
    if manifest.get("kind") == "service":
        return None
    return mcp_definition(manifest)


@cache
def code_key() -> str:
    """flakebot's version and the sources of the modules a definition is made by, digested."""
    from flakebot import __version__, modeltext
    from flakebot.deliver import helpparse, schema, toolcall

    digest = hashlib.sha256(__version__.encode())
    for module in (helpparse, schema, toolcall, modeltext):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()[:16]
