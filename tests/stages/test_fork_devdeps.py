"""Fork mode over a crate whose dev-dependency the registry lacks: the acquire stage leaves it out in a
workspace commit and says which tests could not run; the acceptance tests still build and run in the sandbox,
with the tool binary's required-features turned on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git as gitpython
import pytest

from benchmarks.scenarios.gitserve import write
from flakebot.agent.acceptance import write_acceptance_test
from flakebot.agent.verdict import make_verdict
from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.request import RunRequest
from flakebot.sandbox import open_sandbox
from flakebot.stages.edit import example_runner
from flakebot.toolspec import ToolSpec
from tests.conftest import require
from tests.stages.test_acquire_stage import PIPELINE

OFFLINE = Settings(offline=True)

MANIFEST = """\
[package]
name = "devtool"
version = "0.1.0"
edition = "2021"

[features]
cli = []

[[bin]]
name = "devtool"
path = "src/main.rs"
required-features = ["cli"]

[dependencies]
anyhow = "1"

[dev-dependencies]
flakebot-no-such-crate = "1"
"""


def devtool(root: Path) -> dict[str, Any]:
    """A crate whose own integration test needs a dev-dependency no registry has, and whose binary needs --features cli."""
    write(
        root,
        {
            "Cargo.toml": MANIFEST,
            "src/main.rs": 'fn main() { println!("devtool {}", std::env::args().nth(1).unwrap_or_default()); }\n',
            "tests/own.rs": "#[test]\nfn needs_it() { flakebot_no_such_crate::go(); }\n",
        },
    )
    return CrateInfo(name="devtool", version="0.1.0", source="local", path=str(root)).to_dict()


@pytest.mark.slow
def test_acceptance_tests_run_although_a_dev_dependency_does_not_resolve(workdir: Path, tmp_path: Path) -> None:
    require("cargo", "bwrap")
    run = pipeline.start(PIPELINE, workdir, OFFLINE, RunRequest(name="devtool", start=devtool(tmp_path / "devtool")))
    out = run.output("acquire")
    assert (out["lockfile"], out["metadata_ok"], out["features"]) == ("generated", True, ["cli"])
    assert [d["name"] for d in out["dropped_dev_dependencies"]] == ["flakebot-no-such-crate"]
    assert (
        out["untested"].startswith("the crate's own tests did not run (only the acceptance tests did)")
        and "flakebot-no-such-crate" in out["untested"]
    )
    with gitpython.Repo(run.workspace) as repo:
        assert repo.head.commit.message.startswith(
            "flakebot: leave out dev-dependencies the crate source cannot satisfy (flakebot-no-such-crate)"
        )
        assert not repo.is_dirty(untracked_files=True)
    assert "flakebot-no-such-crate" not in (run.workspace / "Cargo.toml").read_text()

    examples = [
        {"args": [word], "stdout": f"devtool {word}\n", "description": f"echoes {word}"} for word in ("hi", "ho", "hum")
    ]
    spec = ToolSpec.from_dict({"name": "devtool", "summary": "echoes", "usage": "devtool WORD", "examples": examples})
    write_acceptance_test(spec, run.workspace)
    sandbox = open_sandbox("required", workspace=run.workspace, writable=[run.workspace, run.target_dir])
    cargo = Cargo.for_run(OFFLINE, run.target_dir)
    cargo.features = out["features"]

    def cargo_test(extra: list[str]) -> Any:
        return run_cargo(sandbox, cargo, "test", cwd=run.workspace, extra=extra, timeout=900)

    verdict = make_verdict(
        cargo_test, spec, run.workspace, example_runner(OFFLINE, run.target_dir), only_acceptance=True
    )()
    assert verdict.green, verdict.summary
    assert verdict.data["passed"] == 3
    everything = cargo_test(["--tests"])  # the crate's own test cannot build without what was left out
    assert not everything.ok and "flakebot_no_such_crate" in everything.summary()
