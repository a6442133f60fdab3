"""The local directory-source registry against Debian's real packaged crates and synthetic sources."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest

from flakebot.cargo.runner import cargo_program
from flakebot.crates.local import LocalRegistry
from flakebot.errors import SearchError
from tests.conftest import DEBIAN_REGISTRY


def write_crate(
    root: Path, name: str, version: str = "0.1.0", manifest_extra: str = "", files: tuple[str, ...] = ("src/lib.rs",), package_extra: str = ""
) -> Path:
    directory = root / f"{name}-{version}"
    directory.mkdir(parents=True)
    (directory / "Cargo.toml").write_text(f'[package]\nname = "{name}"\nversion = "{version}"\nedition = "2021"\n{package_extra}\n{manifest_extra}')
    for rel in files:
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text("fn main() {}\n" if "main" in rel or "bin" in rel else "pub fn f() {}\n")
    return directory


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A directory source covering each way a crate declares binaries, a library and dependencies."""
    root = tmp_path / "source"
    write_crate(root, "plainlib", package_extra='description = "A plain library"\nlicense = "MIT"')
    write_crate(root, "mainbin", files=("src/main.rs",), package_extra='description = "Has a main.rs"')
    write_crate(root, "multibin", files=("src/lib.rs", "src/main.rs", "src/bin/alpha.rs", "src/bin/beta/main.rs"))
    write_crate(root, "explicit", manifest_extra='[[bin]]\nname = "renamed"\npath = "src/main.rs"\n', files=("src/main.rs", "src/bin/extra.rs"))
    write_crate(root, "noauto", package_extra="autobins = false", files=("src/lib.rs", "src/main.rs", "src/bin/hidden.rs"))
    write_crate(root, "macro", manifest_extra="[lib]\nproc-macro = true\n")
    deps = '[dependencies]\nserde = "1"\nrenamed_json = { package = "serde_json", version = "1" }\n[target."cfg(unix)".dependencies]\nlibc = "0.2"\n'
    write_crate(root, "withdeps", manifest_extra=deps, package_extra='license-file = "LICENSE"')
    return root


def test_debian_registry_real_metadata(tmp_path: Path) -> None:
    registry = LocalRegistry(DEBIAN_REGISTRY, tmp_path / "cache")
    assert len(registry.entries()) > 100
    hexyl = registry.get("hexyl")
    assert (hexyl.version, hexyl.bin_names, hexyl.has_lib, hexyl.source) == ("0.8.0", ["hexyl"], True, "local")
    assert hexyl.path == str(DEBIAN_REGISTRY / "hexyl-0.8.0") and "clap" in hexyl.dependencies
    assert hexyl.description == "A command-line hex viewer" and hexyl.repository == "https://github.com/sharkdp/hexyl"
    csv = registry.get("csv")
    assert csv.bin_names == [] and csv.has_lib and "csv" in csv.keywords
    assert registry.get("clap_derive").proc_macro
    assert registry.get("clap").version == "4.0.32" and registry.get("clap", "2.34.0").version == "2.34.0"


def test_binaries_agree_with_cargo_metadata(source: Path, tmp_path: Path) -> None:
    """Our reading of [[bin]], autobins and src/ conventions matches what cargo itself reports."""
    registry = LocalRegistry(source, tmp_path / "cache")
    crates = [*registry.entries(), *(LocalRegistry(DEBIAN_REGISTRY, tmp_path / "c2").get(n) for n in ("hexyl", "os_pipe", "assert_cmd", "cpp_demangle", "csv"))]
    for crate in crates:
        meta = subprocess.run(
            [cargo_program(), "metadata", "--no-deps", "--format-version", "1", "--offline"], cwd=crate.path, capture_output=True, text=True, check=True
        )
        targets = json.loads(meta.stdout)["packages"][0]["targets"]
        bins = sorted(t["name"] for t in targets if "bin" in t["kind"])
        has_lib = any(k in ("lib", "rlib", "proc-macro") for t in targets for k in t["kind"])
        assert (crate.name, sorted(crate.bin_names), crate.has_lib) == (crate.name, bins, has_lib)


def test_synthetic_source_fields(source: Path, tmp_path: Path) -> None:
    registry = LocalRegistry(source, tmp_path / "cache")
    assert registry.get("multibin").bin_names == ["multibin", "alpha", "beta"]
    assert registry.get("explicit").bin_names == ["renamed", "extra"]
    assert registry.get("noauto").bin_names == []
    assert registry.get("mainbin").has_lib is False and registry.get("mainbin").bin_names == ["mainbin"]
    assert registry.get("macro").proc_macro and not registry.get("plainlib").proc_macro
    withdeps = registry.get("withdeps")
    assert withdeps.dependencies == ["libc", "serde", "serde_json"] and withdeps.license == "see LICENSE"
    assert [c.crate.name for c in registry.search("main.rs")] == ["mainbin"]


def test_broken_entries_are_skipped_with_a_warning(source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (source / "broken-1.0.0").mkdir()
    (source / "broken-1.0.0/Cargo.toml").write_text("[package\nname = ")
    (source / "workspace").mkdir()
    (source / "workspace/Cargo.toml").write_text('[workspace]\nmembers = ["a"]\n')
    (source / "notes").mkdir()
    with caplog.at_level(logging.WARNING, logger="flakebot.crates.local"):
        names = {c.name for c in LocalRegistry(source, tmp_path / "cache").entries()}
    assert "plainlib" in names and "broken" not in names and len(names) == 7
    assert "broken-1.0.0: unreadable Cargo.toml" in caplog.text and "workspace: Cargo.toml has no [package]" in caplog.text


def test_index_is_cached_and_rebuilt_when_the_source_changes(source: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    LocalRegistry(source, cache).entries()
    [index_file] = cache.glob("local-index-*.json")
    # Mark the cached entry: a second registry must read the cache, not the Cargo.toml files.
    data = json.loads(index_file.read_text())
    for entry in data["entries"]:
        entry["description"] = "FROM CACHE"
    index_file.write_text(json.dumps(data))
    assert LocalRegistry(source, cache).get("plainlib").description == "FROM CACHE"
    write_crate(source, "newcomer", package_extra='description = "Arrived later"')
    fresh = LocalRegistry(source, cache)
    assert fresh.get("newcomer").description == "Arrived later"
    assert fresh.get("plainlib").description == "A plain library"
    assert list(cache.glob("local-index-*.json")) == [index_file]


def test_corrupt_cache_is_rebuilt(source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "cache"
    LocalRegistry(source, cache).entries()
    [index_file] = cache.glob("local-index-*.json")
    index_file.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert LocalRegistry(source, cache).get("plainlib").description == "A plain library"
    assert "ignoring unreadable index cache" in caplog.text
    assert json.loads(index_file.read_text())["format"] == 1


@pytest.mark.parametrize("kind", ["missing", "file", "empty", "no-crates"])
def test_not_a_directory_source(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "reg"
    if kind == "file":
        path.write_text("x")
    elif kind == "empty":
        path.mkdir()
    elif kind == "no-crates":
        (path / "docs").mkdir(parents=True)
        (path / "README").write_text("x")
    with pytest.raises(SearchError) as info:
        LocalRegistry(path, tmp_path / "cache").search("csv")
    expected = {
        "missing": "does not exist",
        "file": "is not a directory",
        "empty": "is not a cargo directory source",
        "no-crates": "is not a cargo directory source",
    }
    assert expected[kind] in info.value.message and info.value.fix
    assert not any((tmp_path / "cache").glob("*")), "nothing is cached for a bad source"


def test_get_errors(tmp_path: Path) -> None:
    registry = LocalRegistry(DEBIAN_REGISTRY, tmp_path / "cache")
    with pytest.raises(SearchError, match="'nosuchcrate' is not in the local registry"):
        registry.get("nosuchcrate")
    with pytest.raises(SearchError, match=r"no version 9.9.9 .*have 2.34.0, (.*, )?4.0.32"):  # make setup may bring clap 3 too (cbindgen)
        registry.get("clap", "9.9.9")


@pytest.mark.parametrize(
    ("query", "expected", "within"),
    [
        ("csv", "csv", 1),
        ("hex dump viewer", "hexyl", 3),
        ("parse command line arguments", "clap", 3),
        ("temporary files", "tempfile", 1),
        ("JSON", "serde_json", 1),
    ],
)
def test_debian_search_quality(query: str, expected: str, within: int, tmp_path: Path) -> None:
    found = LocalRegistry(DEBIAN_REGISTRY, tmp_path / "cache").search(query)
    assert expected in [c.crate.name for c in found[:within]], [(c.crate.name, c.why) for c in found]
    assert len({c.crate.name for c in found}) == len(found)
