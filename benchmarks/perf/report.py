"""Run the benchmarks and publish them: bench/report.json, bench/report.md, bench/stages.png and docs/performance.md's
Performance section, every number generated from one run (`make bench` = `python -m benchmarks`; `python -m benchmarks.perf.report` re-renders).

    measure(profile, only)  -> results of each benchmark's run(), with its seconds and the load around it
    build(...)              -> the report: machine, figures (benchmarks.perf.figures), results
    write(report, out_dir)  -> the three files;  update_readme(readme, report) -> the section between the markers
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import readme
from benchmarks.perf import SECTIONS, bench, chart, machine
from benchmarks.perf.figures import goal_text, in_order, number, value_text

logger = logging.getLogger(__name__)

REPORT_FORMAT = 1
REPO = Path(__file__).resolve().parents[2]
ORDER = [b.name for b in SECTIONS]
# Arguments of each section's run(), by profile (benchmarks.perf.SECTIONS).
PROFILES: dict[str, dict[str, dict[str, Any]]] = {
    "full": {b.name: b.full for b in SECTIONS},
    "quick": {b.name: b.quick for b in SECTIONS if b.quick is not None},
}
START, END = readme.markers("bench")


def measure(
    profile: str = "full", only: list[str] | None = None, progress: Callable[[str], None] = lambda _: None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the profile's benchmarks (or `only` those), one after another: (results by name, seconds and load of each)."""
    plan = PROFILES[profile]
    results: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    for name in [n for n in ORDER if n in plan and (not only or n in only)]:
        progress(f"bench {name} ...")
        load, start = machine.load()[0], time.perf_counter()
        try:
            results[name] = bench(name).run(plan[name])
        except Exception as exc:  # one failed benchmark is reported as such; the others still publish
            logger.exception("benchmark %s failed", name)
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        runs[name] = {
            "seconds": round(time.perf_counter() - start, 1),
            "load_before": load,
            "load_after": machine.load()[0],
            "args": plan[name],
        }
        progress(
            f"bench {name}: {runs[name]['seconds']} s"
            + (f" FAILED: {results[name]['error']}" if "error" in results[name] else "")
        )
    return results, runs


def build(
    results: dict[str, Any], runs: dict[str, Any], about: dict[str, Any], profile: str, seconds: float
) -> dict[str, Any]:
    report = {
        "format": REPORT_FORMAT,
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "profile": profile,
        "total_seconds": round(seconds, 1),
        "machine": {**about, "load_at_end": machine.load()},
        "benchmarks": runs,
        "results": results,
    }
    return with_figures(report)


def with_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The report with its figures (re)made from its results, loads and machine."""
    loads = {name: round((b["load_before"] + b["load_after"]) / 2, 2) for name, b in report["benchmarks"].items()}
    context = {"load": loads, "cores": report["machine"]["cores"]}
    by_section = {
        name: bench(name).summarize(bench(name).load(result), context) for name, result in report["results"].items()
    }
    figures = in_order(by_section)
    ordered: dict[str, Any] = {}
    for key, value in report.items():
        if key != "figures":
            ordered[key] = value
        if key == "machine":  # figures first after the machine, so report.json reads like report.md
            ordered["figures"] = figures
    return ordered


def rerender(path: Path, readme: Path | None = None) -> dict[str, Path]:
    """Write the report again from the results in an existing report.json (after a change to how figures are
    explained): the same measurements, nothing run again."""
    return _write_again(json.loads(path.read_text()), path, readme)


def _write_again(report: dict[str, Any], path: Path, readme: Path | None) -> dict[str, Path]:
    """`report` with its figures made again, written beside `path` (and into `readme`'s generated section)."""
    report = with_figures(report)
    paths = write(report, path.parent)
    if readme is not None:
        update_readme(readme, report)
    return paths


def join_sections(path: Path, other: Path, readme: Path | None = None) -> dict[str, Path]:
    """Put every section of another run's report.json (`python -m benchmarks --only ... --out DIR`) into the report at
    `path`, replacing those sections' results, and write the report again; the other sections stay as measured. The
    report's note on joined runs gains one sentence naming the run, its time, machine and load."""
    report, run = json.loads(path.read_text()), json.loads(other.read_text())
    sections = [name for name in ORDER if name in run["results"]]
    for name in sections:
        report["results"][name] = run["results"][name]
        report["benchmarks"][name] = run["benchmarks"][name]
    load = run["benchmarks"][sections[0]]["load_before"]
    joined = (
        f"{', '.join(sections)} from `--only {','.join(sections)}` at {run['generated']} on {run['machine']['cpu']} "
        f"({run['machine']['cores']} cores, load {load} at its start)."
    )
    merged = str(report.get("merged") or "")
    tail = " Each figure is a ratio or a difference within one run."
    body = merged.removesuffix(tail)
    body = re.sub(r"^This report joins \w+ runs", "This report joins several runs", body)
    report["merged"] = f"{body} {joined}{tail}".strip()
    return _write_again(report, path, readme)


def join_corpus(path: Path, rows_file: Path, readme: Path | None = None) -> dict[str, Path]:
    """Put a separate corpus run's rows (`python -m benchmarks.perf.corpus --rows FILE`: one row per crate, the
    latest, as a second run over the failed crates appends to the same file) into an existing report.json as its P8
    section, and write the report again. The other sections' measurements stay as they are; the report says that
    P8 comes from that run, and P8's note says when, under what load and at which commits its rows were measured."""
    from benchmarks.perf import corpus

    rows = corpus.latest_rows(rows_file.read_text().splitlines())
    unstamped = [row["crate"] for row in rows if "measured" not in row]
    if not rows or unstamped:
        raise ValueError(f"{rows_file}: no rows, or rows without their 'measured' stamp: {', '.join(unstamped)}")
    stamps = [row["measured"] for row in rows]
    result = {**corpus.summary(rows), "note": corpus_note(rows, rows_file.name)}
    report = json.loads(path.read_text())
    report["results"]["corpus"] = result
    report["benchmarks"]["corpus"] = {
        "seconds": round(sum(row["package_s"] + (row.get("cargo_build_release_s") or 0) for row in rows), 1),
        "load_before": min(stamps, key=lambda m: m["at"])["load_before"],
        "load_after": max(stamps, key=lambda m: m["at"])["load_after"],
        "args": {"rows": rows_file.name, "plain_build_of": plain_built(rows)},
    }
    first, last = min(m["at"] for m in stamps), max(m["at"] for m in stamps)
    joined = (
        f"corpus (P8) from `python -m benchmarks.perf.corpus --rows` runs from {first} to {last} (P8's note says how)."
    )
    merged = str(report.get("merged") or "")
    report["merged"] = (
        re.sub(r"corpus \(P8\) from (?:[^.]|\.(?=\S))*\.", joined, merged)
        if "corpus (P8) from" in merged
        else f"{merged} {joined}".strip()
    )
    return _write_again(report, path, readme)


def plain_built(rows: list[dict[str, Any]]) -> list[str]:
    """The crates whose plain `cargo build --release` was measured beside flakebot's package."""
    return [row["crate"] for row in rows if not str(row.get("cargo_error", "")).startswith("not measured")]


def corpus_note(rows: list[dict[str, Any]], rows_name: str) -> str:
    """How and when a rows file's crates were measured: its runs' times, loads and commits, and which crates got
    the plain cargo build beside them."""
    stamps = [row["measured"] for row in rows]
    codes = sorted({m["code"] for m in stamps})
    by_code = "; ".join(
        f"{code}: {', '.join(row['crate'] for row in rows if row['measured']['code'] == code)}" for code in codes
    )
    loads = [m["load_before"] for m in stamps] + [m["load_after"] for m in stamps]
    plain = plain_built(rows)
    no_plain = " --no-plain" if any(row["packaged"] and row["crate"] not in plain for row in rows) else ""
    return (
        f"Measured by runs of `python -m benchmarks.perf.corpus{no_plain} --rows {rows_name}` from "
        f"{min(m['at'] for m in stamps)} to {max(m['at'] for m in stamps)}, each appending its crates' rows to the "
        "same file; a crate measured again after a fix (or on a later commit) counts by its latest row. Each row is "
        f"stamped with the commit its run started from: {by_code}. Load average (1 min) between {min(loads)} and "
        f"{max(loads)} on a 2-core machine shared with other work (runs may overlap), so times are not "
        "comparable with unloaded runs. `cargo build --release` ran beside "
        + (", ".join(plain) if plain else "no crate")
        + " (the crates flakebot did not package: is the failure flakebot's?); the others' plain build was not measured."
    )


def run(
    profile: str = "full", only: list[str] | None = None, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Measure and build the report (nothing written)."""
    about, start = machine.describe(), time.perf_counter()
    results, runs = measure(profile, only, progress)
    return build(results, runs, about, profile, time.perf_counter() - start)


def write(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """report.json, report.md and stages.png in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "markdown": out_dir / "report.md", "chart": out_dir / "stages.png"}
    paths["json"].write_text(json.dumps(report, indent=1) + "\n")
    paths["markdown"].write_text(markdown(report))
    chart.draw(report, paths["chart"])
    return paths


# ------------------------------------------------------------------ text


def met_text(f: dict[str, Any]) -> str:
    said = {True: "met", False: "**not met**", None: "-"}[f["met"]]
    # the repeats fall on both sides of the goal: the load this run met moved the figure more than its margin
    return f"{said}; its spread crosses the goal: cannot tell" if f.get("tells") is False else said


def figure_table(figures: list[dict[str, Any]]) -> list[str]:
    lines = ["| id | figure | value | goal | |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {f['id']} | {f['title']} | {value_text(f)} | {goal_text(f)} | {met_text(f)} |" for f in figures]
    return lines


def machine_line(about: dict[str, Any]) -> str:
    return (
        f"{about['cpu']}, {about['cores']} cores, {about['memory_gib']} GiB, Linux {about['kernel']}; "
        f"Python {about['python']}, {about['cargo']}, {about['nix']}, {about['bwrap']}"
    )


def markdown(report: dict[str, Any]) -> str:
    about, figures = report["machine"], report["figures"]
    gaps = [
        f"- **{f['id']} {f['title']}**: {value_text(f)} against {goal_text(f)}. {f['gap']}"
        for f in figures
        if f["met"] is False
    ]
    methods = [
        f"| {name} | {b['seconds']} | {b['load_before']} | {b['load_after']} | {bench(name).markdown(report['results'][name])[0]} |"
        for name, b in report["benchmarks"].items()
    ]
    lines = [
        "# flakebot benchmarks",
        "",
        f"Generated by `make bench` (profile `{report['profile']}`) at {report['generated']} in {report['total_seconds']:.0f} s. "
        + (
            f"{report['merged']} Every number here was "
            if report.get("merged")
            else "Every number here was measured in that one run and "
        )
        + "written by `benchmarks/perf/report.py`; none is typed by hand. "
        "Raw numbers: [report.json](report.json).",
        "",
        "## Machine",
        "",
        machine_line(about) + ".",
        "",
        f"Load average (1 min) at the start {about['load_at_start'][0]}, at the end {about['load_at_end'][0]}: the machine is shared, so wall "
        "times carry the noise of other work; every figure sets flakebot beside the raw work measured in the same run, "
        "and medians are taken where a sample is cheap.",
        "",
        "## Figures",
        "",
        *figure_table(figures),
        "",
        "## Goals not met",
        "",
        *(gaps or ["Every goal is met."]),
        "",
        "## What each figure measured",
        "",
        *[f"- **{f['id']}** {f['measured']}" for f in figures],
        "",
        "![where one craft's time goes, and the figures against their goals](stages.png)",
        "",
        "## Benchmarks",
        "",
        "| benchmark | seconds | load before | load after | method |",
        "| --- | --- | --- | --- | --- |",
        *methods,
        "",
    ]
    return "\n".join(lines)


def readme_section(report: dict[str, Any], link: str = "../bench/report.md") -> str:
    """docs/performance.md's generated section body: the latest figures and the machine, from report.json."""
    machine = (
        f"{report['merged']} The full run's machine: {machine_line(report['machine'])}. "  # sections from several runs
        if report.get("merged")
        else f"Latest `make bench` ({report['generated'][:10]}, profile `{report['profile']}`) on {machine_line(report['machine'])}; "
        f"load average {report['machine']['load_at_start'][0]} at its start and {report['machine']['load_at_end'][0]} at its end (a shared machine). "
    )  # fmt: skip
    lines = [
        machine
        + f"Generated from `bench/report.json`; how each figure is measured, and why a missed goal is missed: [{link}]({link}).",
        "",
        *figure_table(report["figures"]),
        "",
        "![stage timings](../bench/stages.png)",
    ]
    return "\n".join(lines)


# the README quotes these, in words a newcomer reads (the ids and exact titles are docs/performance.md's): what a new
# user's first craft costs
HEADLINE = {
    "P14": "a first craft",
    "P14-shared": "its dependencies compiled once for both cargo and nix, against twice",
    "P14-heavy": "a first craft on heavier dependencies (csv, clap, tokio)",
}


def _verdict(f: dict[str, Any]) -> str:
    """met / not met, or, when the figure's repeats fall on both sides of its goal, the range that cannot tell."""
    if f.get("tells") is False:
        return f"its repeats span {number(f['spread']['min'], f['unit'])}-{number(f['spread']['max'], f['unit'])}"
    return "met" if f.get("met") else "not met"


def headline_section(report: dict[str, Any]) -> str:
    """The README's lines: the headline figures, each with its goal, linking the performance page."""
    chosen = [f for f in report["figures"] if f["id"] in HEADLINE]
    lines = [f"- {HEADLINE[f['id']]}: **{number(f['value'], f['unit'])}** (goal {goal_text(f)}, {_verdict(f)})"
             for f in chosen]  # fmt: skip
    return "\n".join([*lines, "", "Every figure, and how it is measured: [docs/performance.md](docs/performance.md)."])


def update_readme(path: Path, report: dict[str, Any]) -> None:
    """Replace the text between the bench markers (adding a Performance section at the end when there are none), and
    the headline section of the README beside the page's folder, when it has one."""
    readme.write_section(path, "bench", readme_section(report), heading="Performance")
    front = path.resolve().parent.parent / "README.md"
    if front.is_file() and readme.read_section(front.read_text(), "bench-headline") is not None:
        readme.write_section(front, "bench-headline", headline_section(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--only", help="comma-separated benchmarks: " + ", ".join(ORDER))
    parser.add_argument("--out", type=Path, default=REPO / "bench")
    parser.add_argument(
        "--readme", type=Path, default=None, help="page whose Performance section to rewrite (docs/performance.md)"
    )
    parser.add_argument(
        "--rerender",
        type=Path,
        metavar="REPORT_JSON",
        help="only write the report again from this report.json's results",
    )
    parser.add_argument(
        "--corpus-rows",
        type=Path,
        metavar="ROWS_JSONL",
        help="with --rerender: P8 from this corpus rows file (python -m benchmarks.perf.corpus --rows)",
    )
    parser.add_argument(
        "--join",
        type=Path,
        metavar="RUN_JSON",
        help="with --rerender: every section of this other run's report.json replaces the report's own",
    )
    args = parser.parse_args()
    if args.rerender and args.join:
        print(json.dumps({k: str(v) for k, v in join_sections(args.rerender, args.join, args.readme).items()}))
        return
    if args.rerender and args.corpus_rows:
        print(json.dumps({k: str(v) for k, v in join_corpus(args.rerender, args.corpus_rows, args.readme).items()}))
        return
    if args.rerender:
        print(json.dumps({k: str(v) for k, v in rerender(args.rerender, args.readme).items()}))
        return
    report = run(args.profile, args.only.split(",") if args.only else None, progress=lambda m: print(m, flush=True))
    print(json.dumps({k: str(v) for k, v in write(report, args.out).items()}))
    if args.readme:
        update_readme(args.readme, report)


if __name__ == "__main__":
    main()
