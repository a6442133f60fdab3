"""The edit loop end to end: `flakebot craft --stop-after edit` with scripted models behind the stub
server (the real openai or groq SDK, as each script names), real cargo in real bubblewrap, on crates from Debian's registry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, write_file
from flakebot.errors import BudgetExceeded, EditError, SpecError
from flakebot.pipeline.run import Run, list_runs
from tests.conftest import REPO, require, run_cli

BROKEN_RS = 'fn main() {\n    print!("{}", shouted_text);\n}\n'


def craft(
    tmp: Path,
    edit_turns: list[dict[str, Any]],
    *extra: str,
    spec: dict[str, Any] | None = None,
    crate: str = "csv",
    mode: str = "new",
):
    """Run the real CLI up to the edit stage with a scripted edit session."""
    require("bwrap", "cargo")
    script = tmp / "script.json"
    script.write_text(json.dumps({"format": 1, "stages": {"edit": edit_turns}}))
    spec_file = tmp / "spec.json"
    spec_file.write_text(json.dumps(spec or SHOUT_SPEC))
    args = [
        "craft",
        "need something",
        "--model",
        f"scripted:{script}",
        "--spec",
        str(spec_file),
        "--crate",
        crate,
        "--mode",
        mode,
    ]
    return run_cli(*args, "--registry", "local", "--offline", "--stop-after", "edit", "--keep", "--json", *extra)


def only_run(workdir: Path) -> Run:
    runs = list_runs(workdir)
    assert len(runs) == 1
    return runs[0]


@pytest.mark.slow
def test_scripted_session_turns_csv_into_csv_dedup(workdir: Path) -> None:
    """The demo's hand-written session: spec, choice and edits all come from the model script."""
    require("bwrap", "cargo")
    session = REPO / "flakebot/data/sessions/csv-dedup.json"
    result = run_cli(
        "craft",
        "need a CSV deduper",
        "--model",
        f"scripted:{session}",
        "--registry",
        "local",
        "--offline",
        "--stop-after",
        "edit",
        "--keep",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    run = only_run(workdir)
    edit = run.output("edit")
    assert edit["status"] == "green" and edit["iterations"] == 2
    assert run.output("choose")["crate"]["name"] == "csv" and run.output("choose")["mode"] == "new"
    assert run.state["settings"]["registry"] == "local"  # pinned by search for every later cargo call
    progress = [json.loads(line) for line in result.stdout.splitlines() if '"progress"' in line]
    assert "iteration 1 of 30: 3 passing, 2 failing (4,414 tokens)" in [p["message"] for p in progress]
    # flakebot's own verdict, re-run here with plain cargo: the acceptance tests pass in the workspace.
    log = (run.dir / "edit.json").read_text()
    assert json.loads(log)["verdict"]["acceptance_missing"] == []
    assert (run.workspace / "tests/flakebot_acceptance.rs").is_file()


@pytest.mark.slow
def test_compile_error_reaches_the_model_and_is_fixed(workdir: Path, tmp_path: Path) -> None:
    turns = [
        {"tool_calls": [write_file("src/main.rs", BROKEN_RS)]},
        {"expect": {"last_user_contains": "error[E0425]"}, "tool_calls": [write_file("src/main.rs", SHOUT_RS)]},
    ]
    result = craft(tmp_path, turns)
    assert result.returncode == 0, result.stderr
    run = only_run(workdir)
    assert run.output("edit")["iterations"] == 2
    transcript = [json.loads(line) for line in run.transcript_path.read_text().splitlines()]
    verdicts = [t for t in transcript if t["kind"] == "verdict"]
    assert [v["green"] for v in verdicts] == [False, True]
    assert verdicts[0]["failures"] >= 10_000  # a crate that does not compile counts as worst


@pytest.mark.slow
def test_edit_to_the_frozen_acceptance_test_is_reverted(workdir: Path, tmp_path: Path) -> None:
    cheat = "#[test]\nfn nothing() {}\n"
    turns = [
        {"tool_calls": [write_file("tests/flakebot_acceptance.rs", cheat)]},
        {
            "expect": {"last_tool_result_contains": "tests/flakebot_acceptance.rs is frozen"},
            "tool_calls": [write_file("src/main.rs", SHOUT_RS)],
        },
    ]
    result = craft(tmp_path, turns)
    assert result.returncode == 0, result.stderr
    run = only_run(workdir)
    assert "example_1_upper_cases_a_line" in (run.workspace / "tests/flakebot_acceptance.rs").read_text()


@pytest.mark.slow
def test_repeating_the_same_edit_stops_the_loop(workdir: Path, tmp_path: Path) -> None:
    same = {"tool_calls": [write_file("src/main.rs", BROKEN_RS)]}
    result = craft(tmp_path, [same, same, same, same])
    assert result.returncode == EditError.exit_code
    assert "loop_detected" in result.stderr and "3 times in a row" in result.stderr
    run = only_run(workdir)
    assert run.state["stages"]["edit"]["error"]["details"]["status"] == "loop_detected"


@pytest.mark.slow
def test_exhausted_token_budget_stops_with_its_status(workdir: Path, tmp_path: Path) -> None:
    turn = {
        "tool_calls": [write_file("src/main.rs", BROKEN_RS)],
        "usage": {"prompt_tokens": 600, "completion_tokens": 100},
    }
    result = craft(tmp_path, [turn, turn, turn], "--max-tokens", "1000")
    assert result.returncode == BudgetExceeded.exit_code
    run = only_run(workdir)
    error = run.state["stages"]["edit"]["error"]
    assert error["details"]["status"] == "budget" and "token budget spent" in error["message"]
    assert run.state["usage"]["prompt_tokens"] == 1200


@pytest.mark.slow
def test_nonsensical_need_fails_cleanly_with_the_models_explanation(workdir: Path, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    reason = "'purple monkey dishwasher' does not describe anything a program could do"
    script.write_text(
        json.dumps(
            {
                "format": 1,
                "stages": {"spec": [{"tool_calls": [{"name": "reject_need", "arguments": {"reason": reason}}]}]},
            }
        )
    )
    result = run_cli(
        "craft", "purple monkey dishwasher", "--model", f"scripted:{script}", "--registry", "local", "--offline"
    )
    assert result.returncode == SpecError.exit_code
    assert reason in result.stderr and "Traceback" not in result.stderr
    run = only_run(workdir)
    assert run.state["status"] == "failed" and run.stage_status("clean") == "finished"
    assert sorted(p.name for p in run.dir.iterdir()) == [
        ".lock",
        "events.jsonl",
        "run.log",
        "state.json",
        "transcript.jsonl",
    ]
