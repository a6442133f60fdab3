"""Held-out checks: cases the model never saw, run on the built tool (its Nix store path) in the sandbox."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.evaluate.suite import Check
from flakebot.sandbox import open_sandbox

logger = logging.getLogger(__name__)


def run_checks(checks: list[Check], bin_dir: Path, main_program: str, settings: Settings) -> list[dict[str, Any]]:
    """Each check's outcome: what ran, what came out, and whether it matched."""
    return [run_check(check, bin_dir, main_program, settings) for check in checks]


def run_check(check: Check, bin_dir: Path, main_program: str, settings: Settings) -> dict[str, Any]:
    binary = bin_dir / (check.bin or main_program)
    with tempfile.TemporaryDirectory(prefix="flakebot-heldout-") as tmp:
        cwd = Path(tmp)
        for name, content in check.files.items():
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).write_text(content)
        sandbox = open_sandbox(
            settings.sandbox, workspace=cwd, writable=[cwd], timeout=settings.smoke_timeout, adopt=True
        )
        result = sandbox.run([str(binary), *check.args], cwd=cwd, stdin=check.stdin, timeout=settings.smoke_timeout)
    passed = result.stdout == check.stdout and result.returncode == check.exit_code
    if not passed:
        logger.info("held-out check failed: %s %s (exit %s)", binary.name, check.args, result.returncode)
    return {
        "description": check.description,
        "bin": binary.name,
        "args": check.args,
        "passed": passed,
        "exit_code": result.returncode,
        "expected_exit_code": check.exit_code,
        "stdout": result.stdout[:2000],
        "expected_stdout": check.stdout[:2000],
        "stderr": result.stderr[-1000:],
    }
