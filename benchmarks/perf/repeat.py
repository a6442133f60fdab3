"""P9 and P9-improve: crafts on dependencies already built, against the cold craft measured in the same run.

Four traced runs of the offline scripted csv-dedup session (benchmarks.bench_craft: a new process, every child
timed, the spec summary given a nonce so `nix build` really builds), one cache directory shared by all:
  today    the craft with the dependency cache off (`dependency_cache = false`): what every craft paid before it
  cold     the craft with the dependency cache on and empty: its dependencies built once, sandboxed, from the
           manifest and lock (P1's craft)
  other    the same session as another tool (its own catalog, the spec naming it csv-uniq): same dependencies
  improve  `flakebot improve csv-dedup` of the cold craft's tool (a new example for repeated --key, a changed
           source file): a fork-mode craft of the catalog's copy, whose manifest has the dependency the model added
P9 = (cargo + nix build) seconds of `other` / those of `cold`; P9-improve = the same for `improve`; goal <= 0.25 each.
cold / today shows what the cache costs a cold craft.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.perf.craft import (
    SESSION,
    Attributed,
    attribute,
    craft_argv,
    homes,
    processes,
    salted,
    session_with_nonce,
    traced_command,
    with_dependency,
)

GOAL = 0.25
REQUEST = "also compare rows on several --key columns at once"
NEW_EXAMPLE = {
    "description": "--key repeated compares rows on all the columns named",
    "args": ["--key", "id", "--key", "name"],
    "stdin": "id,name\n1,ann\n1,bob\n1,ann\n",
    "stdout": "id,name\n1,ann\n1,bob\n",
    "exit_code": 0,
}


def traced(root: Path, name: str, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One flakebot command under benchmarks.perf.proctrace: wall, cargo and nix build seconds, and the dependency cache's
    progress line."""
    done, trace, window = traced_command(root / name, argv, env, name)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    cache = [e["message"] for e in events if "dependency cache" in str(e.get("message", ""))]
    whole = attribute(processes(trace["processes"]), window)
    return {**whole, "dependency_cache": cache[-1] if cache else "", "result": events[-1].get("result", {})}


def craft(
    root: Path, name: str, *, salt: str, cache: bool = True, tool: str = "", extra: dict[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """A craft of the csv-dedup session in its own homes (the cache directory shared); `tool` renames it; crafts
    with the same `salt` have the same dependency set; `extra` (add_dependency's arguments) adds a crate to it (the
    program does not use it, and cargo compiles it all the same)."""
    env = homes(root, name)
    if not cache:
        config = Path(env["XDG_CONFIG_HOME"]) / "flakebot"
        config.mkdir(parents=True, exist_ok=True)
        (config / "flakebot.toml").write_text("dependency_cache = false\n")
    session = session_with_nonce(root / name / "session.json")
    salted(session, salt)
    if extra:
        with_dependency(session, extra)
    if tool:
        data = json.loads(session.read_text())
        data["stages"]["spec"][0]["tool_calls"][0]["arguments"]["name"] = tool
        session.write_text(json.dumps(data))
    return traced(root, name, [*craft_argv(session)], env), env


def improvement_session(dest: Path) -> Path:
    """The improve's scripted model: one new example, then the session's program with a changed line."""
    data = json.loads(SESSION.read_text())
    writes = [c for t in data["stages"]["edit"] for c in t.get("tool_calls", []) if c["name"] == "write_file"]
    program = writes[-1]["arguments"]["content"]
    spec = {"summary": "Remove duplicate rows from CSV on one or more key columns", "usage": "csv-dedup [--key COLUMN]... [--no-header] [FILE]", "examples": [NEW_EXAMPLE]}  # fmt: skip
    edit = {"path": "src/main.rs", "content": f"// improved ({secrets.token_hex(4)})\n{program}"}
    script = {
        "format": 1,
        "stages": {
            "spec": [{"tool_calls": [{"name": "submit_improvement", "arguments": spec}]}],
            "edit": [{"tool_calls": [{"name": "write_file", "arguments": edit}]}],
        },
    }
    dest.write_text(json.dumps(script))
    return dest


def improve(root: Path, env: dict[str, str], crafted_in: str) -> dict[str, Any]:
    session = improvement_session(root / crafted_in / "improve-session.json")
    argv = ["improve", "csv-dedup", REQUEST, "--model", f"scripted:{session}", "--registry", "local", "--offline"]
    (root / "improve").mkdir(exist_ok=True)
    return traced(root, "improve", [*argv, "--json"], env)


def run(with_improve: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-repeat-") as tmp:
        root = Path(tmp)
        today, _ = craft(root, "today", salt=secrets.token_hex(4), cache=False)
        shared = secrets.token_hex(4)  # the cold craft's dependency set, which the second tool and improve reuse
        cold, env = craft(root, "cold", salt=shared)
        other, _ = craft(root, "other", salt=shared, tool="csv-uniq")
        improved = improve(root, env, "cold") if with_improve else None
    runs = {"today": today, "cold": cold, "other": other, **({"improve": improved} if improved else {})}
    for figures in runs.values():
        figures.pop("result", None)
    return {
        "runs": runs,
        "ratio": round(other["raw_s"] / cold["raw_s"], 3),
        "improve_ratio": round(improved["raw_s"] / cold["raw_s"], 3) if improved else None,
        "cold_over_today": round(cold["raw_s"] / today["raw_s"], 3),
        "goal": GOAL,
    }


@dataclass(frozen=True, kw_only=True)
class RepeatRun(Attributed):
    dependency_cache: str


@dataclass(frozen=True, kw_only=True)
class RepeatResult:
    """run()'s result, as report.json holds it (runs: today, cold, other, and improve when run)."""

    runs: dict[str, RepeatRun]
    ratio: float
    improve_ratio: float | None
    cold_over_today: float
    goal: float


RESULT = RepeatResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
