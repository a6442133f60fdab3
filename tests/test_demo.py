"""`make demo` is one of the README's two set-up commands: its script (scripts/demo.sh, after set-up) runs as a
user runs it, with no key, so the hand-written session is replayed through the real pipeline."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REPO, require


@pytest.mark.slow
def test_the_demo_crafts_the_deduper_and_uses_it() -> None:
    require("bwrap", "cargo", "nix")
    demo = subprocess.run(
        ["bash", str(REPO / "scripts/demo.sh")], capture_output=True, text=True, timeout=900, env=dict(os.environ)
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    out = demo.stdout
    assert "replaying the hand-written session" in out and "✔ csv-dedup 0.1.0" in out
    by_name = out.split("$ flakebot run csv-dedup -- --key name demo/people.csv")[1].split("$ flakebot run")[0]
    assert by_name.split() == ["(its", "store", "path,", "in", "the", "sandbox)", "id,name,city", "1,ann,rome", "2,bob,oslo", "3,cy,lima"]  # fmt: skip
    kept = out.split("Kept for audit in ")[1].splitlines()[0]
    assert {"state.json", "manifest.json", "USAGE.md", "transcript.jsonl"} <= set(kept.split(": ", 1)[1].split())
