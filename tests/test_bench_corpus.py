"""P8 from the corpus benchmark's rows: the share packaged, every crate's time beside cargo's, every failure's reason."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

figures = importlib.import_module("benchmarks.perf.figures")
perf = importlib.import_module("benchmarks.perf")
chart = importlib.import_module("benchmarks.perf.chart")

PACKAGED = {
    "crate": "cbindgen",
    "packaged": True,
    "package_s": 80.2,
    "nix_build_s": 60.1,
    "version": "0.24.3",
    "binary": "cbindgen",
    "smoke": "cbindgen --help",
    "notices": [],
    "native_inputs": {"because": {"zlib": ["build log: Package zlib was not found in the pkg-config search path."]}},
    "build_features": ["clap"],
    "dropped_dev_dependencies": ["serial_test"],
    "cargo_build_release_s": 55.0,
}
FAILED = {
    "crate": "bat",
    "packaged": False,
    "package_s": 10.0,
    "reason": "[package] nix build of bat failed: boom",
    "cargo_error": "error: boom",
    "outside_flakebot": True,
    "inputs": {"declared": ["zlib"], "from_evidence": [], "missing": ["libfoo"]},
}


def corpus(*rows: dict[str, Any]) -> dict[str, Any]:
    packaged = sum(1 for r in rows if r["packaged"])
    result = {
        "crates": list(rows),
        "packaged": packaged,
        "total": len(rows),
        "share_percent": 100.0 * packaged / len(rows),
        "goal_percent": 100.0,
    }
    return {"corpus": perf.bench("corpus").load(result)}


def test_p8_lists_each_crate_with_cargos_time_and_each_failure_with_its_reason() -> None:
    f = figures.corpus_share(corpus(PACKAGED, FAILED))
    assert (f["id"], f["value"], f["met"], figures.goal_text(f)) == ("P8", 50.0, False, ">= 100 %")
    assert (
        "cbindgen 0.24.3: packaged and `cbindgen --help` exits 0 in 80 s (nix build 60 s) against `cargo build --release` 55 s"
        in f["measured"]
    )
    assert (
        "features clap turned on; dev-dependencies left out: serial_test; zlib added from the build log"
        in f["measured"]
    )
    assert f["gap"].startswith(
        "Not packaged: bat: **not packaged** after 10 s: [package] nix build of bat failed: boom (cargo build "
        "--release: fails (error: boom); outside flakebot: plain cargo fails too; inputs declared: zlib; missing: libfoo)"
    )


def test_a_full_corpus_meets_p8_and_the_chart_draws_it(tmp_path: Path) -> None:
    f = figures.corpus_share(corpus(PACKAGED))
    assert (f["value"], f["met"], f["gap"]) == (100.0, True, "")
    machine = {"cpu": "cpu", "cores": 2, "memory_gib": 4}
    chart.draw(
        {"figures": [f], "results": {}, "machine": machine, "generated": "2026-01-01T00:00:00Z"}, tmp_path / "chart.png"
    )
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
