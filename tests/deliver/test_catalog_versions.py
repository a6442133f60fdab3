"""Versions in the catalog: each version in its own directory with its own flake, manifest and GC root;
NAME@VERSION to reach one; a format-1 catalog read as version 0.1.0 with its files left where they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog, normalize_need, show_tool
from flakebot.deliver.versions import next_version, parse_ref, version_key
from flakebot.errors import CatalogError, UsageError

NEED = "upper-case my input"


@pytest.fixture
def flake(tmp_path: Path) -> Path:
    directory = tmp_path / "flake"
    directory.mkdir()
    (directory / "flake.nix").write_text("{ }\n")
    return directory


def add(catalog: Catalog, flake: Path, run_id: str, change: str = "", version: str | None = None) -> dict[str, Any]:
    (flake / "built-by").write_text(run_id)  # which build a version directory holds
    return catalog.add(
        "shout",
        need=NEED,
        flake_dir=flake,
        manifest={"summary": f"shout from {run_id}"},
        usage_md=f"# shout ({run_id})\n",
        store_path=f"/nonexistent/{run_id}",
        run_id=run_id,
        origin={},
        version=version,
        change=change,
    )


def built_by(entry: dict[str, Any]) -> str:
    return (Path(entry["dir"]) / "flake" / "built-by").read_text()


def test_improvements_add_versions_and_every_version_stays_reachable(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    first = add(catalog, flake, "r1")
    assert first["version"] == "0.1.0" and Path(first["dir"]) == catalog.version_dir("shout", "0.1.0")
    # A plain re-craft of the same need replaces that craft: still one version.
    assert add(catalog, flake, "r2")["version"] == "0.1.0"
    assert list(catalog.get("shout")["versions"]) == ["0.1.0"] and built_by(catalog.get("shout")) == "r2"

    assert catalog.version_for("shout", improving=True) == "0.2.0"
    improved = add(catalog, flake, "r3", change="also --exclaim", version="0.2.0")
    assert improved["version"] == "0.2.0" and improved["change"] == "also --exclaim"
    current = catalog.get("shout")
    assert current["version"] == "0.2.0" and current["run_id"] == "r3" and current["need"] == NEED
    old = catalog.get("shout@0.1.0")
    assert (old["version"], old["run_id"], built_by(old)) == ("0.1.0", "r2", "r2")
    assert (Path(old["dir"]) / "manifest.json").is_file() and Path(old["dir"]) != Path(current["dir"])
    # A plain re-craft now must not drop the improvement silently: it becomes the next version.
    assert catalog.version_for("shout") == "0.3.0"

    shown = show_tool("shout@0.1.0", config.load())
    assert shown["version"] == "0.1.0" and shown["current_version"] == "0.2.0"
    assert shown["usage_markdown"] == "# shout (r2)\n" and shown["manifest"]["summary"] == "shout from r2"
    assert [v["version"] for v in shown["versions"]] == ["0.1.0", "0.2.0"]

    with pytest.raises(CatalogError, match=r"shout has no version 0\.9\.0 \(it has 0\.1\.0, 0\.2\.0\)"):
        catalog.get("shout@0.9.0")
    with pytest.raises(UsageError, match="after @ comes a version like 0.2.0"):
        catalog.get("shout@latest")


def test_a_version_another_run_made_is_never_replaced_by_an_improvement(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    add(catalog, flake, "r1")
    add(catalog, flake, "r2", change="also --exclaim", version="0.2.0")
    with pytest.raises(CatalogError, match="made by another run"):
        add(catalog, flake, "r3", change="also --whisper", version="0.2.0")
    assert built_by(catalog.get("shout@0.2.0")) == "r2"
    # The same run (a resumed instruct stage) may write its version again.
    assert add(catalog, flake, "r2", change="also --exclaim", version="0.2.0")["run_id"] == "r2"


def test_removing_one_version_makes_the_newest_left_current(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    add(catalog, flake, "r1")
    add(catalog, flake, "r2", change="also --exclaim", version="0.2.0")
    gone = Path(catalog.get("shout@0.2.0")["dir"])
    assert catalog.remove("shout@0.2.0")["version"] == "0.2.0"
    assert not gone.exists() and catalog.get("shout")["version"] == "0.1.0" and catalog.get("shout")["run_id"] == "r1"
    catalog.remove("shout@0.1.0")  # the only one left: the tool goes
    assert catalog.tools() == {} and not catalog.tool_dir("shout").exists()


def test_a_format_1_catalog_reads_as_version_0_1_0_in_place(flake: Path) -> None:
    catalog = Catalog.open(config.load())
    flat = catalog.tool_dir("shout")
    (flat / "flake").mkdir(parents=True)
    (flat / "manifest.json").write_text(json.dumps({"summary": "old"}))
    (flat / "USAGE.md").write_text("# shout\n")
    (flat / "gcroot").symlink_to("/nonexistent/old")
    entry = {
        "name": "shout",
        "need": NEED,
        "need_key": normalize_need(NEED),
        "run_id": "r0",
        "store_path": "/x",
        "dir": str(flat),
    }
    catalog.index_path.write_text(json.dumps({"format": 1, "tools": {"shout": entry}}))

    assert catalog.get("shout")["version"] == "0.1.0" and catalog.get("shout@0.1.0")["dir"] == str(flat)
    add(catalog, flake, "r1", change="also --exclaim", version="0.2.0")
    assert not catalog.index_path.exists() and catalog.index_path.with_name("catalog.json.migrated").is_file()
    assert list(Catalog.open(config.load()).get("shout")["versions"]) == ["0.1.0", "0.2.0"]
    assert (flat / "manifest.json").is_file() and show_tool("shout@0.1.0", config.load())["manifest"][
        "summary"
    ] == "old"
    catalog.remove("shout@0.1.0")
    assert (
        not (flat / "manifest.json").exists() and not (flat / "gcroot").is_symlink() and not (flat / "flake").exists()
    )
    assert (catalog.version_dir("shout", "0.2.0") / "manifest.json").is_file()


def test_version_references_and_numbers() -> None:
    assert parse_ref("csv-dedup@0.10.0").version == "0.10.0" and parse_ref("csv-dedup").version is None
    assert str(parse_ref("csv-dedup@0.2.0")) == "csv-dedup@0.2.0"
    assert next_version("0.1.0") == "0.2.0" and next_version("1.9.3") == "1.10.0"
    assert sorted(["0.10.0", "0.9.0", "0.2.0"], key=version_key) == ["0.2.0", "0.9.0", "0.10.0"]
