"""The crates.io client (real httpx) against a stand-in server on 127.0.0.1 serving real and synthetic bodies."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.crates.cratesio import CratesIo, Unreachable, sparse_path
from flakebot.crates.local import LocalRegistry
from flakebot.errors import AcquireError, SearchError
from tests.conftest import DEBIAN_REGISTRY
from tests.fakes.crates_server import CratesServer, Reply
from tests.fakes.fsyncs import recorded_fsyncs


@pytest.fixture
def server() -> Iterator[CratesServer]:
    with CratesServer() as running:
        yield running


def settings_for(server: CratesServer, **extra: object) -> Settings:
    base = {
        "cratesio_api_url": server.url,
        "cratesio_static_url": server.url,
        "cratesio_index_url": server.url,
        "cratesio_interval": 0.0,
        "cratesio_details": 0,
    }
    return Settings(**{**base, **extra})  # type: ignore[arg-type]


def search_body(*names: str, next_page: str | None = None) -> dict:
    crates = [
        {
            "name": n,
            "max_version": "1.0.0",
            "description": f"{n} handles csv files",
            "downloads": 10,
            "repository": None,
        }
        for n in names
    ]
    return {"crates": crates, "meta": {"total": 99, "next_page": next_page}}


def test_fixture_bodies_parse_into_the_local_result_type(server: CratesServer, tmp_path: Path) -> None:
    found = CratesIo(settings_for(server, contact="ops@example.org")).search("postgres")
    [best] = found
    info = best.crate
    assert (info.name, info.version, info.downloads, info.recent_downloads) == ("postgres", "0.17.3", 535491, 88321)
    assert info.repository == "https://github.com/sfackler/rust-postgres" and info.source == "crates-io"
    assert info.description == "A native, synchronous PostgreSQL client" and info.keywords == []
    assert best.why.startswith("exact name") and "535.5k downloads" in best.why
    local = LocalRegistry(DEBIAN_REGISTRY, tmp_path / "cache").search("csv")[0]
    assert type(best) is type(local) and type(info) is type(local.crate) is CrateInfo
    assert best.to_dict().keys() == local.to_dict().keys()
    [request] = server.requests("/api/v1/crates")
    assert request.path == "/api/v1/crates?q=postgres&per_page=30"
    assert request.headers["user-agent"].startswith("flakebot/") and "ops@example.org" in request.headers["user-agent"]


def test_version_fixture(server: CratesServer) -> None:
    info = CratesIo(settings_for(server)).version("foo", "1.0.0")
    assert (info.name, info.version, info.bin_names, info.has_lib, info.license, info.yanked) == (
        "foo",
        "1.0.0",
        ["bar", "foo"],
        True,
        "MIT",
        False,
    )
    assert info.checksum == "24666b3fb658f202e37e38e855f9db389441a47565669effd1513f647d93becb"


def test_get_merges_crate_and_version(server: CratesServer) -> None:
    crate = {"name": "foo", "max_version": "1.0.0", "description": "Foo tool", "keywords": ["foo"], "downloads": 7}
    versions = [
        {
            "num": "1.0.0",
            "crate": "foo",
            "bin_names": ["foo"],
            "has_lib": False,
            "license": "MIT",
            "checksum": "ab" * 32,
            "yanked": False,
        }
    ]
    server.route("/api/v1/crates/foo", Reply(body={"crate": crate, "versions": versions}))
    info = CratesIo(settings_for(server)).get("foo")
    assert (info.version, info.bin_names, info.has_lib, info.keywords, info.downloads, info.checksum) == (
        "1.0.0",
        ["foo"],
        False,
        ["foo"],
        7,
        "ab" * 32,
    )


def test_details_of_the_top_results_refine_the_ranking(server: CratesServer) -> None:
    server.route("/api/v1/crates", Reply(body=search_body("zcsvlib", "csvtool")))
    server.route(
        "/api/v1/crates/csvtool/1.0.0",
        Reply(body={"version": {"crate": "csvtool", "num": "1.0.0", "bin_names": ["csvtool"], "license": "MIT"}}),
    )
    plain = CratesIo(settings_for(server)).search("csv files", limit=2)
    assert [c.crate.name for c in plain] == ["zcsvlib", "csvtool"] and all(c.crate.bin_names == [] for c in plain)
    enriched = CratesIo(settings_for(server, cratesio_details=2)).search("csv files", limit=2)
    assert [c.crate.name for c in enriched] == ["csvtool", "zcsvlib"]
    assert (
        enriched[0].crate.bin_names == ["csvtool"]
        and enriched[0].crate.license == "MIT"
        and "bin csvtool" in enriched[0].why
    )
    assert len(server.requests("/api/v1/crates/zcsvlib/1.0.0")) == 1  # its 404 did not end the search


def test_next_page_is_followed(server: CratesServer) -> None:
    server.route(
        "/api/v1/crates?q=csv&per_page=30",
        Reply(body=search_body("csv-a", "csv-b", next_page="?q=csv&page=2&per_page=30")),
    )
    server.route("/api/v1/crates?q=csv&page=2&per_page=30", Reply(body=search_body("csv-c")))
    found = CratesIo(settings_for(server)).search("csv")
    assert sorted(c.crate.name for c in found) == ["csv-a", "csv-b", "csv-c"]
    assert [r.path for r in server.requests("/api/v1/crates")] == [
        "/api/v1/crates?q=csv&per_page=30",
        "/api/v1/crates?q=csv&page=2&per_page=30",
    ]


def test_crates_io_matches_without_visible_text_come_last(server: CratesServer) -> None:
    body = search_body("csv-a")
    body["crates"].insert(0, {"name": "tablekit", "max_version": "2.0.0", "description": "Spreadsheets, quickly"})
    server.route("/api/v1/crates", Reply(body=body))
    found = CratesIo(settings_for(server)).search("csv")
    assert [(c.crate.name, c.why) for c in found][1:] == [("tablekit", "matched by crates.io")]


def test_query_without_matches_for_all_words_tries_each_word(server: CratesServer) -> None:
    server.route("/api/v1/crates?q=csv+dedupe&per_page=30", Reply(body={"crates": [], "meta": {"total": 0}}))
    server.route("/api/v1/crates?q=csv&per_page=20", Reply(body=search_body("csv")))
    server.route("/api/v1/crates?q=dedupe&per_page=20", Reply(body={"crates": [], "meta": {"total": 0}}))
    found = CratesIo(settings_for(server)).search("a csv dedupe")
    assert [c.crate.name for c in found] == ["csv"]


def test_429_with_retry_after_is_waited_out(server: CratesServer) -> None:
    server.route(
        "/api/v1/crates",
        Reply(429, {"errors": [{"detail": "slow down"}]}, {"Retry-After": "1"}),
        Reply(body=search_body("csv")),
    )
    found = CratesIo(settings_for(server), backoff=0.0).search("csv")
    assert [c.crate.name for c in found] == ["csv"]
    first, second = server.requests("/api/v1/crates")
    assert second.time - first.time >= 0.95


def test_one_request_per_interval_across_four_threads(server: CratesServer) -> None:
    """Four threads, each with its own client object, share the process-wide limiter; the server measures the spacing."""
    settings = settings_for(server, cratesio_interval=0.2)
    for i in range(8):
        server.route(f"/api/v1/crates?q=q{i}&per_page=30", Reply(body=search_body(f"q{i}")))
    barrier = threading.Barrier(4)
    failures: list[BaseException] = []

    def worker(n: int) -> None:
        client = CratesIo(settings)
        barrier.wait()
        try:
            for i in (n, n + 4):
                client.search(f"q{i}")
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    times = sorted(r.time for r in server.requests("/api/v1/crates"))
    assert len(times) == 8
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    # The limiter spaces sends; the server sees arrivals, which scheduling on a loaded machine can move a little
    # closer. Without the limiter all eight arrive within milliseconds of each other.
    assert times[-1] - times[0] >= 7 * 0.2 * 0.95, gaps
    assert min(gaps) >= 0.1, gaps


def test_repeat_search_is_served_from_the_disk_cache(server: CratesServer) -> None:
    settings = settings_for(server)
    first = CratesIo(settings).search("postgres")
    again = CratesIo(settings).search("postgres")  # a new client object: the cache is on disk
    assert [c.to_dict() for c in again] == [c.to_dict() for c in first]
    assert len(server.requests()) == 1


def test_a_search_reads_the_trust_store_once_and_syncs_no_cache_entry(
    server: CratesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each request's short-lived client verifies TLS with httpx's default context made once per process: the CA
    bundle was read for every request (35 ms each, six requests in a craft's online search). Its answers are cached
    whole (an atomic rename) but not synced: a cache, asked again after a machine's crash."""
    import ssl

    from flakebot import tlscontext

    monkeypatch.setattr(tlscontext, "_TLS", {})
    loads: list[object] = []
    real_load = ssl.SSLContext.load_verify_locations

    def load(context: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args or kwargs)
        real_load(context, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", load)
    synced = recorded_fsyncs(monkeypatch)
    server.route("/api/v1/crates", Reply(body=search_body("zcsvlib", "csvtool")))
    server.route("/api/v1/crates/csvtool/1.0.0", Reply(body={"version": {"crate": "csvtool", "num": "1.0.0"}}))
    settings = settings_for(server, cratesio_details=2)
    CratesIo(settings).search("csv files", limit=2)
    assert len(server.requests()) == 3 and len(loads) == 1, loads  # the search and two crates' details
    cache = settings.path("cache_dir") / "crates-io"
    assert len(list(cache.glob("*.json"))) == 2 and not synced, synced  # one detail was a 404: not cached


def test_cache_entries_expire(server: CratesServer) -> None:
    settings = settings_for(server, http_cache_ttl=0.3)
    CratesIo(settings).search("postgres")
    time.sleep(0.4)
    CratesIo(settings).search("postgres")
    assert len(server.requests()) == 2


def test_error_bodies_never_enter_the_cache(server: CratesServer) -> None:
    settings = settings_for(server)
    server.route(
        "/api/v1/crates", Reply(500, {"errors": [{"detail": "database down"}]}), Reply(body=search_body("csv"))
    )
    with pytest.raises(SearchError, match="500.*database down"):
        CratesIo(settings, retries=0).search("csv")
    cache = settings.path("cache_dir") / "crates-io"
    assert not any(cache.glob("*"))
    assert [c.crate.name for c in CratesIo(settings, retries=0).search("csv")] == ["csv"]
    CratesIo(settings, retries=0).search("csv")
    assert len(server.requests()) == 2
    assert "database down" not in "".join(p.read_text() for p in cache.glob("*"))


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (
            Reply(403, {"errors": [{"detail": "We require that all requests include a User-Agent header"}]}),
            r"refused the search for 'csv' \(403: We require",
        ),
        (Reply(500, {"errors": [{"detail": "boom"}]}), r"answered 500 to the search for 'csv' after 1 retries: boom"),
        (Reply(503, "<html>maintenance</html>"), r"answered 503 to the search for 'csv' after 1 retries$"),
        (Reply(200, "{not json"), r"malformed JSON for search for 'csv'"),
        (Reply(200, [1, 2]), r"unexpected JSON"),
        (Reply(200, {"meta": {}}), r"lacks 'crates'"),
        (Reply(200, search_body("csv"), delay=1.0), r"did not answer in time \(127.0.0.1, read timeout 0.3s\)"),
    ],
)
def test_bad_answers_are_clear_errors(server: CratesServer, reply: Reply, message: str) -> None:
    server.route("/api/v1/crates", reply)
    with pytest.raises(SearchError, match=message) as info:
        CratesIo(settings_for(server), retries=1, backoff=0.01, timeout=0.3).search("csv")
    assert info.value.fix and info.value.exit_code == 10
    assert not any((settings_for(server).path("cache_dir") / "crates-io").glob("*"))


def test_unknown_crate_is_a_404_error(server: CratesServer) -> None:
    with pytest.raises(SearchError, match=r"has no crate 'nope' \(404: Not Found\)"):
        CratesIo(settings_for(server)).get("nope")


def test_unreachable_is_its_own_error(tmp_path: Path) -> None:
    settings = Settings(cratesio_api_url="http://127.0.0.1:9", connect_timeout=1.0)
    with pytest.raises(Unreachable, match="cannot connect to 127.0.0.1"):
        CratesIo(settings).search("csv")


def test_empty_and_stopword_queries_make_no_request(server: CratesServer) -> None:
    for query in ("", "the of and"):
        with pytest.raises(SearchError):
            CratesIo(settings_for(server)).search(query)
    assert server.requests() == []


def test_sparse_index_paths_and_fixture(server: CratesServer) -> None:
    assert [sparse_path(n) for n in ("a", "ab", "abc", "serde", "Cargo")] == [
        "1/a",
        "2/ab",
        "3/a/abc",
        "se/rd/serde",
        "ca/rg/cargo",
    ]
    [record] = CratesIo(settings_for(server)).index_versions("serde")
    assert (record["vers"], record["cksum"]) == (
        "1.0.229",
        "4148590afebada386688f18773da617792bf2ef03ffc1e4cbd2b1d45b023e0ba",
    )


@pytest.fixture
def crate_file(server: CratesServer) -> bytes:
    body = (DEBIAN_REGISTRY / "hexyl-0.8.0/Cargo.toml").read_bytes()  # any bytes stand for the archive
    server.route(
        "/crates/demo/demo-0.1.0.crate", Reply(body=body, headers={"Content-Type": "application/octet-stream"})
    )
    return body


def test_download_verified_against_the_index_checksum(server: CratesServer, crate_file: bytes, tmp_path: Path) -> None:
    digest = hashlib.sha256(crate_file).hexdigest()
    server.route("/de/mo/demo", Reply(body=json.dumps({"name": "demo", "vers": "0.1.0", "cksum": digest}) + "\n"))
    path = CratesIo(settings_for(server)).download("demo", "0.1.0", tmp_path / "dl")
    assert path == tmp_path / "dl/demo-0.1.0.crate" and path.read_bytes() == crate_file
    assert [p.name for p in (tmp_path / "dl").iterdir()] == ["demo-0.1.0.crate"]


@pytest.mark.parametrize("existing_dir", [True, False])
def test_download_with_wrong_checksum_is_refused_and_leaves_nothing(
    server: CratesServer, crate_file: bytes, tmp_path: Path, existing_dir: bool
) -> None:
    dest = tmp_path / "dl"
    if existing_dir:
        dest.mkdir()
    with pytest.raises(AcquireError, match="demo-0.1.0.crate failed its checksum"):
        CratesIo(settings_for(server)).download("demo", "0.1.0", dest, checksum="0" * 64)
    assert dest.exists() is existing_dir
    assert not existing_dir or list(dest.iterdir()) == []


def test_download_of_a_missing_crate(server: CratesServer, tmp_path: Path) -> None:
    with pytest.raises(AcquireError, match="404"):
        CratesIo(settings_for(server)).download("demo", "0.1.0", tmp_path / "dl", checksum="0" * 64)
    with pytest.raises(AcquireError, match="no index entry of 'demo'"):
        CratesIo(settings_for(server)).download("demo", "0.1.0", tmp_path / "dl")
    server.route("/de/mo/demo", Reply(body=json.dumps({"name": "demo", "vers": "0.0.9", "cksum": "0" * 64}) + "\n"))
    with pytest.raises(AcquireError, match="version 0.1.0 is not in the crates.io index"):
        CratesIo(settings_for(server)).download("demo", "0.1.0", tmp_path / "dl")
    assert not (tmp_path / "dl").exists()
