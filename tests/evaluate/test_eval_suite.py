"""The shipped suite: its shape (fast), and `flakebot eval` over all of it offline (slow): every need crafted (or
rejected) from its hand-written session, every held-out check passing on the tool Nix built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakebot.config import Settings
from flakebot.errors import UsageError
from flakebot.evaluate.suite import load_suite
from flakebot.llm.providers import check_model
from flakebot.toolspec import ToolSpec
from tests.conftest import require, run_cli

COVERED = [
    "new crate on a library (csv)",
    "fork of a real CLI crate (hexyl",
    "member of a cargo workspace",
    "two binaries",
    "add_dependency",
    "rejected",
]


def test_the_shipped_suite_has_eight_needs_each_with_a_valid_session_and_held_out_checks() -> None:
    suite = load_suite("default")
    assert len(suite.needs) >= 8
    for need in suite.needs:
        check_model(f"scripted:{need.session}", Settings())  # every turn of every session parses
        if need.expect == "crafted":
            assert len(need.heldout) >= 2, need.id
            spec = json.loads(need.session.read_text())["stages"]["spec"][0]["tool_calls"][0]["arguments"]
            seen = {json.dumps([e["args"], e.get("stdin", "")]) for e in ToolSpec.from_dict(spec).to_dict()["examples"]}
            assert not seen & {json.dumps([c.args, c.stdin]) for c in need.heldout if not c.bin}, (
                f"{need.id}: a held-out check is an acceptance example"
            )
    covers = " | ".join(c for need in suite.needs for c in need.covers)
    assert all(item in covers for item in COVERED), covers
    mistakes = " | ".join(m for need in suite.needs for m in need.mistakes)
    for mistake in ("compile error", "wrong output", "placeholder", "frozen", "does not exist"):
        assert mistake in mistakes


def test_an_unknown_need_or_suite_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no need nope"):
        load_suite("default").select(["nope"])
    with pytest.raises(UsageError, match="no suite"):
        load_suite("no-such-suite")


@pytest.mark.slow
def test_flakebot_eval_crafts_every_need_offline_and_passes_every_held_out_check(workdir: Path, tmp_path: Path) -> None:
    require("bwrap", "cargo", "nix", "git")
    result = run_cli("eval", "--out", str(tmp_path / "bench"), "--json", timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["totals"]["passed"] == report["totals"]["needs"] >= 8
    assert report["totals"]["heldout_passed"] == report["totals"]["heldout_total"] > 20
    assert json.loads((tmp_path / "bench/eval.json").read_text())["totals"] == report["totals"]
    by_id = {r["id"]: r for r in report["results"]}
    assert f"| **total: {len(by_id)}/{len(by_id)} passed**" in (tmp_path / "bench/eval.md").read_text()
    assert by_id["reject-sandwich"]["outcome"] == "rejected"
    assert_hexyl_ran_the_full_suite_only_at_the_baseline_and_before_green(
        workdir / "eval/default/hexyl-total", by_id["hexyl-total"]
    )


def assert_hexyl_ran_the_full_suite_only_at_the_baseline_and_before_green(root: Path, result: dict) -> None:
    [run_dir] = (root / "runs").iterdir()
    records = [json.loads(line) for line in (run_dir / "transcript.jsonl").read_text().splitlines()]
    runs = [(r["scope"], r["args"], r["ok"]) for r in records if r["kind"] == "cargo_test"]
    # baseline: the whole suite (acceptance red); the E0277 step: the acceptance binary only (it does not build);
    # the fix: acceptance green, then the library's and binary's unit tests, then the whole suite, green.
    assert runs == [
        ("full", [], False),
        ("acceptance", ["--test", "flakebot_acceptance"], False),
        ("acceptance", ["--test", "flakebot_acceptance"], True),
        ("affected", ["--lib", "--bins"], True),
        ("full", [], True),
    ]
    assert not any(r["kind"] == "tool_call" and r["name"] == "run_tests" for r in records)
    assert result["heldout_passed"] == result["heldout_total"] == 3 and result["iterations"] == 4
