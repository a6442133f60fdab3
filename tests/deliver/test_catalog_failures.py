"""A shared catalog that fails in any way (its NAR files gone, a narinfo missing) is skipped by craft with one
warning, and the craft goes on to craft; `install` still says what failed. A real file:// cache A published to."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.deliver.test_shared_index import Publisher, a, copy_of, trusting, warned_skip

__all__ = ["a"]  # the publisher fixture, used by name
PAST_THE_CATALOGS = 30  # ModelError: the craft reached its first model use


def only_in_the_cache(cache: Path) -> None:
    """The catalog entries' store paths removed from this store (as on another machine), so install must fetch them;
    the tools' own paths stay (A's catalog holds GC roots for them), the entries are what craft fetches first."""
    for info in cache.glob("*.narinfo"):
        path = next(line.split(": ", 1)[1] for line in info.read_text().splitlines() if line.startswith("StorePath: "))
        if "-flakebot-entry-" in path:
            subprocess.run(["nix-store", "--delete", path], capture_output=True, check=False)


def broken(cache: Path, case: str) -> None:
    only_in_the_cache(cache)
    if case == "nar files deleted":
        for nar in (cache / "nar").iterdir():
            nar.unlink()
    elif case == "narinfos deleted":
        for info in cache.glob("*.narinfo"):
            info.unlink()
    else:
        raise AssertionError(case)


@pytest.mark.parametrize("case", ["nar files deleted", "narinfos deleted"])
def test_a_catalog_whose_entry_cannot_be_fetched_is_skipped_by_craft(a: Publisher, tmp_path: Path, case: str) -> None:
    cache = copy_of(a, tmp_path)
    broken(cache, case)
    env = {"FLAKEBOT_CATALOGS": trusting(cache, a.key)}
    installed = run_cli("install", "note", env=env)
    assert installed.returncode != 0 and "Traceback" not in installed.stderr, installed.stderr
    crafted = run_cli("craft", "need note", "--model", "scripted:/nonexistent/script.json", env=env)
    assert "Traceback" not in crafted.stderr
    assert crafted.returncode == PAST_THE_CATALOGS, crafted.stderr
    assert warned_skip(crafted.stderr, cache), crafted.stderr
