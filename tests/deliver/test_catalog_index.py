"""The catalog's index (catalog.db): catalog.json moved in once, concurrent writers all landing, a writer killed
mid-add losing nothing it committed, a newer or damaged index refused in one error, and the MCP definitions kept
against each entry."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog, normalize_need
from flakebot.deliver.definitions import catalog_definitions
from flakebot.errors import CatalogError, HostError

# A child process's adds: one tool per name given, each printed once its add returned.
ADDS = """
import sys
from pathlib import Path
from flakebot import config
from flakebot.deliver.catalog import Catalog

flake = Path(sys.argv[1])
catalog = Catalog.open(config.load())
for name in sys.argv[2:]:
    if name.startswith("publish:"):
        tool, url = name.split(":", 2)[1:]
        catalog.update(tool, published={url: {"by": url}})
    else:
        catalog.add(name, need=f"{name} things", flake_dir=flake, manifest={"name": name, "summary": name},
                    usage_md=f"# {name}\\n", store_path="/nonexistent/" + name, run_id="r-" + name, origin={})
    print(name, flush=True)
"""


@pytest.fixture
def flake(tmp_path: Path) -> Path:
    directory = tmp_path / "flake"
    directory.mkdir()
    (directory / "flake.nix").write_text("{ }\n")
    return directory


def adder(flake: Path, names: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", ADDS, str(flake), *names], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def complete(entry: dict[str, Any]) -> bool:
    directory = Path(entry["dir"])
    return all((directory / f).exists() for f in ("flake/flake.nix", "manifest.json", "USAGE.md")) and (
        (directory / "gcroot").is_symlink()
    )


def legacy_entry(catalog: Catalog, name: str) -> dict[str, Any]:
    """A format-2 entry as catalog.json held it, with its version directory."""
    directory = catalog.version_dir(name, "0.1.0")
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({"name": name, "summary": "old"}))
    record = {"version": "0.1.0", "summary": "old", "run_id": "r0", "store_path": "/x", "dir": str(directory)}
    need = f"{name} things"
    return {"name": name, "need": need, "need_key": normalize_need(need), **record, "versions": {"0.1.0": record}}


def test_a_format_2_catalog_json_moves_into_the_index_once(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    catalog.root.mkdir(parents=True)
    tools = {name: legacy_entry(catalog, name) for name in ("alpha", "beta")}
    catalog.index_path.write_text(json.dumps({"format": 2, "tools": tools, "published": {}}))

    assert catalog.tools() == tools and catalog.get("beta@0.1.0")["run_id"] == "r0"
    assert not catalog.index_path.exists()
    kept = catalog.index_path.with_name("catalog.json.migrated")
    assert json.loads(kept.read_text())["tools"] == tools  # kept as it was, never read again
    kept.rename(catalog.index_path)  # an older flakebot's file appearing later is not read over the index
    catalog.remove("alpha")
    assert sorted(Catalog.open(config.load()).tools()) == ["beta"]


def test_a_corrupt_catalog_json_is_one_error_and_is_read_once_repaired(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    catalog.root.mkdir(parents=True)
    catalog.index_path.write_text('{"format": 2, "tools": {"al')
    with pytest.raises(CatalogError, match="catalog.json is corrupt"):
        catalog.tools()
    with pytest.raises(CatalogError, match="catalog.json is corrupt"):
        catalog.add(
            "gamma", need="g", flake_dir=flake, manifest={}, usage_md="", store_path="/x", run_id="r", origin={}
        )
    catalog.index_path.write_text(json.dumps({"format": 2, "tools": {"alpha": legacy_entry(catalog, "alpha")}}))
    assert list(catalog.tools()) == ["alpha"]


def test_a_catalog_never_written_creates_nothing_when_read() -> None:
    catalog = Catalog.open(config.load())
    assert catalog.tools() == {} and catalog.find_need("anything") is None and catalog.version_for("x") == "0.1.0"
    with pytest.raises(CatalogError, match="no tool 'x' in the catalog"):
        catalog.get("x")
    assert not catalog.root.exists()


def test_an_index_from_a_newer_flakebot_is_refused(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    catalog.add("alpha", need="a", flake_dir=flake, manifest={}, usage_md="", store_path="/x", run_id="r", origin={})
    with sqlite3.connect(catalog.index.path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(CatalogError, match="format 99, newer than this flakebot reads"):
        catalog.get("alpha")


def test_concurrent_writers_all_land(flake: Path) -> None:
    """Four processes add ten tools each while two publish the first tool to different caches: every add and
    both publications are there, each tool's directory whole."""
    catalog = Catalog.open(config.load())
    catalog.add("first", need="f", flake_dir=flake, manifest={}, usage_md="", store_path="/x", run_id="r", origin={})
    batches = [[f"tool-{w}-{n}" for n in range(10)] for w in range(4)]
    writers = [adder(flake, names) for names in batches]
    writers += [adder(flake, ["publish:first:file:///a"]), adder(flake, ["publish:first:file:///b"])]
    outcomes = [w.communicate(timeout=300) for w in writers]
    assert [w.returncode for w in writers] == [0] * 6, [err[-1000:] for _, err in outcomes]

    tools = catalog.tools()
    assert sorted(tools) == sorted(["first", *(n for names in batches for n in names)])
    assert all(complete(entry) for name, entry in tools.items() if name != "first")
    assert set(tools["first"]["published"]) == {"file:///a", "file:///b"}
    assert not any((catalog.root / "tools/.staging").iterdir())


def test_a_writer_killed_mid_add_loses_nothing_it_committed(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    writer = adder(flake, [f"tool-{n}" for n in range(500)])
    assert writer.stdout is not None
    done = [writer.stdout.readline().strip() for _ in range(8)]
    os.kill(writer.pid, signal.SIGKILL)
    writer.communicate(timeout=60)

    tools = catalog.tools()
    assert set(done) <= set(tools) and all(complete(entry) for entry in tools.values())
    with sqlite3.connect(catalog.index.path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # the lock died with the writer: the next add goes through, and a half-placed version is replaced
    catalog.add("tool-499", need="tool-499 things", flake_dir=flake, manifest={"summary": "after"}, usage_md="",
                store_path="/x", run_id="r", origin={})  # fmt: skip
    assert complete(catalog.get("tool-499")) and len(catalog.tools()) == len(tools) + 1


def test_a_catalog_removed_underneath_is_read_as_it_is_now(flake: Path) -> None:
    """A thread keeps its connection open; a catalog.db removed (or replaced) under it is not read through it."""
    catalog = Catalog.open(config.load())
    catalog.add("alpha", need="a", flake_dir=flake, manifest={}, usage_md="", store_path="/x", run_id="r", origin={})
    assert list(catalog.tools()) == ["alpha"]
    shutil.rmtree(catalog.root)
    assert catalog.tools() == {}
    catalog.add("beta", need="b", flake_dir=flake, manifest={}, usage_md="", store_path="/x", run_id="r", origin={})
    assert list(Catalog.open(config.load()).tools()) == ["beta"]


def test_definitions_are_made_once_per_change_and_services_and_broken_entries_left_out(
    flake: Path, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = Catalog.open(config.load())

    def add(name: str, **manifest: Any) -> None:
        manifest = {"name": name, "summary": f"{name} things", "nix_run_argv": ["nix", "run", "x"], **manifest}
        catalog.add(name, need=f"{name} things", flake_dir=flake, manifest=manifest, usage_md="", store_path="/x",
                    run_id="r", origin={})  # fmt: skip

    add("alpha")
    add("kv", kind="service")
    add("broken", nix_run_argv=[])
    first = catalog_definitions(catalog)
    assert [d["name"] for d in first] == ["alpha"] and "tool broken left out of the tool list" in caplog.text
    assert catalog_definitions(catalog)[0] is first[0]  # unchanged: the same definition, not made again
    add("alpha", summary="alpha, better")  # the same need crafted again: a new entry
    again = catalog_definitions(catalog)
    assert again[0] is not first[0] and "alpha, better" in again[0]["description"]


def test_a_catalog_on_a_read_only_mount_is_read_and_refuses_changes_in_one_line(flakebot_home: Path) -> None:
    """A catalog on a read-only file system (a shared mount): `list` and `show` read it (SQLite opens it
    immutable, and the definitions it cannot store stay in the process), `rm` is refused in one line naming the
    read-only catalog and removes nothing; never "remove catalog.db", the words for a damaged one."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    from benchmarks.scenarios.many_tools import Tools, store_path
    from tests.commands.test_runs_and_setup import _read_only
    from tests.conftest import json_result, run_cli

    tools = Tools(flakebot_home, store_path(flakebot_home, nix=False))
    tools.grow(2)
    catalog = tools.catalog.root
    with _read_only(catalog):
        listed = run_cli("list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert [t["name"] for t in json_result(listed)["tools"]] == ["t00001", "t00002"]
        assert run_cli("show", "t00001").returncode == 0
        removed = run_cli("rm", "t00001")
        assert removed.returncode == CatalogError.exit_code and "Traceback" not in removed.stderr, removed.stderr
        [line] = removed.stderr.strip().splitlines()
        assert f"catalog {catalog} is read-only here" in line and "remove it" not in line, line
    assert (catalog / "tools" / "t00001").is_dir() and sorted(Catalog(catalog).tools()) == ["t00001", "t00002"]


def test_a_closed_catalog_on_a_read_only_mount_is_read_without_its_lock_files(flake: Path, tmp_path: Path) -> None:
    """A catalog whose writers all ended (SQLite removed its -wal and -shm files) on a read-only mount: nobody can
    write it, so it is read as immutable."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    from tests.commands.test_runs_and_setup import _read_only
    from tests.conftest import json_result, run_cli

    adding = adder(flake, ["alpha", "beta"])
    _, errors = adding.communicate(timeout=60)
    assert adding.returncode == 0, errors
    catalog = Catalog.open(config.load()).root
    assert not (catalog / "catalog.db-wal").exists() and not (catalog / "catalog.db-shm").exists()
    with _read_only(catalog):
        listed = run_cli("list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert sorted(t["name"] for t in json_result(listed)["tools"]) == ["alpha", "beta"]


def test_publish_from_a_read_only_catalog_is_refused_before_a_key_or_a_copy(flakebot_home: Path) -> None:
    """`publish` records the publication in the catalog: on a read-only one it is refused in one line (exit 60)
    before it makes a signing key in it (was an OSError traceback) or copies anything to the cache."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    from benchmarks.scenarios.many_tools import Tools, store_path
    from tests.commands.test_runs_and_setup import _read_only
    from tests.conftest import run_cli

    tools = Tools(flakebot_home, store_path(flakebot_home, nix=False))
    tools.grow(1)
    catalog, cache = tools.catalog.root, flakebot_home / "cache-out"
    with _read_only(catalog):
        ran = run_cli("publish", "t00001", "--to", f"file://{cache}")
        assert ran.returncode == CatalogError.exit_code and "Traceback" not in ran.stderr, ran.stderr[-600:]
        [line] = ran.stderr.strip().splitlines()
        assert f"catalog {catalog} is read-only here" in line, line
    assert not (catalog / "keys").exists() and not cache.exists()


def test_a_read_only_catalog_whose_wal_cannot_be_read_is_refused_not_read_stale(flakebot_home: Path) -> None:
    """catalog.db with a -wal holding commits but no -shm beside it (copied without it) on a read-only mount:
    SQLite can read the WAL only through a -shm it cannot make there, and immutable mode would read catalog.db
    without the WAL, an older catalog. That is refused in one line (a tool removed still listed, before)."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    import shutil
    import sqlite3

    from benchmarks.scenarios.many_tools import Tools, store_path
    from tests.commands.test_runs_and_setup import _read_only
    from tests.conftest import run_cli

    tools = Tools(flakebot_home, store_path(flakebot_home, nix=False))
    tools.grow(2)
    catalog, copy = tools.catalog.root, flakebot_home / "copy"
    holder = sqlite3.connect(catalog / "catalog.db")  # open, so the rm's commit stays in the WAL
    holder.execute("PRAGMA wal_autocheckpoint = 0")
    holder.execute("SELECT count(*) FROM tools").fetchone()
    assert run_cli("rm", "t00002").returncode == 0
    copy.mkdir()
    for name in ("catalog.db", "catalog.db-wal"):
        shutil.copy(catalog / name, copy / name)
    holder.close()
    with _read_only(copy):
        listed = run_cli("list", "--json", env={"FLAKEBOT_CATALOG_DIR": str(copy)})
        assert listed.returncode == CatalogError.exit_code and "Traceback" not in listed.stderr, listed.stdout
        [line] = listed.stderr.strip().splitlines()
        assert "catalog.db-wal" in line and "remove it" not in line, line


@pytest.mark.slow
def test_package_service_into_a_read_only_catalog_is_refused_before_its_build(flakebot_home: Path) -> None:
    """package-service catalogs what it builds: into a read-only catalog it is refused in one line (exit 60) before
    a run, a build or a lifecycle check, as package --catalog is (was an OSError traceback at the catalog's staging copy, after them)."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    from benchmarks.scenarios.many_tools import Tools, store_path
    from tests.commands.test_runs_and_setup import _read_only
    from tests.conftest import REPO, run_cli

    tools = Tools(flakebot_home, store_path(flakebot_home, nix=False))
    tools.grow(1)
    catalog, runs = tools.catalog.root, flakebot_home / "work" / "runs"
    with _read_only(catalog):
        ran = run_cli(
            "package-service", str(REPO / "tests" / "fixtures" / "kv-service"), "--offline", "--name", "kv-ro"
        )
        assert ran.returncode == HostError.exit_code and "Traceback" not in ran.stderr, ran.stderr[-600:]
        [line] = ran.stderr.strip().splitlines()  # as package --catalog says it
        assert f"catalog_dir {catalog} is not writable (Read-only file system)" in line, line
    assert not runs.exists() or list(runs.iterdir()) == []
    assert sorted(Catalog(catalog).tools()) == ["t00001"]
