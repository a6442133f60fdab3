"""The error tree: every error has its own exit code, and docs/exit-codes.md's table is the one the code generates."""

from __future__ import annotations

from benchmarks.readme import read_section
from flakebot.errors import FlakebotError, error_classes, exit_code_classes, exit_code_table
from tests.conftest import REPO


def test_every_error_has_a_distinct_exit_code_and_a_meaning() -> None:
    import flakebot.crates.cratesio  # noqa: F401  subclasses defined elsewhere share their parent's code
    import flakebot.llm.script  # noqa: F401

    owners = exit_code_classes()
    codes = [cls.exit_code for cls in owners]
    assert len(codes) == len(set(codes)) and FlakebotError.exit_code not in codes
    assert all((cls.__doc__ or "").strip() for cls in owners)
    assert all(cls in owners or cls.exit_code in codes for cls in error_classes(FlakebotError))


def test_readme_exit_code_table_is_generated_from_the_error_tree() -> None:
    section = read_section((REPO / "docs" / "exit-codes.md").read_text(), "exit-codes")
    assert section is not None
    assert section == exit_code_table().rstrip("\n"), "regenerate it: python -m benchmarks.readme exit-codes"
