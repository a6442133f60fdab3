"""A shared catalog's index as hostile input: its signed snapshot, verified and validated before anything reads it.

    <cache>/flakebot/index.json   {"format": 2, "snapshot": "<JSON text>", "signatures": ["NAME:BASE64SIG"]}
    the snapshot                  {"type": "flakebot-catalog-index", "sequence": N, "published_at": T,
                                   "expires": T, "tools": {name: {name, need, version, versions: {v: record}}}}
    a record                      {store_path, entry_path, summary, nar_hash, paths, closure_size, published_at}

Whoever owns the cache can rewrite this file, so the way The Update Framework treats a mirror: `verify` checks
the signature over the snapshot's exact bytes against the keys configured for that catalog (the publisher signs
with its Nix signing key, flakebot.deliver.signatures), then its expiry, then its shape, types, sizes and names,
and returns a `Snapshot` holding only what it checked. Whether the snapshot is older than one seen before is
flakebot.deliver.seen's job. Every refusal is a CatalogTrustError naming the catalog and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from flakebot.deliver import signatures
from flakebot.deliver.catalog import normalize_need
from flakebot.deliver.versions import VERSION_RE, newest
from flakebot.errors import CatalogTrustError
from flakebot.modeltext import one_line
from flakebot.toolspec import NAME_RE

FORMAT = signatures.INDEX_FORMAT
TYPE = "flakebot-catalog-index"
MAX_BYTES = 8 * 1024 * 1024
MAX_TOOLS = 10_000
MAX_VERSIONS = 1_000
MAX_SIGNATURES = 16
MAX_NEED = 1_000
MAX_SUMMARY = 2_000
MAX_SEQUENCE = 2**53  # a JSON number every reader keeps exactly
# A store path as Nix names one: 32 base-32 hash characters, a name of Nix's allowed characters.
STORE_PATH_RE = re.compile(r"/nix/store/[0-9abcdfghijklmnpqrsvwxyz]{32}-[A-Za-z0-9+\-._?=]{1,180}\Z")
RECORD_NUMBERS = ("paths", "closure_size", "published_at")


@dataclass(frozen=True)
class Snapshot:
    """A verified index: the catalog it came from, the configured key that signed it, its sequence and expiry,
    its digest (two snapshots of one sequence must be the same), and its checked tools."""

    catalog: str
    signer: str
    sequence: int
    published_at: float
    expires: float
    digest: str
    tools: dict[str, dict[str, Any]]


class Malformed(ValueError):
    """What is wrong with an index's shape, said in a few plain words."""


def new_snapshot(tools: dict[str, dict[str, Any]], sequence: int, lifetime: float) -> dict[str, Any]:
    """The snapshot a publisher signs: `tools` as `Snapshot.tools` holds them, valid for `lifetime` seconds."""
    now = time.time()
    return {"type": TYPE, "sequence": sequence, "published_at": now, "expires": now + lifetime, "tools": tools}


def verify(raw: bytes, catalog: str, keys: list[str], now: float | None = None) -> Snapshot:
    """The index `raw` of `catalog`, signed by one of `keys`, unexpired (at `now`; None skips that check: a
    publisher renewing its own index) and well formed; otherwise a CatalogTrustError."""
    envelope = _envelope(raw, catalog)
    text, sigs = envelope["snapshot"], envelope["signatures"]
    signer = signatures.index_signer(text, sigs, keys)
    if signer is None:
        names = ", ".join(key.partition(":")[0] for key in keys)
        raise CatalogTrustError(
            f"refused the index of the shared catalog {catalog}: it is not signed by a key you trust ({names})",
            fix="if its publisher changed keys, check the new public key with them and configure it in the catalogs "
            "setting; otherwise the cache was tampered with: tell its owner",
            catalog=catalog,
            reason="unsigned",
        )
    try:
        snapshot = _snapshot(_json(text.encode()))
    except Malformed as exc:
        raise _malformed(catalog, str(exc)) from None
    if now is not None and now > snapshot["expires"]:
        raise CatalogTrustError(
            f"refused the index of the shared catalog {catalog}: it expired at {_when(snapshot['expires'])} "
            "(a frozen index: nobody renewed it, or an old copy is being served)",
            fix=f"ask its publisher to publish again (any 'flakebot publish TOOL --to {catalog}' renews it)",
            catalog=catalog,
            reason="expired",
        )
    return Snapshot(
        catalog=catalog,
        signer=signer,
        sequence=snapshot["sequence"],
        published_at=snapshot["published_at"],
        expires=snapshot["expires"],
        digest=hashlib.sha256(text.encode()).hexdigest(),
        tools=snapshot["tools"],
    )


def _envelope(raw: bytes, catalog: str) -> dict[str, Any]:
    try:
        if len(raw) > MAX_BYTES:
            raise Malformed(f"it is {len(raw):,} bytes, more than {MAX_BYTES:,}")
        envelope = _json(raw)
        if not isinstance(envelope, dict):
            raise Malformed("it is not a JSON object")
        if envelope.get("format") == 1:
            raise CatalogTrustError(
                f"refused the index of the shared catalog {catalog}: it is not signed (format 1, as flakebot wrote "
                "indexes before it signed them, or a forgery)",
                fix=f"ask its publisher to publish again with a current flakebot ('flakebot publish TOOL --to {catalog}' signs it)",
                catalog=catalog,
                reason="unsigned",
            )
        if envelope.get("format") != FORMAT:
            raise Malformed(f"its format is {one_line(envelope.get('format'), 40)}, not {FORMAT}")
        sigs = envelope.get("signatures")
        if not isinstance(envelope.get("snapshot"), str) or not _strings(sigs, MAX_SIGNATURES, 200):
            raise Malformed("it has no snapshot text and list of signatures")
    except Malformed as exc:
        raise _malformed(catalog, str(exc)) from None
    return envelope


def _json(raw: bytes) -> Any:
    def refuse(constant: str) -> None:
        raise Malformed(f"it holds {constant}, which JSON does not")

    try:
        return json.loads(raw, parse_constant=refuse)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Malformed(f"it is not JSON ({exc})") from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, a number too long to convert
        raise Malformed(f"it is not JSON a reader can take ({type(exc).__name__})") from None


def _snapshot(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("type") != TYPE:
        raise Malformed(f"its snapshot is not a {TYPE}")
    sequence: Any = value.get("sequence")
    if not _int(sequence) or not 0 < sequence <= MAX_SEQUENCE:
        raise Malformed("its sequence is not a positive integer")
    times = [value.get("published_at"), value.get("expires")]
    if not all(_number(t) for t in times):
        raise Malformed("its published_at or expires is not a time")
    tools = value.get("tools")
    if not isinstance(tools, dict) or len(tools) > MAX_TOOLS:
        raise Malformed(f"its tools are not a table of at most {MAX_TOOLS} tools")
    checked = {str(name): _tool(name, tool) for name, tool in tools.items()}
    return {"sequence": sequence, "published_at": times[0], "expires": times[1], "tools": checked}


def _tool(name: str, tool: Any) -> dict[str, Any]:
    if not NAME_RE.fullmatch(name) or len(name) > 100:
        raise Malformed(f"the tool name {one_line(repr(name), 60)} is not a tool name")
    if not isinstance(tool, dict):
        raise Malformed(f"tool {name} is not a table")
    need, versions, current = tool.get("need"), tool.get("versions"), tool.get("version")
    if not isinstance(need, str) or len(need) > MAX_NEED:
        raise Malformed(f"tool {name} has no need of at most {MAX_NEED} characters")
    if not isinstance(versions, dict) or not 0 < len(versions) <= MAX_VERSIONS:
        raise Malformed(f"tool {name} has no table of at most {MAX_VERSIONS} versions")
    records = {_version(name, v): _record(f"{name}@{v}", record) for v, record in versions.items()}
    if current not in records or current != newest(list(records)):
        raise Malformed(f"tool {name}'s current version is not its newest listed one")
    # The key craft matches is computed here from the need, never taken from the index.
    return {"name": name, "need": need, "need_key": normalize_need(need), "version": current, "versions": records}


def _version(name: str, version: str) -> str:
    if not VERSION_RE.fullmatch(version) or len(version) > 40:
        raise Malformed(f"tool {name} lists {one_line(repr(version), 60)}, which is not a version")
    return version


def _record(where: str, record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise Malformed(f"{where} is not a table")
    paths = {key: record.get(key) for key in ("store_path", "entry_path")}
    for key, path in paths.items():
        if not isinstance(path, str) or not STORE_PATH_RE.match(path):
            raise Malformed(f"{where} has no {key} that is a store path")
    summary = record.get("summary", "")
    if not isinstance(summary, str) or len(summary) > MAX_SUMMARY:
        raise Malformed(f"{where} has a summary that is not text of at most {MAX_SUMMARY} characters")
    nar_hash = record.get("nar_hash", "")
    if not isinstance(nar_hash, str) or len(nar_hash) > 200:
        raise Malformed(f"{where} has a malformed nar_hash")
    numbers = {key: record.get(key, 0) for key in RECORD_NUMBERS}
    if not all(_number(value) and value >= 0 for value in numbers.values()):
        raise Malformed(f"{where} has a count or time that is not a number")
    return {**paths, "summary": summary, "nar_hash": nar_hash, **numbers}


def _malformed(catalog: str, problem: str) -> CatalogTrustError:
    return CatalogTrustError(
        f"refused the index of the shared catalog {catalog}: it is malformed ({one_line(problem, 200)})",
        fix="tell its publisher (publishing again rewrites it); meanwhile remove the catalog from the catalogs setting",
        catalog=catalog,
        reason="malformed",
    )


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (_int(value) or isinstance(value, float)) and math.isfinite(value) and abs(value) < 1e15


def _strings(value: Any, count: int, length: int) -> bool:
    return (
        isinstance(value, list) and len(value) <= count and all(isinstance(v, str) and len(v) <= length for v in value)
    )


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))
