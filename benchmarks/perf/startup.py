"""P7: CLI start-up. `flakebot --help`, `runs` and `config show` against a bare `python -c pass`.

The commands are timed in interleaved rounds (each round runs every command once), so a burst of other work on a
shared machine hits them alike. Wall seconds are the figure; CPU seconds (user + system of the process) are set
beside them, since they hardly move with the machine's load: wall well above CPU means waiting for a core.
What `--help` imports is profiled once with `python -X importtime` (which slows imports a little; the shares hold).
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMMANDS = {"--help": ["--help"], "runs": ["runs"], "config show": ["config", "show"]}
GOAL_SECONDS = 0.5  # I2's goal; P7 asks 0.3 for --help alone


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _once(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one run."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
    return time.perf_counter() - start, _children_cpu() - cpu


def import_profile(cwd: Path, top: int = 6) -> dict[str, Any]:
    """Seconds `flakebot --help` spends importing, and the top-level imports that take most of it."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flakebot", "--help"],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    modules: dict[str, float] = {}
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        # one space: a top-level import
        if len(parts) == 3 and parts[1].strip().isdigit() and not parts[2].startswith("  "):
            modules[parts[2].strip()] = int(parts[1]) / 1e6
    ranked = sorted(modules.items(), key=lambda kv: -kv[1])[:top]
    return {"imports_s": round(sum(modules.values()), 4), "top_imports_s": {name: round(s, 4) for name, s in ranked}}


def run(repeat: int = 7) -> dict[str, Any]:
    argvs = {
        "python": [sys.executable, "-c", "pass"],
        **{name: [sys.executable, "-m", "flakebot", *args] for name, args in COMMANDS.items()},
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in argvs}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeat):
            for name, argv in argvs.items():
                samples[name].append(_once(argv, Path(tmp)))
        imports = import_profile(Path(tmp))
    wall = {name: statistics.median(w for w, _ in runs) for name, runs in samples.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in samples.items()}
    python = wall.pop("python")
    return {
        "python_startup_s": round(python, 4),
        "python_cpu_s": round(cpu.pop("python"), 4),
        "commands_s": {k: round(v, 4) for k, v in wall.items()},
        "commands_cpu_s": {k: round(v, 4) for k, v in cpu.items()},
        "commands_min_s": {k: round(min(w for w, _ in samples[k]), 4) for k in COMMANDS},
        "overhead_over_python_s": {k: round(v - python, 4) for k, v in wall.items()},
        "goal_s": GOAL_SECONDS,
        "met": all(v < GOAL_SECONDS for v in wall.values()),
        "help_under_0_3_s": wall["--help"] < 0.3,
        "help_imports": imports,
    }


@dataclass(frozen=True, kw_only=True)
class HelpImports:
    imports_s: float
    top_imports_s: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class StartupResult:
    """run()'s result, as report.json holds it (commands by their arguments: --help, runs, config show)."""

    python_startup_s: float
    python_cpu_s: float
    commands_s: dict[str, float]
    commands_cpu_s: dict[str, float]
    commands_min_s: dict[str, float]
    overhead_over_python_s: dict[str, float]
    goal_s: float
    met: bool
    help_under_0_3_s: bool
    help_imports: HelpImports


RESULT = StartupResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
