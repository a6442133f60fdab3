"""P7: CLI start-up. `flakebot --help`, `runs` and `config show` against a bare `python -c pass`."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

COMMANDS = {"--help": ["--help"], "runs": ["runs"], "config show": ["config", "show"]}
GOAL_SECONDS = 0.5  # issue 2; issue 8's P7 asks 0.3 for --help


def _time(argv: list[str], cwd: Path, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(repeat: int = 7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        python = _time([sys.executable, "-c", "pass"], cwd, repeat)
        figures = {name: _time([sys.executable, "-m", "flakebot", *args], cwd, repeat) for name, args in COMMANDS.items()}
    return {
        "python_startup_s": round(python, 4),
        "commands_s": {k: round(v, 4) for k, v in figures.items()},
        "overhead_over_python_s": {k: round(v - python, 4) for k, v in figures.items()},
        "goal_s": GOAL_SECONDS,
        "met": all(v < GOAL_SECONDS for v in figures.values()),
        "help_under_0_3_s": figures["--help"] < 0.3,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
