"""The README is a front page and docs/ holds the rest: the front page stays short, its links resolve, and the
reference pages that mirror the code (settings, the command line) are the ones the code generates."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.readme import read_section
from flakebot import config
from flakebot.cli.reference import cli_reference, settings_table

REPO = Path(__file__).resolve().parent.parent
FRONT_PAGE_BYTES = 12 * 1024


def test_the_readme_is_a_front_page() -> None:
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) <= FRONT_PAGE_BYTES, f"README.md is {len(readme)} bytes: move detail into docs/"
    text = readme.decode()
    assert "make demo" in text and "make test" in text


def test_every_relative_link_in_the_readme_and_docs_resolves() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_the_settings_page_is_generated_from_the_settings() -> None:
    section = read_section((REPO / "docs" / "settings.md").read_text(), "settings")
    assert section == settings_table(), "regenerate it: python -m benchmarks.readme docs"
    assert all(config.Settings.describe(key).strip() for key in config.Settings.keys())


def test_the_cli_page_is_generated_from_the_app() -> None:
    section = read_section((REPO / "docs" / "cli.md").read_text(), "cli")
    assert section == cli_reference(), "regenerate it: python -m benchmarks.readme docs"


def test_every_command_and_option_says_what_it_is_for() -> None:
    """An empty meaning cell is an option declared without help: the reference would teach nothing about it."""
    rows = [line for line in cli_reference().splitlines() if line.startswith("| `")]
    assert rows
    silent = [row for row in rows if row.rstrip().endswith("|  |") or row.rstrip().endswith("| |")]
    assert not silent, silent
