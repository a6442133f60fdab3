"""make test's slice of the P8 corpus (make bench runs it whole): hexyl, and cbindgen, whose dev-dependency
serial_test is not in Debian's registry and whose binary needs --features clap. Both through `flakebot package`
(the library API) as the benchmark runs them, without the benchmark's plain cargo build beside each."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.conftest import DEBIAN_REGISTRY, REPO

bench_corpus = importlib.import_module("benchmarks.perf.corpus")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hexyl", "cbindgen"])
def test_corpus_crate_is_packaged_and_smoke_runs(name: str, tmp_path: Path) -> None:
    assert any(DEBIAN_REGISTRY.glob(f"{name}-*")), f"{name} is not in Debian's registry: run 'make setup'"
    settings = bench_corpus.scratch_settings(tmp_path)
    row = bench_corpus.package_one(name, settings, fresh=False)  # a repeat finds the earlier build in the store
    assert row["packaged"], row.get("reason")
    assert row["smoke"] == f"{row['binary']} --help"
    if name == "cbindgen":
        assert row["dropped_dev_dependencies"] == ["serial_test"] and row["build_features"] == ["clap"]
        assert any(
            n.startswith(
                "dev-dependency serial_test (Cargo.toml) left out: no matching package named `serial_test` found"
            )
            for n in row["notices"]
        )
        assert "cbindgen needs --features clap: turned on (buildFeatures)" in row["notices"]


def test_bench_setup_installs_exactly_the_corpus() -> None:
    script = (REPO / "scripts/bench-setup.sh").read_text()
    listed = re.findall(r"librust-([a-z0-9-]+)-dev", script)
    assert listed == [name.replace("_", "-") for name in bench_corpus.CORPUS]


@pytest.mark.slow
def test_a_corpus_crate_without_help_or_usage_is_packaged_at_level_runs(tmp_path: Path) -> None:
    """xml-rs 0.8.3's xml-analyze takes `--help` for a file it cannot open ("Cannot open input file"); given an
    empty file it parses it ("no root element found"): it runs, at level runs, where it was refused before."""
    assert any(DEBIAN_REGISTRY.glob("xml-rs-*")), "xml-rs is not in Debian's registry: run 'make bench-setup'"
    settings = bench_corpus.scratch_settings(tmp_path)
    row = bench_corpus.package_one("xml-rs", settings, fresh=False)
    assert row["packaged"], row.get("reason")
    assert (row["smoke_level"], row["smoke"], row["smoke_exit_code"]) == ("runs", "xml-analyze empty-input", 1)
