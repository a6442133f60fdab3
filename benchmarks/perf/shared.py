"""P10: a shared catalog's worth: machine B's time to a runnable tool that machine A crafted and published, against
A's craft of it.

Machine A crafts the hand-written csv-dedup session offline (a nonce in its spec summary, so nix really builds)
and publishes the tool to a file:// binary cache. Machine B is this machine again with an empty Nix store (its
own mount namespace with /nix a fresh tmpfs, its own catalog, cargo trapped; benchmarks/scenarios/machines.py) trusting
A's key: `flakebot craft` of the same need installs the tool from the cache. Measured: B's wall seconds for that
craft (a new process, start-up included) / A's wall seconds for its craft. Needs root (mount namespaces).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.perf.craft import NEED, REPO, _result, craft_argv, homes, session_with_nonce
from benchmarks.scenarios.machines import flakebot, on_machine_b


def run(samples: int = 1) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-shared-") as tmp:
        root = Path(tmp)
        env = {**homes(root, "a"), "PYTHONPATH": str(REPO)}
        session = session_with_nonce(root / "a" / "session.json")
        started = time.perf_counter()
        crafted = _flakebot(craft_argv(session), env, root / "a")
        a_s = time.perf_counter() - started
        published = _flakebot(["publish", crafted["name"], "--to", f"file://{root / 'cache'}", "--json"], env, root)
        catalogs = f"file://{root / 'cache'} {published['public_key']}"
        b_runs = []
        for n in range(samples):
            started = time.perf_counter()
            b = on_machine_b(root / f"b{n}", catalogs, [flakebot("craft", NEED, "--json")])
            b_runs.append(time.perf_counter() - started)
            result = _result(b.results[0].stdout, "machine B's craft")
            if result["status"] != "installed" or b.cargo_calls or any(p.endswith(".drv") for p in b.store):
                raise RuntimeError(f"machine B did not install without building: {result['status']} {b.cargo_calls}")
        b_s = min(b_runs)
        return {
            "a_craft_s": round(a_s, 3),
            "b_install_s": round(b_s, 3),
            "b_samples_s": [round(s, 3) for s in b_runs],
            "ratio": round(b_s / a_s, 4),
            "closure_paths": published["paths"],
            "closure_bytes": published["closure_size"],
            "tool": crafted["name"],
        }


def _flakebot(args: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "flakebot", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"flakebot {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return _result(done.stdout, f"flakebot {args[0]}")


@dataclass(frozen=True, kw_only=True)
class SharedResult:
    """run()'s result, as report.json holds it."""

    a_craft_s: float
    b_install_s: float
    b_samples_s: list[float]
    ratio: float
    closure_paths: int
    closure_bytes: int
    tool: str


RESULT = SharedResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
