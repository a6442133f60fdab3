"""bench/stages.png: where a craft's time goes, stage by stage, and each figure against its goal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.perf.figures import goal_text, value_text

PARTS = [
    ("cargo_s", "cargo", "#d9822b"),
    ("nix_build_s", "nix build", "#5b7bd5"),
    ("other_processes_s", "other processes", "#9aa5b1"),
    ("own_s", "flakebot", "#2e9e5b"),
]


def draw(report: dict[str, Any], path: Path) -> Path:
    """Write the PNG: craft stages (when the craft benchmark ran) beside the figures against their goals."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render straight to a file
    import matplotlib.pyplot as plt

    stages = _craft_stages(report)
    goals = [f for f in report["figures"] if f["goal"] and f["value"] is not None]
    panels = [p for p in (stages and "stages", goals and "goals") if p]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(7 * max(len(panels), 1), 5.2), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=False):
        _stages(ax, stages) if panel == "stages" else _goals(ax, goals)
    machine = report["machine"]
    fig.suptitle(
        f"make bench, {report['generated'][:10]}: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _craft_stages(report: dict[str, Any]) -> list[dict[str, Any]]:
    craft = report["results"].get("craft") or {}
    if "runs" not in craft:
        return []
    return list(craft["runs"][craft["chart_run"]]["stages"])


def _stages(ax: Any, rows: list[dict[str, Any]]) -> None:
    names = [row["stage"] for row in rows][::-1]
    left = [0.0] * len(rows)
    for key, label, colour in PARTS:
        widths = [row[key] for row in rows][::-1]
        ax.barh(names, widths, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.2f} s", va="center", fontsize=8)
    ax.set_xlabel("seconds (wall)")
    ax.set_title("P1: one offline craft, stage by stage")
    ax.set_xlim(0, max(left) * 1.18)
    ax.legend(loc="lower right", fontsize=8)


def _goals(ax: Any, figures: list[dict[str, Any]]) -> None:
    """Each figure as value / goal on a log scale: left of 1 the goal is met."""
    figures = figures[::-1]
    # A share to reach (op ">=", P8) is drawn as goal / value, so that left of 1 is met for every figure.
    shares = [(f["goal"] / max(f["value"], 1e-3)) if f["op"] == ">=" else f["value"] / f["goal"] for f in figures]
    colours = ["#2e9e5b" if f["met"] else "#c0392b" for f in figures]
    labels = [f"{f['id']} {value_text(f)} (goal {goal_text(f)})" for f in figures]
    ax.barh(labels, shares, color=colours)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("value / goal (met left of the line)")
    ax.set_title("figures against their goals")
    ax.tick_params(axis="y", labelsize=8)
