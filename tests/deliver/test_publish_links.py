"""`flakebot publish --to file:///CACHE` into a cache whose owner planted links (nar/, nix-cache-info, a narinfo):
`nix copy` runs as the user (root here), so it must never write into the cache itself. Judged from outside: the
directory or file a link names keeps its contents, and the tool is still published (a second store fetches it)."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog
from tests.conftest import require, run_cli

NIX = ["nix", "--extra-experimental-features", "nix-command flakes"]


def note_tool(tmp_path: Path) -> str:
    """A catalogued tool whose store path is a small file (nix-store --add): real and publishable. Its store path."""
    note = tmp_path / "note.txt"
    note.write_text(f"a published note {secrets.token_hex(6)}\n")  # a path no earlier cache already holds
    added = subprocess.run(["nix-store", "--add", str(note)], capture_output=True, text=True, check=True)
    store_path = added.stdout.strip()
    (tmp_path / "flake").mkdir()
    manifest = {"name": "note", "summary": "a note", "main_program": "note", "store_path": store_path}
    Catalog.open(config.load()).add(
        "note",
        need="need a note",
        flake_dir=tmp_path / "flake",
        manifest=manifest,
        usage_md="# note\n",
        store_path=store_path,
        run_id="test",
        origin={},
    )
    return store_path


def plant(tmp_path: Path, case: str, store_path: str) -> tuple[Path, Path, Callable[[], bool]]:
    """A cache directory with `case` planted, the host place its link names, and a check that the place is untouched."""
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    cache.mkdir()
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("host file\n")
    digest = Path(store_path).name.split("-", 1)[0]
    if case == "nar dir link":
        (cache / "nar").symlink_to(outside)
    elif case == "nix-cache-info dangling link":
        (cache / "nix-cache-info").symlink_to(outside / "made-by-nix")
    elif case == "nix-cache-info link to a file":
        (cache / "nix-cache-info").symlink_to(victim)
    elif case == "narinfo dangling link":
        (cache / f"{digest}.narinfo").symlink_to(outside / "made-by-nix")
    elif case == "log dir link":
        (cache / "log").symlink_to(outside)
    elif case in ("nar file hard link", "nar file dangling link"):
        # the NAR's name is its compressed hash: a cache owner who has the path can predict it
        scratch = tmp_path / "scratch-cache"
        subprocess.run([*NIX, "copy", "--to", scratch.as_uri(), store_path], capture_output=True, check=True)
        (name,) = os.listdir(scratch / "nar")
        (cache / "nar").mkdir()
        if case == "nar file hard link":
            os.link(victim, cache / "nar" / name)
        else:
            (cache / "nar" / name).symlink_to(outside / "made-by-nix")
    else:
        raise AssertionError(case)
    return cache, outside, lambda: sorted(os.listdir(outside)) == ["victim"] and victim.read_text() == "host file\n"


CASES = [
    "nar dir link",
    "nix-cache-info dangling link",
    "nix-cache-info link to a file",
    "narinfo dangling link",
    "log dir link",
    "nar file hard link",
    "nar file dangling link",
]


@pytest.mark.parametrize("case", CASES)
def test_nix_copy_never_writes_where_a_planted_link_points(tmp_path: Path, case: str) -> None:
    require("nix")
    store_path = note_tool(tmp_path)
    cache, outside, untouched = plant(tmp_path, case, store_path)
    done = run_cli("publish", "note", "--to", cache.as_uri())
    assert untouched(), (case, sorted(os.listdir(outside)), done.stderr[-800:])
    if case == "nar dir link":  # flakebot cannot put the NAR files where a consumer finds them: one line, exit 2
        assert done.returncode == 2, done.stderr
        assert "nar: is a symbolic link" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    digest = Path(store_path).name.split("-", 1)[0]
    narinfo = cache / f"{digest}.narinfo"
    if case != "nar file hard link":  # a regular file there is kept (a hard-linked NAR too, as nix keeps it)
        assert narinfo.is_file() and not narinfo.is_symlink()
        other = tmp_path / "other-store"
        fetched = subprocess.run(
            [*NIX, "copy", "--from", cache.as_uri(), "--no-check-sigs", "--store", str(other), store_path],
            capture_output=True,
            text=True,
        )
        assert fetched.returncode == 0, fetched.stderr
