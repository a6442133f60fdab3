"""Pieces of the edit stage's verdict, against real cargo output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from flakebot.agent.verdict import has_doctests
from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.sandbox import open_sandbox
from tests.conftest import require


@pytest.mark.parametrize(("kind", "expected"), [("--lib", True), ("--bin", False)])
def test_doc_tests_are_known_from_cargos_own_messages(tmp_path: Path, kind: str, expected: bool) -> None:
    require("cargo", "bwrap")
    subprocess.run(
        ["cargo", "init", kind, "--vcs", "none", "--name", "probe", str(tmp_path / "ws")],
        check=True,
        capture_output=True,
    )
    workspace = tmp_path / "ws"
    sandbox = open_sandbox("required", workspace=workspace, writable=[workspace, tmp_path / "target"])
    report = run_cargo(sandbox, Cargo(tmp_path / "target", offline=True), "test", cwd=workspace, extra=["--tests"])
    assert report.ok, report.summary()
    assert has_doctests(report, workspace) is expected
