"""The craft summary a person reads at 80 columns: long values wrap under themselves (a hanging indent, never back at
the margin, no padding after the last word), and the `nix run` command stands whole on a line of its own, so a copy of it runs."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from flakebot.cli import display

NIX_RUN = "nix run /home/user/.local/share/flakebot/catalog/csv-dedup/0.1.0/flake#csv-dedup -- --help"


def _result() -> dict[str, Any]:
    manifest = {
        "summary": "Remove duplicate rows from a CSV file by a key column, keeping the first occurrence of each key, "
        "and report how many were dropped",
        "catalog_dir": "/home/user/.local/share/flakebot/catalog/csv-dedup/0.1.0",
        "verification_command": {"passed": True},
        "nix_run": NIX_RUN,
    }
    choice = {"crate": "csv", "mode": "fork", "reason": "the csv crate reads and writes CSV with serde, " * 2}
    return {"status": "crafted", "run_id": "r1", "from_catalog": False, "seconds": 42.0, "name": "csv-dedup",
            "version": "0.1.0", "manifest": manifest, "choice": choice, "usage": {}}  # fmt: skip


def test_the_summary_wraps_under_its_values_and_keeps_the_nix_run_line_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Console(file=io.StringIO(), width=80, color_system=None)
    monkeypatch.setattr(display, "out", lambda: screen)
    display.print_craft_result(_result(), as_json=False)
    lines = screen.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[0].startswith("✔ csv-dedup 0.1.0 Remove duplicate rows")
    assert all(line.startswith("  ") for line in lines[1:]), lines  # nothing wraps back to the margin
    assert [line.strip() for line in lines].count(NIX_RUN) == 1  # whole, on its own line
    assert all(len(line) <= 80 for line in lines if NIX_RUN not in line)
    assert all(line == line.rstrip() for line in lines), "no padding after the last word"
    started = next(i for i, line in enumerate(lines) if line.lstrip().startswith("from:"))
    column = lines[started].index("csv (fork)")
    assert lines[started + 1][:column].strip() == ""  # the reason's next line starts under its first word
