"""The machine a report's figures come from: CPU, cores, memory, kernel, tool versions, load."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from flakebot.cargo.runner import cargo_program


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return found.group(1).strip() if found else platform.processor() or "unknown"


def memory_gib() -> float | None:
    try:
        found = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return round(int(found.group(1)) / 2**20, 1) if found else None


def version(argv: list[str]) -> str:
    """The first line a program prints for its version, or why there is none."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc.__class__.__name__})"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else f"unavailable (exit {done.returncode})"


def load() -> list[float]:
    """1, 5 and 15 minute load averages (runnable processes; 2 means both cores of a 2-core machine busy)."""
    return [round(x, 2) for x in os.getloadavg()]


def describe() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "kernel": platform.release(),
        "os": platform.platform(terse=True),
        "python": sys.version.split()[0],
        "cargo": version([cargo_program(), "--version"]),
        "rustc": version(["rustc", "--version"]),
        "nix": version(["nix", "--version"]),
        "bwrap": version(["bwrap", "--version"]),
        "load_at_start": load(),
    }
