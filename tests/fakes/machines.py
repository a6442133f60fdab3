"""Machine B (benchmarks.scenarios.machines) with the tests' registry."""

from __future__ import annotations

from pathlib import Path

from benchmarks.scenarios import machines
from benchmarks.scenarios.machines import MachineB, Step, flakebot
from tests.fakes.registry import registry_for_tests

__all__ = ["MachineB", "Step", "flakebot", "machine_env", "on_machine_b"]


def machine_env(home: Path, **extra: str) -> dict[str, str]:
    return machines.machine_env(home, registry_for_tests(), **extra)


def on_machine_b(home: Path, catalogs: str, steps: list[machines.Step], timeout: float = 600) -> machines.MachineB:
    return machines.on_machine_b(home, catalogs, steps, timeout, registry_for_tests())
