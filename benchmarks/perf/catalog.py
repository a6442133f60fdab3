"""P15, P16: the catalog at scale. `flakebot mcp`'s tools/list with 1,000 and 10,000 catalogued tools, and one
`Catalog.add` into a catalog of one tool against one into a catalog of 1,000.

The entries are real and made cheaply: one small tool (a shell script with a clap-style --help) is added to the
Nix store once (`nix-store --add`), then catalogued through `Catalog.add` under each name, each with its own flake
copy, manifest, USAGE.md and GC root (`nix-store --add-root`), as a craft catalogues it; no tool is built N times.
At each size: `repeat` adds of a new tool each followed by its `Catalog.remove` (both timed; the catalog holds the
size again after each), then a server's tools/list: the first answer of a fresh `flakebot mcp` (another fresh
server listed first, as the previous session would, so the index holds the definitions), and on that server,
`repeat` times, one tool added by this process (another process to the server) followed by tools/list, which must
list it: the list an agent asks for after tools/list_changed. A list is timed until its whole answer has arrived;
this client's parse of it is measured beside. Then show and the manifest a run reads, in process. Figures are
medians with their min and max.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.perf.calls import Server
from benchmarks.scenarios.many_tools import Tools, store_path

LIST_GOALS_S = {1000: 0.1, 10_000: 0.5}
ADD_GOAL_RATIO = 1.5  # flat: an add into 1,000 tools at most this much slower than into one


def _spread(samples: list[float]) -> dict[str, float]:
    return {
        "min": round(min(samples), 4),
        "median": round(statistics.median(samples), 4),
        "max": round(max(samples), 4),
    }


def _timed(action: Any, *args: Any) -> float:
    start = time.perf_counter()
    action(*args)
    return time.perf_counter() - start


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKEBOT_")}
    for sub in ("config", "data", "cache", "state"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        env[f"XDG_{sub.upper()}_HOME"] = str(root / sub)
    return env


def _list(server: Server) -> tuple[float, float, dict[str, Any]]:
    """One tools/list: (seconds until the whole answer arrived, seconds this client then took to parse it, the
    answer). The parse is the client's: a client with another parser takes another time."""
    assert server.proc.stdout is not None
    server.next_id += 1
    start = time.perf_counter()
    server._send({"jsonrpc": "2.0", "id": server.next_id, "method": "tools/list", "params": {}})
    while True:
        line = server.proc.stdout.readline()
        arrived = time.perf_counter()
        if not line:
            raise RuntimeError("flakebot mcp ended before answering tools/list")
        message = json.loads(line)
        if message.get("id") == server.next_id:
            return arrived - start, time.perf_counter() - arrived, {**message["result"], "bytes": len(line)}


def _lists(env: dict[str, str], work: Path, tools: Tools, size: int, repeat: int) -> dict[str, Any]:
    """A fresh server's first tools/list, then `repeat` lists each after one tool was added, then `repeat` with
    nothing changed."""
    first = Server(env, work)
    first.start()  # the previous session: it leaves the definitions in the index
    first.close()
    server = Server(env, work)
    info = {"name": "bench", "version": "1"}
    server.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info})
    cold, _, answer = _list(server)
    own = len(answer["tools"]) - size
    changed, parsed = [], []
    for n in range(repeat):
        name = f"new{size}-{n}"
        tools.add(name)
        seconds, parse, answer = _list(server)
        changed.append(seconds)
        parsed.append(parse)
        listed = answer["tools"]
        if len(listed) != own + size + n + 1 or not any(t["name"] == name for t in listed):
            raise RuntimeError(f"tools/list after adding {name} has {len(listed)} tools, not {own + size + n + 1}")
    unchanged = [_list(server)[0] for _ in range(repeat)]
    server.close()
    for n in range(repeat):
        tools.catalog.remove(f"new{size}-{n}")
    return {
        "first_s": round(cold, 4),
        "changed_s": _spread(changed),
        "unchanged_s": _spread(unchanged),
        "client_parse_s": _spread(parsed),
        "answer_bytes": answer["bytes"],
    }


def _measure(tools: Tools, env: dict[str, str], work: Path, size: int, repeat: int) -> dict[str, Any]:
    from flakebot.deliver.catalog import Catalog, show_tool
    from flakebot.deliver.definitions import make

    adds, removes = [], []
    for n in range(repeat):
        name = f"timed{size}-{n}"
        adds.append(_timed(tools.add, name))
        removes.append(_timed(tools.catalog.remove, name))
    settings = _settings(env)
    probe = f"t{size:05d}"
    show = [_timed(show_tool, probe, settings) for _ in range(repeat)]
    reads = [_timed(lambda: make(Catalog.open(settings).get(probe))) for _ in range(repeat)]
    return {
        "size": size,
        "add_s": _spread(adds),
        "remove_s": _spread(removes),
        "show_s": _spread(show),
        "definition_s": _spread(reads),
        "index_bytes": sum(p.stat().st_size for p in tools.catalog.root.glob("catalog.*")),
        **_lists(env, work, tools, size, repeat),
    }


def _settings(env: dict[str, str]) -> Any:
    from flakebot import config

    return config.Settings(catalog_dir=str(Path(env["XDG_DATA_HOME"]) / "flakebot"))


def run(sizes: tuple[int, ...] = (1, 1000, 10_000), repeat: int = 5, nix: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-catalog-") as tmp:
        root = Path(tmp)
        env = _env(root / "home")
        work = root / "work"
        work.mkdir()
        tools = Tools(root / "home", store_path(root, nix and shutil.which("nix-store") is not None))
        rows, grown = [], []
        for size in sizes:
            grown.append(_timed(tools.grow, size))
            rows.append(_measure(tools, env, work, size, repeat))
        return {
            "sizes": list(sizes),
            "repeat": repeat,
            "nix_store": tools.store.startswith("/nix/store/"),
            "grow_s": [round(s, 1) for s in grown],
            "rows": rows,
            "list_goals_s": {str(k): v for k, v in LIST_GOALS_S.items()},
            "add_goal_ratio": ADD_GOAL_RATIO,
        }


@dataclass(frozen=True, kw_only=True)
class Spread:
    min: float
    median: float
    max: float


@dataclass(frozen=True, kw_only=True)
class SizeRow:
    """One catalog size's measures, in seconds."""

    size: int
    add_s: Spread
    remove_s: Spread
    show_s: Spread
    definition_s: Spread
    index_bytes: int
    first_s: float
    changed_s: Spread
    unchanged_s: Spread
    client_parse_s: Spread
    answer_bytes: int


@dataclass(frozen=True, kw_only=True)
class CatalogResult:
    """run()'s result, as report.json holds it."""

    sizes: list[int]
    repeat: int
    nix_store: bool
    grow_s: list[float]
    rows: list[SizeRow]
    list_goals_s: dict[str, float]
    add_goal_ratio: float


RESULT = CatalogResult


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]] or [1, 1000]
    print(json.dumps(run(tuple(args), repeat=3), indent=1))
