"""Markdown table cells for the reliability report."""

from __future__ import annotations

from typing import Any


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
