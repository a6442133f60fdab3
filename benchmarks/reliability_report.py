"""The reliability report: figures summarised from the raw rows, rendered as Markdown, and the README section.

Nothing here measures anything: every number comes from the JSON the scenarios produced.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

START, END = "<!-- reliability:start -->", "<!-- reliability:end -->"


# ------------------------------------------------------------------ facts about the machine


def machine() -> dict[str, Any]:
    """The machine the figures came from."""
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "os": _os_name(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nix": _version(["nix", "--version"]),
        "bwrap": _version(["bwrap", "--version"]),
        "cargo": _version(["cargo", "--version"]),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> float | None:
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:", 1)[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return round(kib / 1024 / 1024, 1)


def _os_name() -> str:
    try:
        return re.search(r'^PRETTY_NAME="?([^"\n]*)', Path("/etc/os-release").read_text(), re.M).group(1)  # type: ignore[union-attr]
    except (OSError, AttributeError):
        return platform.system()


def _version(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return "not installed"
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else "unknown"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------ summary


def summarize(sections: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The headline figures of every section that ran."""
    summary: dict[str, Any] = {}
    if "faults" in sections:
        rows = sections["faults"]
        survivable = [r for r in rows if r["survivable"] and r["kind"] != "none"]
        fatal = [r for r in rows if not r["survivable"]]
        baseline = next((r["craft_s"] for r in rows if r["kind"] == "none"), None)
        summary["faults"] = {
            "survivable_kinds": len({r["kind"] for r in survivable}),
            "survived": sum(1 for r in survivable if r["survived"]),
            "survivable_cases": len(survivable),
            "fatal_cases": len(fatal),
            "fatal_failed_cleanly_and_resumed": sum(1 for r in fatal if r["ok"]),
            "baseline_craft_s": baseline,
            "all_ok": all(r["ok"] for r in rows),
        }
    if "escapes" in sections:
        rows = sections["escapes"]
        for label in dict.fromkeys(r["sandbox"] for r in rows):
            mine = [r for r in rows if r["sandbox"] == label]
            summary.setdefault("escapes", {})[label] = {
                "attempts": len(mine),
                "contained": sum(1 for r in mine if r["contained"]),
            }
    if "inputs" in sections:
        rows = sections["inputs"]
        summary["inputs"] = {
            "cases": len(rows),
            "ok": sum(1 for r in rows if r["ok"]),
            "expected_exit": sum(1 for r in rows if r["exit_code"] == r["expected_exit"]),
            "nothing_half_written": sum(1 for r in rows if r["clean"]),
            "tracebacks": sum(1 for r in rows if r["traceback"]),
        }
    if "crashes" in sections:
        rows = sections["crashes"]
        summary["crashes"] = {
            "points": len(rows),
            "landed_inside": sum(1 for r in rows if r["landed_inside"]),
            "resumed": sum(1 for r in rows if r["resume"]["status"] == "succeeded"),
            "only_killed_stage_reran": sum(1 for r in rows if r["resume"]["reran"] == [r["stage"]]),
            "strays": sum(len(r["strays_after_kill"]) + len(r["strays_after_resume"]) for r in rows),
        }
    if "concurrency" in sections:
        rows = sections["concurrency"]
        single = next((r["wall_s"] for r in rows if r["crafts"] == 1), None)
        summary["concurrency"] = [
            {
                "crafts": r["crafts"],
                "succeeded": r["succeeded"],
                "consistent": r["consistent"],
                "wall_s": r["wall_s"],
                "vs_sequential": round(r["wall_s"] / (single * r["crafts"]), 2) if single else None,
            }
            for r in rows
        ]
    return summary


# ------------------------------------------------------------------ Markdown


def cell(value: Any) -> str:
    text = " ".join(str(value).split())
    return text.replace("|", "\\|")


def code(value: Any) -> str:
    """A code span keeping the text exact (spaces included); only line breaks and table pipes are escaped."""
    text = str(value).replace("\n", "\\n").replace("|", "\\|")
    return f"`{text}`" if text else ""


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) if not str(v).startswith("`") else str(v) for v in row) + " |" for row in rows]
    return lines + [""]


def yes(flag: Any) -> str:
    return "yes" if flag else "**NO**"


def commits(report: dict[str, Any]) -> str:
    end = report.get("commit_at_end", report["commit"])
    if end == report["commit"]:
        return f"commit `{report['commit']}`"
    return f"commit `{report['commit']}` (`{end}` by the end: the tree changed during the run)"


def machine_line(report: dict[str, Any]) -> str:
    m = report["machine"]
    return (
        f"{m['cpu']} ({m['cores']} cores, {m['memory_gb']} GB), {m['os']}, kernel {m['kernel']}; "
        f"{m['nix']}, {m['bwrap']}, {m['cargo']}; load average {report['load_before'][0]} at the start, {report['load_after'][0]} at the end"
    )


def render(report: dict[str, Any]) -> str:
    """bench/reliability.md from the report's data."""
    sections = report["sections"]
    lines = [
        "# flakebot reliability report",
        "",
        f"Generated by `make reliability` (`python -m benchmarks.reliability`) on {report['generated']} from {commits(report)}, "
        f"in {report['runtime_s']:.0f} s. Every figure below comes from `bench/reliability.json`, which the same run wrote; nothing is typed by hand.",
        "",
        f"Machine: {machine_line(report)}. The machine is shared, so timings carry other people's load.",
        "",
        "Paths inside the scenario's scratch home are shown as `<home>`.",
        "",
        "## Summary",
        "",
        *summary_lines(report["summary"]),
        "",
    ]
    renderers = {
        "faults": _faults,
        "escapes": _escapes,
        "inputs": _inputs,
        "crashes": _crashes,
        "concurrency": _concurrency,
    }
    for name, rows in sections.items():
        lines += renderers[name](rows) if rows else []
    return "\n".join(lines).rstrip() + "\n"


def summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    if "faults" in summary:
        f = summary["faults"]
        text = f"- **Model-server faults**: {f['survived']} of {f['survivable_cases']} survivable fault cases "
        text += f"({f['survivable_kinds']} kinds) ended in a crafted tool"
        if f["fatal_cases"]:
            text += (
                f"; {f['fatal_failed_cleanly_and_resumed']} of {f['fatal_cases']} faults beyond the retries failed with one error line"
                " and then resumed to success once the server was healthy"
            )
        if f["baseline_craft_s"] is not None:
            text += f" (a craft without faults: {f['baseline_craft_s']:.1f} s)"
        lines.append(text + ".")
    if "escapes" in summary:
        parts = [f"{v['contained']} of {v['attempts']} contained by {k}" for k, v in summary["escapes"].items()]
        lines.append(f"- **Sandbox escapes**: {'; '.join(parts)}.")
    if "inputs" in summary:
        i = summary["inputs"]
        lines.append(
            f"- **Bad input**: {i['ok']} of {i['cases']} invocations ended with one `error:` line and the documented exit code "
            f"({i['expected_exit']} with the expected code, {i['nothing_half_written']} left nothing half-written, {i['tracebacks']} tracebacks)."
        )
    if "crashes" in summary:
        c = summary["crashes"]
        lines.append(
            f"- **Crash points**: SIGKILL landed inside the target stage {c['landed_inside']} of {c['points']} times; `flakebot resume` "
            f"succeeded {c['resumed']} of {c['points']} times, re-running only the killed stage {c['only_killed_stage_reran']} times; "
            f"{c['strays']} processes outlived a kill or a resume."
        )
    for batch in summary.get("concurrency", []):
        ratio = (
            f", {batch['vs_sequential']} x the time of as many crafts one after another"
            if batch["vs_sequential"] and batch["crafts"] > 1
            else ""
        )
        lines.append(
            f"- **{batch['crafts']} concurrent craft(s)**: {batch['succeeded']} succeeded, catalog consistent: {yes(batch['consistent'])}, "
            f"{batch['wall_s']:.1f} s wall{ratio}."
        )
    return lines


def _faults(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Model-server faults",
        "",
        'A real offline craft of "need a CSV deduper" from the hand-written session, served by flakebot\'s stub server to the real groq SDK '
        "(`GROQ_BASE_URL`), with fault turns inserted before one turn of a stage. *HTTP* counts the requests the server answered, *calls* the "
        "model calls in the run's transcript: the difference is retries the SDK made on its own. *recovery* is the time from the first fault "
        "to the request that the next turn answered.",
        "",
    ]
    body = []
    for r in rows:
        recovery = "" if r.get("recovery_s") is None else f"{r['recovery_s']:.2f} s"
        outcome = "crafted" if r["survived"] else f"exit {r['exit_code']}"
        body.append(
            [
                r["case"],
                r["fault"],
                yes(r["survived"]) if r["survivable"] else "no (expected)",
                outcome,
                r["how"],
                r["http_requests"],
                r["flakebot_calls"],
                recovery,
                f"{r['craft_s']:.1f} s",
                yes(r["ok"]),
            ]
        )
    lines += table(["case", "fault", "survived", "outcome", "how", "HTTP", "calls", "recovery", "craft", "ok"], body)
    fatal = [r for r in rows if not r["survivable"]]
    if fatal:
        lines += [
            "Faults beyond what retries can absorb, then `flakebot resume` once the server is healthy again (a new stub without the faults):",
            "",
        ]
        body = []
        for r in fatal:
            resume = r.get("resume") or {}
            reran = ", ".join(k for k, v in resume.get("attempts", {}).items() if (v or 0) > 1 and k != "clean")
            body.append(
                [
                    r["case"],
                    f"exit {r['exit_code']}",
                    code(r["error_line"]),
                    resume.get("status", "not resumed"),
                    reran,
                    f"{resume.get('seconds', 0):.1f} s",
                ]
            )
        lines += table(["case", "craft", "error line", "resume", "stages run again", "resume time"], body)
    return lines


HOSTILE = "hostile session (pipeline)"


def _escapes(rows: list[dict[str, Any]]) -> list[str]:
    hostile = [r for r in rows if r["sandbox"] == HOSTILE]
    rows = [r for r in rows if r["sandbox"] != HOSTILE]
    lines = [
        "## Sandbox escapes",
        "",
        "Each attempt from `benchmarks/scenarios/escape_cases.py` runs as `bash -c SCRIPT` in the sandbox the edit loop uses "
        '(`open_sandbox("required")`: bubblewrap), and for contrast in a plain process (`open_sandbox("off")`). The outcome is judged from outside.',
        "",
    ]
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["sandbox"]] = r
    labels = list(dict.fromkeys(r["sandbox"] for r in rows))
    header = (
        ["attempt", "expected"]
        + [f"{label}: contained" for label in labels]
        + [f"{label}: outcome" for label in labels]
    )
    body = []
    for results in by_case.values():
        first = next(iter(results.values()))
        contained = [_contained(results[label]) if label in results else "" for label in labels]
        outcomes = [results[label]["outcome"] if label in results else "" for label in labels]
        body.append([first["attempt"], first["expected"], *contained, *outcomes])
    return lines + table(header, body) + (_hostile(hostile) if hostile else [])


def _hostile(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "### Hostile model sessions",
        "",
        "Each is a scripted model session run through the real pipeline (`flakebot craft --model scripted:FILE`, "
        "`benchmarks/scenarios/hostile.py`): the model writes the tool and a build script (or a tool) that attacks the host, with a key "
        "in flakebot's environment since start. The outcome is judged from outside.",
        "",
    ]
    body = [[r["attempt"], r["expected"], _contained(r), r["outcome"], f"{r['seconds']:.0f} s"] for r in rows]
    return lines + table(["attempt", "expected", "contained", "outcome", "time"], body)


def _contained(row: dict[str, Any]) -> str:
    if row["contained"]:
        return "yes"
    return "**NO**" if row["mode"] == "required" else "no: escaped"


def _inputs(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Bad input",
        "",
        "Each invocation runs the real CLI in a fresh home. *left* says what the home holds afterwards: input refused before a run starts "
        "leaves no run directory; input found bad inside a stage leaves one failed run holding only its audit files (state, events, log). "
        "Every case also checks that the catalog did not change and that no process was left.",
        "",
    ]
    body = []
    for r in rows:
        env = " ".join(f"{k}={v}" for k, v in r["env"].items())
        command = f"{env} {r['command']}".strip()
        left = (
            "nothing"
            if not r["new_runs"]
            else ", ".join(
                f"1 {n['status']} run" + (f" + {n['extra_files']}" if n["extra_files"] else "") for n in r["new_runs"]
            )
        )
        exit_cell = (
            str(r["exit_code"])
            if r["exit_code"] == r["expected_exit"]
            else f"**{r['exit_code']}** (expected {r['expected_exit']})"
        )
        body.append([r["case"], code(command), exit_cell, code(r["error_line"]), left, yes(r["ok"])])
    return lines + table(["bad input", "command", "exit", "stderr line", "left", "ok"], body)


def _crashes(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Crash points",
        "",
        '`craft "need a CSV deduper"` (hand-written session, offline) is started in its own process group and the whole group gets SIGKILL at the '
        "trigger; then `flakebot resume RUN`. *landed in* is the stage state.json shows running after the kill; *running* lists the programs "
        "that were running under the craft at that moment; *left behind* counts processes alive 3 s after the kill or after the resume.",
        "",
    ]
    body = []
    for r in rows:
        resume = r["resume"]
        left = len(r["strays_after_kill"]) + len(r["strays_after_resume"])
        body.append(
            [
                r["stage"],
                r["trigger"],
                f"{r['killed_after_s']:.1f} s",
                r["landed_in"],
                ", ".join(r["running_at_kill"]) or "(flakebot alone)",
                r["last_progress"],
                resume["status"] if resume["exit_code"] == 0 else f"exit {resume['exit_code']}: {resume['error_line']}",
                ", ".join(resume["reran"]),
                f"{resume['seconds']:.1f} s",
                yes(resume["verified"]),
                left,
                yes(r["ok"]),
            ]
        )
    header = [
        "stage",
        "trigger",
        "killed at",
        "landed in",
        "running",
        "last progress",
        "resume",
        "re-ran",
        "resume time",
        "nix run verified",
        "left behind",
        "ok",
    ]
    return lines + table(header, body)


def _concurrency(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Concurrent crafts",
        "",
        "N crafts started at once into one catalog, each a new crate on csv (`--crate csv --mode new`) from its own `--spec` and a one-turn "
        "edit session; tool names are new to the Nix store, so every `nix build` really builds. Mean stage times show the contention.",
        "",
    ]
    single = next((r["wall_s"] for r in rows if r["crafts"] == 1), None)
    body = []
    for r in rows:
        ratio = f"{r['wall_s'] / (single * r['crafts']):.2f}" if single else ""
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in r["stage_mean_s"].items())
        body.append(
            [
                r["crafts"],
                f"{r['succeeded']}/{r['crafts']}",
                f"{r['wall_s']:.1f} s",
                ratio,
                f"{min(r['per_craft_s']):.1f}-{max(r['per_craft_s']):.1f} s",
                stages,
                yes(r["consistent"]),
            ]
        )
    lines += table(
        ["crafts", "succeeded", "wall", "wall / (N x one craft)", "each craft", "mean stage time", "consistent"], body
    )
    checks = list(rows[0]["checks"]) if rows else []
    lines += table(
        ["check"] + [f"{r['crafts']} craft(s)" for r in rows],
        [[check] + [yes(r["checks"][check]) for r in rows] for check in checks],
    )
    return lines


# ------------------------------------------------------------------ README


def readme_section(report: dict[str, Any]) -> str:
    """The README's Reliability section body (between the markers), from the report's data."""
    return "\n".join(
        [
            START,
            f"Latest `make reliability` run: {report['generated']}, {commits(report)}, {report['runtime_s']:.0f} s. Machine: {machine_line(report)}.",
            "",
            *summary_lines(report["summary"]),
            "",
            "Every attempt, error line and exit code: [bench/reliability.md](bench/reliability.md) (data: `bench/reliability.json`).",
            END,
        ]
    )


def update_readme(path: Path, report: dict[str, Any]) -> None:
    """Replace the text between the markers (or append a Reliability section with them)."""
    text = path.read_text()
    section = readme_section(report)
    if START in text and END in text:
        head, rest = text.split(START, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Reliability\n\n" + section + "\n"
    path.write_text(text)
