"""The reliability report: the rows every section produced, the machine and the commit, as JSON, Markdown and the
README's Reliability section.

Nothing here measures anything: every number comes from the sections' rows (bench/reliability.json).
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import readme, records
from benchmarks.reliability import section
from benchmarks.section import Summary

REPORT_FORMAT = 1


@dataclass
class Machine:
    """The machine the figures came from."""

    host: str
    cpu: str
    cores: int | None
    memory_gb: float | None
    os: str
    kernel: str
    python: str
    nix: str
    bwrap: str
    cargo: str


@dataclass
class Report:
    """One `make reliability` run: its rows by section, in report order."""

    generated: str
    commit: str
    commit_at_end: str  # others may commit while it runs: every CLI call runs the tree as it is then
    quick: bool
    runtime_s: float
    section_s: dict[str, float]
    machine: Machine
    load_before: list[float]
    load_after: list[float]
    sections: dict[str, list[Any]]
    format: int = REPORT_FORMAT

    def summaries(self) -> dict[str, Summary]:
        return {name: section(name).summarize(rows) for name, rows in self.sections.items()}

    def json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sections"}
        return {
            "format": self.format,
            **{k: v for k, v in data.items() if k != "format"},
            "machine": records.dump(self.machine),
            "summary": {name: summary.json() for name, summary in self.summaries().items()},
            "sections": {name: records.dump(rows) for name, rows in self.sections.items()},
        }


def load_report(data: dict[str, Any]) -> Report:
    """A report from bench/reliability.json (its summary is worked out again from the rows)."""
    return Report(
        generated=data["generated"],
        commit=data["commit"],
        commit_at_end=data.get("commit_at_end", data["commit"]),
        quick=data["quick"],
        runtime_s=data["runtime_s"],
        section_s=data["section_s"],
        machine=records.load(Machine, data["machine"]),
        load_before=data["load_before"],
        load_after=data["load_after"],
        sections={name: section(name).load(rows) for name, rows in data["sections"].items()},
        format=data["format"],
    )


# ------------------------------------------------------------------ facts about the machine


def machine() -> Machine:
    return Machine(
        host=platform.node(),
        cpu=_cpu_model(),
        cores=os.cpu_count(),
        memory_gb=_memory_gb(),
        os=_os_name(),
        kernel=platform.release(),
        python=platform.python_version(),
        nix=_version(["nix", "--version"]),
        bwrap=_version(["bwrap", "--version"]),
        cargo=_version(["cargo", "--version"]),
    )


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


# ------------------------------------------------------------------ Markdown


def commits(report: Report) -> str:
    if report.commit_at_end == report.commit:
        return f"commit `{report.commit}`"
    return f"commit `{report.commit}` (`{report.commit_at_end}` by the end: the tree changed during the run)"


def machine_line(report: Report) -> str:
    m = report.machine
    return (
        f"{m.cpu} ({m.cores} cores, {m.memory_gb} GB), {m.os}, kernel {m.kernel}; "
        f"{m.nix}, {m.bwrap}, {m.cargo}; load average {report.load_before[0]} at the start, {report.load_after[0]} at the end"
    )


def summary_lines(report: Report) -> list[str]:
    return [line for summary in report.summaries().values() for line in summary.lines()]


def render(report: Report) -> str:
    """bench/reliability.md from the report's data."""
    lines = [
        "# flakebot reliability report",
        "",
        f"Generated by `make reliability` (`python -m benchmarks.reliability`) on {report.generated} from {commits(report)}, "
        f"in {report.runtime_s:.0f} s. Every figure below comes from `bench/reliability.json`, which the same run wrote; nothing is typed by hand.",
        "",
        f"Machine: {machine_line(report)}. The machine is shared, so timings carry other people's load.",
        "",
        "Paths inside the scenario's scratch home are shown as `<home>`.",
        "",
        "## Summary",
        "",
        *summary_lines(report),
        "",
    ]
    for name, rows in report.sections.items():
        lines += section(name).markdown(rows) if rows else []
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------ README


def readme_section(report: Report) -> str:
    """docs/reliability.md's generated section body (between the markers), from the report's data."""
    return "\n".join(
        [
            f"Latest `make reliability` run: {report.generated}, {commits(report)}, {report.runtime_s:.0f} s. Machine: {machine_line(report)}.",
            "",
            *summary_lines(report),
            "",
            "Every attempt, error line and exit code: [bench/reliability.md](../bench/reliability.md) (data: `bench/reliability.json`).",
        ]
    )


def update_readme(path: Path, report: Report) -> None:
    """Replace the text between the markers (or append a Reliability section with them)."""
    readme.write_section(path, "reliability", readme_section(report), heading="Reliability")
