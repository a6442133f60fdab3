"""Attacks on a shared catalog's index, through the real CLI: what a cache owner can write into index.json.

Each attack gets its own flakebot home trusting one key for a file:// cache, and writes the cache's index: forged
(unsigned, or signed by a stranger), replayed (older, or expired), or signed by the key's holder but hostile in
shape or text. The home first reads a good index when the attack is a replay, so it has something to go back on.
Then `flakebot list --remote` must refuse it in one line (exit 61, no traceback, no terminal escape reaching
the terminal) and `flakebot craft` of the need it claims must skip the catalog with a warning and go on (here to
the model, which is missing: exit 30). Used by `make reliability`; the tests drive the same attacks and more
(a real binary cache, installs on a machine with an empty store) in tests/deliver/test_shared_index.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REFUSED = 61
PAST_THE_CATALOGS = 30  # ModelError: craft reached its first model use
STORE = "/nix/store/" + "a" * 32
ESCAPES = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\x1b]8;;https://evil.example/\x07"
NEED = "need note"


@dataclass(frozen=True)
class Keys:
    """The key the home trusts (its secret, as the publisher holds it) and a stranger's."""

    trusted_secret: str
    trusted_public: str
    stranger_secret: str


def nix_key(name: str) -> tuple[str, str]:
    """(secret, public) in Nix's NAME:BASE64 form, as `nix key generate-secret` makes them."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

    private = Ed25519PrivateKey.generate()
    seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return f"{name}:{base64.b64encode(seed + public).decode()}", f"{name}:{base64.b64encode(public).decode()}"


def snapshot(sequence: int = 5, expires_in: float = 3600, **note: Any) -> dict[str, Any]:
    record = {"store_path": f"{STORE}-note-0.2.0", "entry_path": f"{STORE}-flakebot-entry-note-0.2.0", "summary": "s"}
    tool = {"name": "note", "need": NEED, "version": "0.2.0", "versions": {"0.2.0": record}, **note}
    now = time.time()
    return {
        "type": "flakebot-catalog-index",
        "sequence": sequence,
        "published_at": now,
        "expires": now + expires_in,
        "tools": {"note": tool},
    }


def signed(snap: dict[str, Any], secret: str) -> str:
    from flakebot.deliver.signatures import signed_index

    return json.dumps(signed_index(snap, secret))


def rolled_back() -> dict[str, Any]:
    old = snapshot(6)
    old["tools"]["note"]["version"] = "0.1.0"
    old["tools"]["note"]["versions"] = {"0.1.0": {**old["tools"]["note"]["versions"]["0.2.0"], "summary": "old"}}
    return old


Write = Callable[[Keys], str]


@dataclass(frozen=True)
class IndexAttack:
    name: str
    what: str
    index: Write
    seen_first: bool = False  # the home read the good index (sequence 5, note 0.2.0) before


ATTACKS = (
    IndexAttack(
        "unsigned",
        "the index as flakebot wrote it before signing (format 1), claiming the need",
        lambda k: json.dumps({"format": 1, "tools": snapshot()["tools"]}),
    ),
    IndexAttack(
        "tampered",
        "a signed index whose snapshot text was edited afterwards",
        lambda k: signed(snapshot(), k.trusted_secret).replace("0.2.0", "0.1.0"),
    ),
    IndexAttack(
        "stranger, sequence reset",
        "a fresh index, sequence 1, signed by a key nobody configured",
        lambda k: signed(snapshot(1), k.stranger_secret),
    ),
    IndexAttack(
        "replayed older",
        "a validly signed index older (sequence 4) than the one already seen (5)",
        lambda k: signed(snapshot(4), k.trusted_secret),
        seen_first=True,
    ),
    IndexAttack(
        "version set back",
        "a validly signed newer index (6) whose current note is 0.1.0, after 0.2.0 was seen",
        lambda k: signed(rolled_back(), k.trusted_secret),
        seen_first=True,
    ),
    IndexAttack(
        "expired",
        "a validly signed index whose expiry passed (a frozen mirror)",
        lambda k: signed(snapshot(expires_in=-60), k.trusted_secret),
    ),
    IndexAttack(
        "wrong types",
        "signed, but a tool is a string and another's versions a list",
        lambda k: signed({**snapshot(), "tools": {"note": "x", "b": {"versions": [1]}}}, k.trusted_secret),
    ),
    IndexAttack(
        "huge string",
        "signed, with a 3 MB summary",
        lambda k: signed(
            snapshot(
                versions={"0.2.0": {**snapshot()["tools"]["note"]["versions"]["0.2.0"], "summary": "x" * 3_000_000}}
            ),
            k.trusted_secret,
        ),
    ),
    IndexAttack(
        "missing fields",
        "signed, with a version record lacking its store paths",
        lambda k: signed(snapshot(versions={"0.2.0": {"summary": "s"}}), k.trusted_secret),
    ),
    IndexAttack(
        "terminal escapes",
        "signed, with OSC 52, a screen clear and a hyperlink in a tool name",
        lambda k: signed({**snapshot(), "tools": {f"note{ESCAPES}": snapshot()["tools"]["note"]}}, k.trusted_secret),
    ),
)
QUICK = ("unsigned", "replayed older", "terminal escapes")


def run_index_attacks(root: Path, names: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Each attack (or those named) in a fresh home under `root`; one row each, judged from outside."""
    return [
        _attack(root / f"attack-{n}", attack) for n, attack in enumerate(ATTACKS) if not names or attack.name in names
    ]


def _attack(home: Path, attack: IndexAttack) -> dict[str, Any]:
    trusted_secret, trusted_public = nix_key("publisher-1")
    keys = Keys(trusted_secret, trusted_public, nix_key("stranger-1")[0])
    cache = home / "cache"
    (cache / "flakebot").mkdir(parents=True)
    index = cache / "flakebot" / "index.json"
    env = _env(home, f"file://{cache} {trusted_public}")
    if attack.seen_first:
        index.write_text(signed(snapshot(5), keys.trusted_secret))
        first = _cli(env, home, "list", "--remote")
        if first.returncode != 0:
            raise RuntimeError(f"the good index was refused: {first.stderr[-500:]}")
    index.write_text(attack.index(keys))
    listed = _cli(env, home, "list", "--remote")
    crafted = _cli(env, home, "craft", NEED, "--model", f"scripted:{home / 'no-such-session.json'}")
    lines = [line for line in listed.stderr.splitlines() if line.strip()]
    seen = listed.stdout + listed.stderr + crafted.stdout + crafted.stderr
    row = {
        "attack": attack.name,
        "what": attack.what,
        "exit_code": listed.returncode,
        "error_line": lines[-1] if lines else "",
        "one_line": len(lines) == 1 and lines[0].startswith("error: ") and "Fix:" in lines[0],
        "craft_exit": crafted.returncode,
        "craft_went_on": crafted.returncode == PAST_THE_CATALOGS
        and f"sharedcatalogfile://{cache}skipped" in "".join(crafted.stderr.split()),
        "escapes_reached_terminal": "\x1b" in seen or "\x07" in seen,
        "traceback": "Traceback (most recent call last)" in seen,
    }
    row["refused"] = row["exit_code"] == REFUSED and row["one_line"]
    row["ok"] = row["refused"] and row["craft_went_on"] and not row["escapes_reached_terminal"] and not row["traceback"]
    return row


def _env(home: Path, catalogs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKEBOT_")}
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "xdg-cache")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(home / sub)
    return {**env, "FLAKEBOT_WORKDIR": str(home / "work"), "FLAKEBOT_CATALOGS": catalogs, "COLUMNS": "400"}


def _cli(env: dict[str, str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "flakebot", *args]
    return subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=300)
