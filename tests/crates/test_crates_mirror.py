"""The local crates.io (flakebot.crates.mirror): real cargo, real Debian crates, a server on 127.0.0.1, no mocks."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flakebot.config import Settings
from flakebot.crates.cratesio import CratesIo
from flakebot.crates.mirror import Mirror, pack_crate, serve_mirror
from flakebot.errors import AcquireError
from tests.conftest import DEBIAN_REGISTRY, require

CRATES_IO_SOURCE = "registry+https://github.com/rust-lang/crates.io-index"

TINY_MANIFEST = """\
[package]
name = "mirror-tiny"
version = "0.1.0"
edition = "2021"
rust-version = "1.60"
links = "tiny"
build = "build.rs"

[dependencies]
core_csv = { package = "csv-core", version = "0.1", default-features = false }
itoa = { version = "1", optional = true }

[target.'cfg(unix)'.dependencies]
libc = "0.2"

[dev-dependencies]
ryu = ">= 1.0, < 2"

[build-dependencies]
autocfg = "1.1"

[features]
default = ["std"]
std = []
fast = ["dep:itoa"]
"""

TINY_LIB = """\
pub fn answer() -> i32 {
    let _reader = core_csv::Reader::new(); // the dependency renamed in Cargo.toml
    if unsafe { libc::getpid() } > 0 { 42 } else { 0 }
}
"""

APP_MAIN = """\
fn main() {
    let mut reader = csv::Reader::from_reader("a,b\\n1,2\\n3,4\\n".as_bytes());
    println!("{} records, answer {}", reader.records().count(), mirror_tiny::answer());
}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A crate of our own, as a test would write it, with every kind of dependency the index format knows."""
    crate = tmp_path / "crates" / "mirror-tiny-0.1.0"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(TINY_MANIFEST)
    (crate / "build.rs").write_text('fn main() { println!("cargo:rerun-if-changed=build.rs"); }\n')
    (crate / "src/lib.rs").write_text(TINY_LIB)
    (crate / ".cargo-checksum.json").write_text('{"package":"","files":{}}')
    (crate / "run.sh").write_text("#!/bin/sh\n")
    (crate / "run.sh").chmod(0o755)
    return crate


@pytest.fixture
def app(tmp_path: Path) -> Path:
    """A binary crate that needs csv (Debian's csv 1.x, with its dependencies) and mirror-tiny."""
    crate = tmp_path / "app"
    (crate / "src").mkdir(parents=True)
    manifest = '[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n'
    (crate / "Cargo.toml").write_text(manifest + 'csv = "1"\nmirror-tiny = "0.1"\n')
    (crate / "src/main.rs").write_text(APP_MAIN)
    return crate


@pytest.fixture
def mirror(tiny: Path) -> Iterator[Mirror]:
    with serve_mirror([DEBIAN_REGISTRY, tiny.parent]) as running:
        yield running


def cargo(mirror: Mirror, home: Path, cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Real cargo with its own CARGO_HOME and crates-io replaced by the mirror."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CARGO_")}
    env |= {"CARGO_HOME": str(home), "CARGO_TERM_COLOR": "never"}
    command = ["cargo", *mirror.cargo_config(), *args]
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"cargo {' '.join(args)} exited {result.returncode}\n{result.stderr}")
    return result


def lock_packages(crate: Path) -> dict[str, dict]:
    lock = tomllib.loads((crate / "Cargo.lock").read_text())
    return {f"{p['name']}-{p['version']}": p for p in lock["package"] if "source" in p}


# ---------------------------------------------------------------- the pieces, over HTTP


def test_a_crate_is_packed_the_same_every_time_under_its_prefix(tiny: Path) -> None:
    packed = pack_crate(tiny, "mirror-tiny", "0.1.0")
    assert packed == pack_crate(tiny, "mirror-tiny", "0.1.0")
    assert gzip.decompress(packed)  # a real gzip stream
    with tarfile.open(fileobj=io.BytesIO(packed), mode="r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and all(n.startswith("mirror-tiny-0.1.0/") for n in names)
    assert "mirror-tiny-0.1.0/.cargo-checksum.json" not in names and "mirror-tiny-0.1.0/src/lib.rs" in names
    assert {(m.mtime, m.uid, m.gid, m.isfile()) for m in members} == {(0, 0, 0, True)}
    assert {m.name.rsplit("/", 1)[1]: m.mode for m in members}["run.sh"] == 0o755


def test_the_index_line_follows_cargos_registry_format(mirror: Mirror) -> None:
    assert httpx.get(f"{mirror.url}/index/config.json").json() == {
        "dl": f"{mirror.url}/api/v1/crates",
        "api": mirror.url,
    }
    response = httpx.get(f"{mirror.url}/index/mi/rr/mirror-tiny")
    [line] = response.text.splitlines()
    crate = httpx.get(f"{mirror.url}/crates/mirror-tiny/mirror-tiny-0.1.0.crate").content
    dep = {"features": [], "optional": False, "default_features": True, "target": None, "registry": None}
    assert json.loads(line) == {
        "name": "mirror-tiny",
        "vers": "0.1.0",
        "deps": [
            {
                **dep,
                "name": "core_csv",
                "package": "csv-core",
                "req": "^0.1",
                "default_features": False,
                "kind": "normal",
            },
            {**dep, "name": "itoa", "req": "^1", "optional": True, "kind": "normal"},
            {**dep, "name": "ryu", "req": ">=1.0, <2", "kind": "dev"},
            {**dep, "name": "autocfg", "req": "^1.1", "kind": "build"},
            {**dep, "name": "libc", "req": "^0.2", "target": "cfg(unix)", "kind": "normal"},
        ],
        "cksum": hashlib.sha256(crate).hexdigest(),
        "features": {"default": ["std"], "std": []},
        "features2": {"fast": ["dep:itoa"]},
        "v": 2,
        "yanked": False,
        "links": "tiny",
        "rust_version": "1.60",
    }
    assert httpx.get(f"{mirror.url}/index/mirror-tiny").status_code == 404  # only cargo's layout
    assert httpx.get(f"{mirror.url}/index/3/c/csv").status_code == 200
    etag = httpx.get(f"{mirror.url}/index/3/c/csv").headers["ETag"]
    assert httpx.get(f"{mirror.url}/index/3/c/csv", headers={"If-None-Match": etag}).status_code == 304


def test_api_search_crate_version_and_download_in_crates_io_shapes(mirror: Mirror) -> None:
    found = httpx.get(f"{mirror.url}/api/v1/crates", params={"q": "csv", "per_page": 1}).json()
    [first] = found["crates"]
    assert (first["name"], first["max_version"], first["exact_match"]) == ("csv", "1.1.6", True)
    assert found["meta"]["total"] >= 2 and found["meta"]["next_page"] == "?q=csv&page=2&per_page=1"
    second = httpx.get(f"{mirror.url}/api/v1/crates{found['meta']['next_page']}").json()["crates"]
    assert [c["name"] for c in second] == ["csv-core"]
    crate = httpx.get(f"{mirror.url}/api/v1/crates/csv").json()
    assert crate["crate"]["keywords"] == ["csv", "comma", "parser", "delimited", "serde"]
    assert [v["num"] for v in crate["versions"]] == ["1.1.6"]
    version = httpx.get(f"{mirror.url}/api/v1/crates/csv/1.1.6").json()["version"]
    download = httpx.get(f"{mirror.url}{version['dl_path']}")
    assert download.status_code == 302 and download.headers["Location"] == f"{mirror.url}/crates/csv/csv-1.1.6.crate"
    body = httpx.get(download.headers["Location"]).content
    assert hashlib.sha256(body).hexdigest() == version["checksum"] and len(body) == version["crate_size"]
    missing = httpx.get(f"{mirror.url}/api/v1/crates/no-such-crate-xyz")
    assert missing.status_code == 404
    assert missing.json() == {"errors": [{"detail": "crate `no-such-crate-xyz` does not exist"}]}
    assert mirror.downloads == ["csv-1.1.6"]


def test_flakebot_crates_io_client_searches_and_downloads_from_the_mirror(mirror: Mirror, tmp_path: Path) -> None:
    urls = {
        "cratesio_api_url": mirror.url,
        "cratesio_static_url": mirror.url,
        "cratesio_index_url": f"{mirror.url}/index",
    }
    client = CratesIo(Settings(**urls, cratesio_interval=0.0))  # type: ignore[arg-type]
    best = client.search("csv")[0].crate
    assert (best.name, best.version, best.license, best.has_lib) == ("csv", "1.1.6", "Unlicense/MIT", True)
    assert client.download("csv", "1.1.6", tmp_path / "dl").name == "csv-1.1.6.crate"
    mirror.corrupt.add("csv-core-0.1.6")
    with pytest.raises(AcquireError, match="failed its checksum"):
        client.download("csv-core", "0.1.6", tmp_path / "dl")


def test_the_command_line_serves_a_source_until_stopped(tiny: Path) -> None:
    command = [sys.executable, "-m", "flakebot.crates.mirror", str(tiny), "--corrupt", "mirror-tiny-0.1.0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as server:
        try:
            assert server.stdout is not None
            first = server.stdout.readline()
            assert first.startswith("serving 1 crates at http://127.0.0.1:")
            url = first.split()[-1]
            assert "source.crates-io.replace-with=" in server.stdout.readline()
            index = httpx.get(f"{url}/index/mi/rr/mirror-tiny").json()
            crate = httpx.get(f"{url}/crates/mirror-tiny/mirror-tiny-0.1.0.crate").content
            assert index["name"] == "mirror-tiny" and hashlib.sha256(crate).hexdigest() != index["cksum"]
        finally:
            server.terminate()
    refused = subprocess.run([*command[:3], str(tiny), "--host", "0.0.0.0"], capture_output=True, text=True)
    assert refused.returncode == 2 and "loopback addresses only" in refused.stderr


# ---------------------------------------------------------------- real cargo


@pytest.mark.slow
def test_cargo_locks_fetches_and_builds_through_the_mirror(mirror: Mirror, app: Path, tmp_path: Path) -> None:
    require("cargo")
    home = tmp_path / "cargo-home"
    cargo(mirror, home, app, "generate-lockfile")
    locked = lock_packages(app)
    assert {"csv-1.1.6", "csv-core-0.1.6", "mirror-tiny-0.1.0", "libc-0.2.139"} <= locked.keys()
    for key, package in locked.items():
        entry = mirror.store.find(package["name"], package["version"])
        assert entry is not None and package["checksum"] == mirror.store.cksum(entry), key
        assert len(package["checksum"]) == 64 and package["source"] == CRATES_IO_SOURCE
    # real names for renamed deps; cfg(unix) and build deps kept, dev and unused optional ones left out
    assert set(locked["mirror-tiny-0.1.0"]["dependencies"]) == {"autocfg", "csv-core", "libc"}
    assert mirror.downloads == []
    cargo(mirror, home, app, "fetch")
    assert sorted(mirror.downloads) == sorted(locked)
    run = cargo(mirror, home, app, "run", "--offline", "--quiet")
    assert run.stdout.strip() == "2 records, answer 42"


@pytest.mark.slow
def test_a_second_fetch_with_the_same_cargo_home_downloads_nothing(mirror: Mirror, app: Path, tmp_path: Path) -> None:
    require("cargo")
    home = tmp_path / "cargo-home"
    cargo(mirror, home, app, "fetch")
    first = mirror.downloads
    assert "csv-1.1.6" in first
    seen = len(mirror.requests)
    cargo(mirror, home, app, "fetch")
    assert mirror.downloads == first
    assert not [r for r in mirror.requests[seen:] if r.path.endswith((".crate", "/download"))]


@pytest.mark.slow
def test_cargo_add_finds_crates_in_the_mirror_and_reports_missing_ones(mirror: Mirror, tmp_path: Path) -> None:
    require("cargo")
    home, crate = tmp_path / "cargo-home", tmp_path / "adder"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "adder"\nversion = "0.1.0"\nedition = "2021"\n')
    (crate / "src/lib.rs").write_text("")
    cargo(mirror, home, crate, "add", "csv")
    assert tomllib.loads((crate / "Cargo.toml").read_text())["dependencies"] == {"csv": "1.1.6"}
    missing = cargo(mirror, home, crate, "add", "no-such-crate-xyz", check=False)
    assert missing.returncode != 0
    assert "the crate `no-such-crate-xyz` could not be found in registry index" in missing.stderr


@pytest.mark.slow
def test_a_corrupted_crate_fails_cargo_fetch_on_its_checksum(tiny: Path, app: Path, tmp_path: Path) -> None:
    require("cargo")
    home = tmp_path / "cargo-home"
    with serve_mirror([DEBIAN_REGISTRY, tiny.parent], corrupt={"csv-1.1.6"}) as mirror:
        cargo(mirror, home, app, "generate-lockfile")  # the index still vouches for the true bytes
        fetch = cargo(mirror, home, app, "fetch", check=False)
    assert fetch.returncode != 0
    assert "failed to verify the checksum of `csv v1.1.6" in fetch.stderr
    assert not list(home.glob("registry/src/*/csv-1.1.6"))
