"""The generated sections of the docs (docs/performance.md, reliability.md, eval.md, exit-codes.md): one marker
syntax, one writer. A section NAME is the text between

    <!-- NAME:start -->
    ...
    <!-- NAME:end -->

and is rewritten whole by its generator (`make bench`: bench, `make reliability`: reliability, `make eval`: eval,
`python -m benchmarks.readme docs`: exit-codes, settings and cli); nothing between the markers is typed by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class MissingSection(Exception):
    """The README has no NAME:start ... NAME:end markers and no heading to add them under was given."""


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def read_section(text: str, name: str) -> str | None:
    """The text between the section's markers (None when they are not both there)."""
    start, end = markers(name)
    if start not in text or end not in text.split(start, 1)[1]:
        return None
    return text.split(start, 1)[1].split(end, 1)[0].removeprefix("\n").removesuffix("\n")


def write_section(readme: Path, name: str, body: str, heading: str | None = None) -> None:
    """Put `body` between the section's markers; without markers, append them under `## heading` (or raise
    MissingSection when no heading is given)."""
    text = readme.read_text()
    start, end = markers(name)
    block = f"{start}\n{body}\n{end}"
    if read_section(text, name) is not None:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    elif heading is not None:
        text = text.rstrip() + f"\n\n## {heading}\n\n{block}\n"
    else:
        raise MissingSection(f"{readme} has no {start} ... {end} section")
    readme.write_text(text)


def exit_code_section(readme: Path) -> None:
    """The exit-code table, from flakebot's error tree."""
    from flakebot.errors import exit_code_table

    write_section(readme, "exit-codes", exit_code_table().rstrip("\n"))


def reference_sections(docs: Path = REPO / "docs") -> None:
    """The pages that mirror the code: every setting (docs/settings.md) and every command (docs/cli.md)."""
    from flakebot.cli.reference import cli_reference, settings_table

    write_section(docs / "settings.md", "settings", settings_table())
    write_section(docs / "cli.md", "cli", cli_reference())


def main(argv: list[str]) -> int:
    """`python -m benchmarks.readme exit-codes|docs`: rewrite the sections that need no measurement."""
    if argv[:1] == ["exit-codes"]:
        exit_code_section(Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "exit-codes.md")
    elif argv[:1] == ["docs"]:
        exit_code_section(REPO / "docs" / "exit-codes.md")
        reference_sections()
    else:
        print("usage: python -m benchmarks.readme exit-codes [PAGE] | docs", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
