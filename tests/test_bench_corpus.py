"""P8 from the corpus benchmark's rows: the share packaged, every crate's time beside cargo's, every failure's reason."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

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


corpus_module = importlib.import_module("benchmarks.perf.corpus")

# Stanzas as `apt-cache dumpavail` prints them (fields trimmed): a crate Debian ships as a program (hexyl), one whose
# program is named otherwise and comes with a shared library (rav1e: rav1e, librav1e0), a library crate (serde), a
# source building only -dev and -doc packages (itoa), and a program from a source of its own name (rsass).
DUMPAVAIL = """Package: hexyl
Source: rust-hexyl (0.8.0-2)
Installed-Size: 900

Package: librust-hexyl-dev
Source: rust-hexyl
Installed-Size: 105

Package: librust-serde-dev
Source: rust-serde
Installed-Size: 400

Package: librav1e0
Source: rust-rav1e
Installed-Size: 3000

Package: rav1e
Source: rust-rav1e
Installed-Size: 5000

Package: librust-rav1e-dev
Source: rust-rav1e
Installed-Size: 7436

Package: librust-itoa-dev
Source: rust-itoa
Installed-Size: 50

Package: itoa-doc
Source: rust-itoa
Installed-Size: 10

Package: rsass
Installed-Size: 2000

Package: librust-rsass-dev
Source: rsass
Installed-Size: 6056
"""


def test_the_corpus_rule_takes_crates_debian_ships_as_programs_small_first() -> None:
    assert corpus_module.program_crates(DUMPAVAIL) == ["hexyl", "rsass", "rav1e"]


def test_the_corpus_is_the_rule_over_this_machines_package_lists() -> None:
    """Debian bookworm's lists give exactly the 30 crates of CORPUS (the 16 of the first corpus among them)."""
    import subprocess

    listed = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=False).stdout
    if "librust-hexyl-dev" not in listed:
        pytest.skip("apt's package lists are not here: run 'apt-get update'")
    assert corpus_module.program_crates(listed) == list(corpus_module.CORPUS)
    first = {"hexyl", "dotenv", "lscolors", "sha1collisiondetection", "cargo-lock", "git-absorb", "pleaser", "cbindgen"}
    first |= {"lalrpop", "bat", "sniffglue", "bindgen", "grcov", "rav1e", "sequoia-sop", "cargo-c"}
    assert len(corpus_module.CORPUS) >= 30 and first <= set(corpus_module.CORPUS)


def test_p8_is_packaged_over_what_plain_cargo_builds_with_the_raw_count_beside() -> None:
    usage_level = {**PACKAGED, "crate": "cargo-lock", "smoke": "cargo-lock --help", "smoke_level": "usage"}
    usage_level["smoke_exit_code"] = 1
    plain_only = {**FAILED, "crate": "grcov", "outside_flakebot": False, "cargo_build_release_s": 40.0}
    result = corpus_module.summary([PACKAGED, usage_level, FAILED, plain_only])
    assert (result["packaged"], result["buildable"], result["total"]) == (2, 3, 4)
    assert (result["share_of_buildable_percent"], result["share_percent"]) == (66.7, 50.0)
    f = figures.corpus_share({"corpus": perf.bench("corpus").load(result)})
    assert f["value"] == 66.7 and figures.goal_text(f) == ">= 95 %"
    assert f["measured"].startswith("2 of the 3 that plain `cargo build --release` builds (raw: 2 of 4) binary crates")
    assert "cargo-lock 0.24.3: packaged and smoke level usage (`cargo-lock --help` exits 1)" in f["measured"]


def test_a_rows_file_joins_the_report_as_p8_one_row_per_crate_the_latest(tmp_path: Path) -> None:
    """A separate corpus run's rows replace P8 in a copy of the published report; a crate measured again counts once,
    by its latest row, and the report says when and at which commits the rows were measured."""
    import json
    import shutil

    report = importlib.import_module("benchmarks.perf.report")
    shutil.copy(Path(report.REPO) / "bench" / "report.json", tmp_path / "report.json")
    before = json.loads((tmp_path / "report.json").read_text())

    def stamped(row: dict[str, Any], at: str, code: str) -> dict[str, Any]:
        return {**row, "measured": {"at": at, "load_before": 1.5, "load_after": 2.5, "code": code}}

    first_try = stamped({**FAILED, "crate": "cbindgen", "outside_flakebot": False}, "2026-11-25T10:00:00Z", "aaa1111")
    rows = [
        first_try,
        stamped(FAILED, "2026-11-25T10:05:00Z", "aaa1111"),
        stamped(PACKAGED, "2026-11-25T11:00:00Z", "bbb2222"),
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    report.join_corpus(tmp_path / "report.json", tmp_path / "rows.jsonl")

    after = json.loads((tmp_path / "report.json").read_text())
    corpus = after["results"]["corpus"]
    assert [row["crate"] for row in corpus["crates"]] == ["cbindgen", "bat"]  # CORPUS order, cbindgen's latest row
    assert (corpus["packaged"], corpus["buildable"], corpus["total"]) == (1, 1, 2)
    assert "from 2026-11-25T10:05:00Z to 2026-11-25T11:00:00Z" in corpus["note"]
    assert "aaa1111: bat; bbb2222: cbindgen" in corpus["note"]
    assert (
        "corpus (P8) from `python -m benchmarks.perf.corpus --rows` runs from 2026-11-25T10:05:00Z" in after["merged"]
    )
    assert after["merged"].count("corpus (P8) from") == 1 and after["merged"].count("P8's note says how") == 1
    p8 = next(f for f in after["figures"] if f["id"] == "P8")
    assert p8["value"] == 100.0 and "aaa1111: bat" in p8["measured"]
    # every other section's measurements are the published ones
    assert {k: v for k, v in after["results"].items() if k != "corpus"} == {
        k: v for k, v in before["results"].items() if k != "corpus"
    }
    assert "| P8 |" in (tmp_path / "report.md").read_text()


def test_a_plain_build_of_a_library_only_crate_builds_no_binary(tmp_path: Path) -> None:
    """The registry's rsass 0.27.0 is the library alone (no src/main.rs, no [[bin]]): plain cargo builds it, but no
    binary, so it does not count among the binary crates plain cargo builds."""
    import subprocess

    for kind, path, body in (("lib", "src/lib.rs", "pub fn f() {}\n"), ("bin", "src/main.rs", "fn main() {}\n")):
        crate = tmp_path / kind
        (crate / "src").mkdir(parents=True)
        (crate / "Cargo.toml").write_text(f'[package]\nname = "only-{kind}"\nversion = "0.1.0"\nedition = "2021"\n')
        (crate / path).write_text(body)
        target = tmp_path / f"{kind}-target"
        subprocess.run(
            ["cargo", "build", "--release", "--offline", "--quiet", "--target-dir", str(target)], cwd=crate, check=True
        )
    assert corpus_module._built_programs(tmp_path / "lib-target" / "release") == []
    assert corpus_module._built_programs(tmp_path / "bin-target" / "release") == ["only-bin"]


def test_the_plain_build_of_a_failed_crate_leaves_out_the_dev_dependencies_the_registry_lacks(tmp_path: Path) -> None:
    """Debian's difference 2.0.0 names dev-dependencies its registry lacks (quickcheck 0.4, term 0.2): plain cargo
    would stop at resolving them. Left out as flakebot leaves them, the build gets to compiling, and fails on what
    it really fails on: its own #![deny(warnings)] meeting rustc's newer lints."""
    settings = corpus_module.scratch_settings(tmp_path)
    try:
        from flakebot.crates.registries import local_registry

        local_registry(settings).get("difference")
    except Exception:  # noqa: BLE001 - any lookup failure means the crate is not installed here
        pytest.skip("Debian's librust-difference-dev is not installed (make bench-setup)")
    row = corpus_module._cargo_build("difference", {"packaged": False}, settings, tmp_path)
    assert row["cargo_dropped_dev_dependencies"] == ["quickcheck", "term"]
    assert row["cargo_build_release_s"] is None and "cfg" in row["cargo_error"]


def test_another_runs_sections_join_the_report_and_the_note_names_that_run(tmp_path: Path) -> None:
    """`report.py --rerender REPORT --join RUN`: the sections RUN measured replace the report's own (results and
    their loads), the rest stay as measured, and the note on joined runs names RUN's time, machine and load."""
    import json
    import shutil

    report = importlib.import_module("benchmarks.perf.report")
    shutil.copy(Path(report.REPO) / "bench" / "report.json", tmp_path / "report.json")
    before = json.loads((tmp_path / "report.json").read_text())
    run = json.loads(json.dumps(before))
    run["results"] = {"loop": before["results"]["loop"]}
    run["results"]["loop"]["ratio"] = before["results"]["loop"]["ratio"] + 0.5  # a different measurement
    run["benchmarks"] = {"loop": {**before["benchmarks"]["loop"], "load_before": 9.5}}
    run["generated"], run["machine"] = "2026-11-25T15:00:00Z", {**before["machine"], "cpu": "Some CPU", "cores": 2}
    (tmp_path / "run.json").write_text(json.dumps(run))
    report.join_sections(tmp_path / "report.json", tmp_path / "run.json")

    after = json.loads((tmp_path / "report.json").read_text())
    assert after["results"]["loop"] == run["results"]["loop"] and after["benchmarks"]["loop"]["load_before"] == 9.5
    assert {k: v for k, v in after["results"].items() if k != "loop"} == {
        k: v for k, v in before["results"].items() if k != "loop"
    }
    assert (
        "loop from `--only loop` at 2026-11-25T15:00:00Z on Some CPU (2 cores, load 9.5 at its start)."
        in after["merged"]
    )
    assert after["merged"].count("Each figure is a ratio or a difference within one run.") == 1
    assert "loop from" in (tmp_path / "report.md").read_text()
