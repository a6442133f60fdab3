"""Spec disputes end to end: the edit model calls dispute_example, the spec model (stage "dispute" of the same
script, through the stub server and the real SDK) confirms or corrects the example, flakebot re-freezes the test."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, write_file
from flakebot.pipeline.run import list_runs
from tests.conftest import require, run_cli

RIGHT = {"description": "keeps lines apart", "args": [], "stdin": "a\nb\n", "stdout": "A\nB\n", "exit_code": 0}


def dispute(n: int, reason: str) -> dict[str, Any]:
    return {"name": "dispute_example", "arguments": {"n": n, "reason": reason}}


def craft(tmp: Path, spec: dict[str, Any], stages: dict[str, Any], *extra: str) -> Any:
    require("bwrap", "cargo")
    (tmp / "script.json").write_text(json.dumps({"format": 1, "stages": stages}))
    (tmp / "spec.json").write_text(json.dumps(spec))
    args = [
        "--model",
        f"scripted:{tmp / 'script.json'}",
        "--spec",
        str(tmp / "spec.json"),
        "--crate",
        "csv",
        "--mode",
        "new",
    ]
    return run_cli("craft", "upper-case my input", *args, "--registry", "local", "--offline", "--json", *extra)


@pytest.mark.slow
def test_a_disputed_wrong_example_is_corrected_refrozen_and_listed_in_usage(workdir: Path, tmp_path: Path) -> None:
    require("nix")
    wrong = copy.deepcopy(SHOUT_SPEC)
    wrong["examples"][1]["stdout"] = "A\nb\n"  # contradicts "upper-case standard input"
    reason = "example 2 leaves the second line lower-case, but the tool upper-cases all of its input"
    stages = {
        "edit": [
            {"tool_calls": [write_file("src/main.rs", SHOUT_RS)]},
            {
                "expect": {"last_user_contains": "example_2_keeps_lines_apart"},
                "tool_calls": [dispute(2, reason), {"name": "done", "arguments": {"summary": "s"}}],
            },
        ],
        "dispute": [
            {
                "expect": {"last_user_contains": "disputes example 2"},
                "tool_calls": [{"name": "correct_example", "arguments": {"example": RIGHT, "reason": "a typo"}}],
            }
        ],
    }
    result = craft(tmp_path, wrong, stages)
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = list_runs(workdir)
    [entry] = run.output("edit")["disputes"]
    assert (entry["n"], entry["outcome"], entry["old"]["stdout"], entry["new"]["stdout"]) == (
        2,
        "corrected",
        "A\nb\n",
        "A\nB\n",
    )
    # the edit stage's output holds the corrected examples; the spec stage's own output is left as it was
    assert run.output("edit")["examples"][1]["stdout"] == "A\nB\n"
    assert run.output("spec")["examples"][1]["stdout"] == "A\nb\n"
    manifest = json.loads((run.dir / "manifest.json").read_text())
    assert manifest["corrected_examples"][0]["n"] == 2 and all(e["passed"] for e in manifest["examples"])
    usage = (run.dir / "USAGE.md").read_text()
    assert "## Corrected examples" in usage and reason in usage
    records = [json.loads(line) for line in run.transcript_path.read_text().splitlines()]
    assert [r.get("stage") for r in records if r["kind"] == "model_reply"].count("dispute") == 1


@pytest.mark.slow
def test_a_dispute_the_spec_model_rejects_leaves_the_example(workdir: Path, tmp_path: Path) -> None:
    stages = {
        "edit": [
            {"tool_calls": [dispute(1, "upper-casing is hard; the output should equal the input")]},
            {
                "expect": {"last_tool_result_contains": "example 1 stands"},
                "tool_calls": [write_file("src/main.rs", SHOUT_RS)],
            },
        ],
        "dispute": [{"tool_calls": [{"name": "confirm_example", "arguments": {"reason": "the need says upper-case"}}]}],
    }
    result = craft(tmp_path, SHOUT_SPEC, stages, "--stop-after", "edit", "--keep")
    assert result.returncode == 0, result.stderr[-3000:]
    [run] = list_runs(workdir)
    assert [d["outcome"] for d in run.output("edit")["disputes"]] == ["confirmed"]
    assert [e["stdout"] for e in run.output("spec")["examples"]] == [e["stdout"] for e in SHOUT_SPEC["examples"]]
    assert run.output("edit")["examples"] == []
    assert '"HI\\n"' in (run.workspace / "tests/flakebot_acceptance.rs").read_text()
