"""The search benchmark runs end to end on a small generated source (figures are reported, never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_bench_search_reports_every_figure() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.perf.search", "--crates", "80", "--repeat", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    figures = json.loads(result.stdout)
    for name in ("debian", "synthetic"):
        assert {"crates", "index_build_s", "median_query_ms", "cached_load_s", "query_over_goal", "met"} <= figures[
            name
        ].keys()
    assert figures["synthetic"]["crates"] == 80 and figures["debian"]["crates"] > 100
