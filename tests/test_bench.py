"""`python -m benchmarks` (make bench): the report is generated end to end (a quick profile), the README section is rewritten in
place, and the pieces the published figures rest on (process classification, interval accounting, the loop
benchmark) do what the report says they do. Speed itself is never asserted."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flakebot.cargo.runner import Cargo
from flakebot.errors import UsageError
from flakebot.sandbox import BwrapSandbox, open_sandbox
from tests.conftest import REPO, require

bench = importlib.import_module("benchmarks.__main__")
perf = importlib.import_module("benchmarks.perf")
RecordError = importlib.import_module("benchmarks.records").RecordError
report = importlib.import_module("benchmarks.perf.report")
bench_craft = importlib.import_module("benchmarks.perf.craft")
bench_loop = importlib.import_module("benchmarks.perf.loop")
classify = importlib.import_module("benchmarks.perf.proctrace").classify


def run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_quick_bench_writes_report_json_markdown_and_chart(tmp_path: Path) -> None:
    """`python -m benchmarks --quick`, as make bench runs it from the checkout, writes all three files."""
    result = run_benchmarks("--quick", "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout.splitlines()[-1])
    data = json.loads((tmp_path / "out/report.json").read_text())
    assert printed["figures"] == data["figures"]
    assert data["profile"] == "quick" and data["machine"]["cores"] >= 1 and "cargo" in data["machine"]["cargo"]
    assert [f["id"] for f in data["figures"]] == ["P4a", "P4b", "P4c", "P7", "I2", "P15", "P15-10k", "P16"]
    for figure in data["figures"]:
        assert figure["value"] > 0 and figure["measured"]
        assert (figure["met"] is None) == (figure["goal"] is None)
        assert figure["gap"] == "" or figure["met"] is False  # a gap is stated exactly when a goal is missed
    assert data["results"]["search"]["synthetic"]["crates"] == 300
    markdown = (tmp_path / "out/report.md").read_text()
    assert data["machine"]["cpu"] in markdown and all(f"| {f['id']} |" in markdown for f in data["figures"])
    assert (tmp_path / "out/stages.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "out/report.md").unlink()
    report.rerender(tmp_path / "out/report.json")  # the same results written again: same figures, same text
    assert json.loads((tmp_path / "out/report.json").read_text())["figures"] == data["figures"]
    assert (tmp_path / "out/report.md").read_text() == markdown


def test_readme_performance_section_is_rewritten_between_the_markers(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# tool\n\nintro\n")
    first = bench.run(profile="quick", only=["startup"], out_dir=tmp_path / "out", readme=readme)
    text = readme.read_text()
    assert text.startswith("# tool\n\nintro\n\n## Performance\n") and text.count(report.START) == 1
    assert (
        f"| P7 | CLI start-up: flakebot --help, over a bare `python -c pass` | {report.value_text(first['report']['figures'][0])} |"
        in text
    )
    readme.write_text(text.replace("intro", "intro, edited by hand") + "\n## Licence\n\nMIT\n")
    report.update_readme(readme, json.loads((tmp_path / "out/report.json").read_text()))
    again = readme.read_text()
    assert again.count("## Performance") == 1 and again.count(report.START) == 1 and again.count(report.END) == 1
    assert "intro, edited by hand" in again and again.endswith("## Licence\n\nMIT\n")


def test_the_project_readme_quotes_the_headline_figures_of_the_report_it_was_given(tmp_path: Path) -> None:
    """The front page's headline lines (P14 and its kin, in plain words) come from the same report.json as
    docs/performance.md."""
    from benchmarks.readme import markers

    start, end = markers("bench-headline")
    (tmp_path / "docs").mkdir()
    page, front = tmp_path / "docs/performance.md", tmp_path / "README.md"
    page.write_text("# Performance\n")
    front.write_text(f"# tool\n\n{start}\nold lines\n{end}\n\n## After\n")
    data = json.loads((REPO / "bench/report.json").read_text())
    report.update_readme(page, data)
    text = front.read_text()
    figures = {f["id"]: f for f in data["figures"]}
    for name, words in report.HEADLINE.items():
        f = figures[name]
        assert f"- {words}: **{report.number(f['value'], f['unit'])}** (goal {report.goal_text(f)}, " in text
    crossing = {**figures["P14"], "met": True, "tells": False, "spread": {"min": 0.9, "max": 1.4, "n": 3}}
    assert report._verdict(crossing) == "its repeats span 0.9x-1.4x"  # not "met": the run cannot tell
    assert "old lines" not in text and text.endswith(f"{end}\n\n## After\n")
    assert report.START in page.read_text()


def test_the_readme_eval_table_is_the_one_eval_wrote(tmp_path: Path) -> None:
    from benchmarks import eval_readme
    from benchmarks.readme import markers

    start, end = markers("eval")
    readme, eval_md = tmp_path / "README.md", tmp_path / "eval.md"
    readme.write_text(f"# tool\n\n{start}\n| old | row |\n{end}\n\n## After\n")
    eval_md.write_text(
        "# flakebot eval\n\n| need | outcome |\n| --- | --- |\n| ✔ a | crafted |\n\nHeld-out checks ...\n"
    )
    eval_readme.update_readme(readme, eval_md)
    assert readme.read_text() == (
        f"# tool\n\n{start}\n| need | outcome |\n| --- | --- |\n| ✔ a | crafted |\n{end}\n\n## After\n"
    )
    readme.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="has no <!-- eval:start -->"):
        eval_readme.update_readme(readme, eval_md)


def test_a_section_result_is_typed_when_loaded_and_a_failed_section_is_not_measured() -> None:
    """A result with a key its record lacks fails when loaded (not later, in a figure's text); a section that raised
    (report.json holds its error) gives its figures as not measured, with the error."""
    shared = perf.bench("shared")
    result = {
        "a_craft_s": 40.0,
        "b_install_s": 2.0,
        "b_samples_s": [2.5, 2.0],
        "ratio": 0.05,
        "closure_paths": 1,
        "closure_bytes": 12345,
        "tool": "csv-dedup",
    }
    (made,) = shared.summarize(shared.load(result))
    assert (made["id"], made["value"]) == ("P10", 0.05) and "installed in 2.00 s (best of 2.50, 2.00 s" in made[
        "measured"
    ]
    with pytest.raises(RecordError, match="unknown key"):
        shared.load({**result, "b_install": 2.0})
    with pytest.raises(RecordError, match="missing key"):
        shared.load({k: v for k, v in result.items() if k != "tool"})
    (failed,) = shared.summarize(shared.load({"error": "RuntimeError: boom"}))
    assert (failed["value"], failed["measured"]) == (None, "not measured: shared failed: RuntimeError: boom")


def test_unknown_benchmark_is_a_usage_error() -> None:
    result = run_benchmarks("--only", "startup,warp-drive")
    assert result.returncode == UsageError.exit_code
    assert "no benchmark named warp-drive" in result.stderr and "choose from: startup, calls, search" in result.stderr


def test_sandboxed_cargo_is_classified_by_its_own_command() -> None:
    """The argv flakebot really gives bubblewrap (binds, prlimit, setpriv as root) reduces to `cargo test`."""
    require("bwrap")
    sandbox = open_sandbox("required", workspace=REPO, writable=[])
    assert isinstance(sandbox, BwrapSandbox)
    cargo = Cargo(target_dir=REPO / "target", offline=True, registry_dir=Path("/usr/share/cargo/registry"))
    argv = [*sandbox.bwrap_argv(REPO), *sandbox.limit_argv(), *cargo.argv("test", "--message-format=json")]
    assert classify(argv) == "cargo test"
    assert classify(cargo.argv("metadata", "--format-version", "1")) == "cargo metadata"
    assert (
        classify(["/usr/bin/nix", "--extra-experimental-features", "nix-command flakes", "build", "--json", "."])
        == "nix build"
    )
    assert classify([*sandbox.bwrap_argv(REPO), "true"]) == "sandbox probe"


def test_overlapping_processes_are_counted_once() -> None:
    procs = [
        {"kind": "cargo test", "start": 10.0, "end": 14.0, "seconds": 4.0, "cpu_s": 6.0},
        # overlaps the test: 1 s more wall, not 2; its CPU seconds add to the test's all the same
        {"kind": "cargo metadata", "start": 13.0, "end": 15.0, "seconds": 2.0, "cpu_s": 0.5},
        {"kind": "nix build", "start": 16.0, "end": 18.0, "seconds": 2.0, "cpu_s": 3.0},
        {"kind": "git", "start": 17.5, "end": 19.0, "seconds": 1.5, "cpu_s": 1.0},  # half inside the nix build
    ]
    split = bench_craft.attribute(procs, (9.0, 20.0))
    assert (
        split
        == {
            "seconds": 11.0,
            "raw_s": 7.0,
            "cargo_s": 5.0,
            "host_fetch_s": 0.0,
            "nix_build_s": 2.0,
            "other_processes_s": 1.0,
            "own_s": 3.0,
            "fixed_s": 5.0,  # the build work is the test and nix build (6 s); cargo metadata's second outside the test is fixed cost
            "raw_cpu_s": 9.5,  # cargo's and nix's, not git's
        }
    )
    assert bench_craft.attribute(procs, (12.0, 13.5))["raw_s"] == 1.5
    assert bench_craft.attribute(procs, (12.0, 13.5))["raw_cpu_s"] == 0.5  # only what started in the window


def test_the_process_trace_counts_the_cpu_seconds_of_a_child_and_what_it_reaped(tmp_path: Path) -> None:
    """A shell that waits for a busy grandchild: its CPU seconds (from wait4) hold the grandchild's, and a sleeping
    process's stay near zero however long it ran."""
    proctrace = importlib.import_module("benchmarks.perf.proctrace")
    busy = "import time\nt = time.process_time() + 0.3\nwhile time.process_time() < t: pass"
    plain = subprocess.Popen
    proctrace.install()
    try:
        subprocess.run(["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(busy)}; true"], check=True)
        subprocess.run(["sleep", "0.3"], check=True)
    finally:
        subprocess.Popen = plain  # type: ignore[misc]
    shell, sleeper = proctrace.RECORDS[-2:]
    assert shell["cpu_s"] >= 0.3 and shell["seconds"] >= 0.3
    assert sleeper["cpu_s"] < 0.1 <= sleeper["seconds"]


@pytest.mark.slow
def test_loop_benchmark_times_red_and_green_iterations() -> None:
    """One sample of P2 on the session's tool: each iteration runs cargo once (csv-dedup has no library, so
    the green verdict needs no doc-test run); the parts add up."""
    require("bwrap", "cargo")
    figures = bench_loop.run(samples=1)
    red, green = figures["red"], figures["green"]
    assert red["verdict_cargo_runs"] == 1 and red["second_cargo_s"] == 0
    assert green["verdict_cargo_runs"] == 1 and green["second_cargo_s"] == 0
    for phase in (red, green):
        parts = phase["iteration_parts_s"]
        # cargo's part (rounded to 0.1 ms) holds at least the verdict's first cargo run (rounded to 1 ms)
        assert parts["model"] > 0 and parts["cargo"] >= phase["verdict_cargo_s"] - 0.001 > 0
        # a commit was made on its thread; what the step waited for it (its read of the tree) may round to nothing
        assert parts["commit_thread"] > 0 and parts["commit"] >= 0
        # the commit's own seconds on its thread overlap the others (its wait is in "commit"): not a part of the sum
        inline = {key: seconds for key, seconds in parts.items() if key != "commit_thread"}
        assert sum(inline.values()) == pytest.approx(phase["iteration_s"], abs=0.01)
        assert phase["ratio"] == pytest.approx(phase["iteration_s"] / phase["verdict_cargo_s"], rel=0.01)
        assert phase["raw_cargo_test_s"] > 0


@pytest.mark.slow
def test_services_benchmark_runs_and_reports_its_figures() -> None:
    """One small run of S1-S3 on kv-service: every field measured (as root, the direct figure too), the ratio and
    differences taken from the same run's medians, and the figures made from the typed record."""
    from benchmarks.perf import bench
    from benchmarks.perf import services as bench_services

    require("nix", "cargo", "bwrap", "pasta")
    result = bench_services.run(samples=1, requests=5)
    record = bench("services").load(result)
    assert len(record.up_samples_s) == 1 and record.up_s > 0 and record.restart_s > 0
    assert record.forward_ms > 0 and record.proxy_ms > 0 and record.requests == 5
    if os.geteuid() == 0:
        assert record.direct_ms is not None and record.direct_ms > 0
        assert record.forward_over_direct == pytest.approx(record.forward_ms / record.direct_ms, abs=0.001)
        assert record.forward_minus_direct_ms == pytest.approx(record.forward_ms - record.direct_ms, abs=0.001)
    figures = bench("services").summarize(record)
    assert [f["id"] for f in figures] == ["S1", "S2", "S3", "S3-concurrent", "S4", "S5"]
    assert all(f["value"] is not None for f in figures)  # the handoff's figures against the bare binary, same run
    assert record.socket_over_bare == pytest.approx(record.socket_ms / record.bare_ms, abs=0.001)
    assert record.socket_up_over_bare_s == pytest.approx(record.socket_up_s - record.bare_start_s, abs=0.002)
    # the upgrade under a looping client answered some; the memory of every process in the tree, the service's in it
    assert record.upgrade_requests_ok and record.upgrade_requests_lost is not None and record.tree_mb
    assert record.tree_pss_mb == pytest.approx(sum(v["Pss"] for v in record.tree_mb.values()), abs=0.05)
    assert 0 < record.service_pss_mb < record.tree_pss_mb and any("kv-service" in k for k in record.tree_mb)


def test_front_benchmark_runs_and_reports_its_figure() -> None:
    """One small run of T1: real tokens, a real `flakebot serve`, the MCP SDK's clients; every call answered and
    timed, the figure made from the typed record against its goal."""
    from benchmarks.perf import bench
    from benchmarks.perf import front as bench_front

    record = bench("front").load(bench_front.run(tokens=3, rounds=1))
    assert (record.tokens, record.calls, record.errors) == (3, 6, 0)
    assert 0 < record.p50_ms <= record.p95_ms <= record.max_ms and record.alone_p95_ms > 0
    assert record.p95_over_alone == pytest.approx(record.p95_ms / record.alone_p95_ms, abs=0.02)
    [figure] = bench("front").summarize(record)
    assert (figure["id"], figure["value"], figure["goal"]) == ("T1", record.p95_ms, 250.0)


def test_failover_figure_is_the_failovers_wall_beyond_the_crafts_own() -> None:
    """T4's record and figure (its run crafts twice, minutes: `make bench` runs it): the figure is the overhead the
    run measured, with the timeline that makes it."""
    failover = perf.bench("failover")
    result = {
        "lease_s": 20.0,
        "killed_after_s": 30.0,
        "kill_to_done_s": 70.0,
        "failover_wall_s": 100.0,
        "own_s": 60.0,
        "overhead_s": 40.0,
        "attempts": 2,
    }
    (made,) = failover.summarize(failover.load(result))
    assert (made["id"], made["value"], made["goal"], made["met"]) == ("T4", 40.0, 60.0, True)
    assert "killed with SIGKILL 30.0 s in" in made["measured"] and "60.0 s for the same craft" in made["measured"]


def test_workers_figure_is_the_ratio_of_the_two_walls() -> None:
    """T3's record and figure (its run crafts twelve times: `make bench` runs it); a report from before the rounds
    and the CPU floor still renders."""
    workers = perf.bench("workers")
    result = {"crafts": 6, "one_worker_s": 100.0, "two_workers_s": 55.0, "ratio": 0.55, "spread": [3, 3]}
    (made,) = workers.summarize(workers.load(result))
    assert (made["id"], made["value"], made["goal"], made["met"]) == ("T3", 0.55, 0.6, True)
    assert "100.0 s by one" in made["measured"] and "crafts per worker: 3, 3" in made["measured"]


def test_workers_figure_says_the_floor_the_cores_set() -> None:
    """T3 gives each round's ratio as its spread and the CPU floor measured in the same run: the two workers'
    CPU-seconds over the cores against one worker's wall, and whether the goal lies above it on this machine."""
    from benchmarks.perf.workers import Phase, summary

    def phase(n: int, workers: int, wall: float, cpu: float) -> Phase:
        return Phase(round=n, workers=workers, wall_s=wall, cpu_s=cpu, machine_busy_s=wall * 1.9,
                     spread=[6] if workers == 1 else [3, 3], craft_s=wall / 6 * workers, lock_waits=0, first_claim_s=0.8, claim_gap_s=0.012)  # fmt: skip

    phases = [phase(0, 1, 30.0, 40.0), phase(0, 2, 24.0, 44.0), phase(1, 2, 22.0, 42.0), phase(1, 1, 28.0, 38.0)]
    made = summary(6, 2, phases)
    assert (made.round_ratios, made.ratio, made.cpu_two_s) == ([0.8, 0.786], 0.793, 43.0)
    cores = made.cores or 1
    assert made.floor_ratio == round(86 / cores / 58, 3)
    workers = perf.bench("workers")
    (figure,) = workers.summarize(workers.load(dataclasses.asdict(made)))
    assert figure["spread"] == {"min": 0.786, "max": 0.8, "n": 2} and figure["met"] is False
    assert f"over {cores} cores the two workers need at least {43.0 / cores:.1f} s" in figure["measured"]
    reach = "allows the goal" if max(made.round_floors) <= 0.6 else "cannot reach the goal"
    assert reach in figure["measured"] and "0 lock waits" in figure["gap"]
    assert "a craft took 4.8 s on one worker and 7.7 s on each of two" in figure["gap"]
    assert "slow each other down" in figure["gap"]
    assert "its first job 0.80 s after its start and its next one 12 ms after a job's end" in figure["gap"]
    # the cores busy, the crafts' own share small: the gap names the machine's other load
    loaded = dataclasses.replace(made, cpu_one_s=8.0, cpu_two_s=9.0)
    (figure,) = workers.summarize(workers.load(dataclasses.asdict(loaded)))
    assert "saturated, mostly by other work: the two workers got 0.39 of the 1.90 busy cores" in figure["gap"]
    # whose the cores were, per owner, and a craft's own CPU from its job row
    owned = dataclasses.replace(made, owners_one={"workers' children": 1.2, "other processes": 0.3, "postgresql": 0.001},
                                owners_two={"workers' children": 1.8}, craft_cpu_one_s=4.6, craft_cpu_two_s=4.5,
                                cpu_wait_one=0.2, cpu_wait_two=0.9)  # fmt: skip
    (figure,) = workers.summarize(workers.load(dataclasses.asdict(owned)))
    assert "one worker: workers' children 1.20, other processes 0.30; two: workers' children 1.80" in figure["gap"]
    assert "4.6 on one worker and 4.5 on each of two; some task waited for a core 20%" in figure["gap"]


def test_a_figure_whose_repeats_cross_its_goal_is_reported_as_one_this_run_cannot_tell() -> None:
    """A figure with repeats gives their range; when the range falls on both sides of the goal, the report says
    the run cannot tell met from missed (issue 45: P14 moved either side of its goal with the machine's load)."""
    from benchmarks.perf import figures, report

    crossing = figures.figure("P14", "cold", 1.18, "x", 1.2, "<=", "m", "gap", spread=(1.12, 1.18, 1.25))
    inside = figures.figure("P14", "cold", 1.1, "x", 1.2, "<=", "m", "gap", spread=(1.05, 1.15))
    single = figures.figure("P1", "overhead", 1.1, "x", 1.05, "<=", "m", "gap")
    crossing_row, inside_row, single_row = report.figure_table([crossing, inside, single])[2:]
    assert (
        "1.18x (1.12x to 1.25x over 3)" in crossing_row
        and "met; its spread crosses the goal: cannot tell" in crossing_row
    )
    assert inside_row.endswith("| met |") and "(1.05x to 1.15x over 2)" in inside_row
    assert single_row.endswith("| **not met** |") and "spread" not in single


def test_cpu_owners_gives_an_orphans_time_to_the_tree_it_came_from() -> None:
    """benchmarks.perf.cpuowners: a child's CPU-seconds go to its root; an orphan's (its parent exited, pid 1
    reaped it, as a sandbox's init is) go to the root it was started under, not to pid 1's tree, whether the sampler
    saw it before its parent exited or after (then by its session)."""
    import subprocess

    from benchmarks.perf.cpuowners import CpuOwners

    loop = "i=0; while [ $i -lt 1000000 ]; do i=$((i+1)); done"
    sampler = CpuOwners()
    sampler.start()
    child = subprocess.Popen(["sh", "-c", loop])
    parent = subprocess.Popen(  # in a session of its own, as the benchmark's workers are
        ["sh", "-c", f"sh -c '{loop}' & echo $!"], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    orphan = int(parent.communicate()[0])  # its parent has exited: pid 1 reaps it
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: a root alive at the end
    while Path(f"/proc/{orphan}").exists():
        time.sleep(0.05)
    sampler.stop()
    child.wait()
    owners = sampler.owners({child.pid: "child", parent.pid: "parent", 1: "pid 1"}, split=frozenset({"child"}))
    assert owners.get("child' children", 0) == 0 and owners["child itself"] > 0.1
    assert owners["parent"] >= 0.5 * owners["child itself"], owners


def test_the_fork_bench_refuses_a_crate_whose_full_test_runs_no_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crate cargo cannot resolve from the registry (flate2 without Debian's libz-sys, say) gave P2-fork a ratio of
    two failed resolutions (0.99, published as the figure); it is now left out with the reason, and a run where no
    crate could be measured is an error."""
    from benchmarks.perf import fork

    registry = tmp_path / "registry"
    crate = registry / "needs-missing-0.1.0"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(
        '[package]\nname = "needs-missing"\nversion = "0.1.0"\nedition = "2021"\n\n'
        '[dependencies]\nno-such-crate-anywhere = "1"\n'
    )
    (crate / "src/lib.rs").write_text("pub fn f() {}\n")
    monkeypatch.setattr(fork, "REGISTRY", registry)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fork.NoBaseline) as refused:
        fork.run(crates=("needs-missing-0.1.0",), samples=1)
    assert "needs-missing-0.1.0: its full cargo test ran no test" in str(refused.value)
    assert "no-such-crate-anywhere" in str(refused.value)
    assert "scripts/bench-setup.sh" in str(refused.value)


def test_compile_once_splits_the_nix_builds_into_cargo_inside_them_and_nix_own(tmp_path: Path) -> None:
    """P14's gap says what of the crafts' nix build seconds is cargo's work inside the derivations (each derivation's
    "Finished" line, as run.log keeps it from the loop's deps build and the package stage's) and what is Nix's own;
    cargo's lines from outside a nix build are not counted. A report from before the split still renders."""
    from benchmarks.perf.compile_once import nix_cargo_seconds

    log = tmp_path / "run.log"
    log.write_text(
        "2026-11-30 01:13:37,770 DEBUG flakebot.nix.loopdeps: nix: cargo-deps>    Compiling csv v1.1.6\n"
        "2026-11-30 01:13:41,620 DEBUG flakebot.nix.loopdeps: nix: cargo-deps>     Finished `release` profile "
        "[optimized] target(s) in 11.60s\n"
        "2026-11-30 01:13:42,100 DEBUG flakebot.cargo.runner: cargo:     Finished `release` profile [optimized] "
        "target(s) in 0.70s\n"
        "2026-11-30 01:13:44,747 INFO flakebot.pipeline.engine: package: Finished `release` profile [optimized] "
        "target(s) in 1.12s\n"
    )
    assert nix_cargo_seconds(log) == 12.72
    compile_once = perf.bench("compile_once")
    recorded = json.loads((REPO / "bench/report.json").read_text())["results"]["compile_once"]
    old = {key: value for key, value in recorded.items() if not key.endswith("nix_cargo_s")}
    cold, today = old["runs"]["cold"], old["runs"]["today"]
    split = {
        **old,
        "cold_nix_cargo_s": [cold["nix_build_s"] - 0.4, 7.0],
        "today_nix_cargo_s": [today["nix_build_s"] - 0.3],
    }
    p14, shared = compile_once.summarize(compile_once.load(split))[:2]
    assert "(two derivations: cargo inside them" in p14["gap"] and "Nix's own 0.40 s)" in p14["gap"]
    assert "today's: cargo inside them" in shared["gap"] and "Nix's own 0.30 s" in shared["gap"]
    before = compile_once.summarize(compile_once.load(old))[0]
    assert "(two derivations)." in before["gap"]
