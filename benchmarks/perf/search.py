"""Crate search: median query time over Debian's registry and over a generated 20,000-crate directory source,
and the index build time, set beside the raw work of reading every Cargo.toml.

Goals: a query under 20 ms on the Debian registry and under 100 ms on 20,000 crates.
Also the crates.io client (the real httpx client and its HTTP cache) against a server on 127.0.0.1 answering every
search with a page of crates in the shape of the real fixture (../shared/fixtures/crates-io/search-postgres.json):
the first query of each text goes over HTTP (cold), the same queries again are answered by the cache (warm).
Run: python -m benchmarks.perf.search [--crates N]
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from flakebot.config import Settings
from flakebot.crates.cratesio import CratesIo
from flakebot.crates.local import LocalRegistry
from flakebot.loopback import LoopbackServer

DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
SEARCH_FIXTURE = Path(__file__).resolve().parents[3] / "shared/fixtures/crates-io/search-postgres.json"
DEBIAN_QUERIES = [
    "csv",
    "hex dump viewer",
    "parse command line arguments",
    "json",
    "regular expressions",
    "temporary files",
    "need a csv deduper",
    "test command line programs",
    "colored terminal output",
    "random numbers",
]
GOALS_MS = {"debian": 20.0, "synthetic": 100.0}
WORDS = (
    "parse parser csv json yaml toml xml http client server async file files path tree hash crypto random time date log "
    "logger color terminal command line argument cli image audio video compress zip tar gzip regex text string unicode "
    "byte bytes buffer stream network socket tcp udp dns database sql query cache memory alloc vector matrix math float "
    "integer decimal serialize deserialize format pretty print diff patch git watch notify process thread pool channel "
    "queue sync lock atomic test mock bench fuzz macro derive trait error result option config env path glob search index"
).split()
LICENSES = ["MIT", "MIT OR Apache-2.0", "Apache-2.0", "GPL-3.0-only", "BSD-3-Clause", "MPL-2.0"]


def _pseudo_words(rng: random.Random, count: int) -> list[str]:
    syllables = ["ka", "lo", "mi", "ter", "zen", "qu", "ri", "bal", "ox", "vy", "st", "ne", "dor", "fi", "gu"]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(count)]


def generate_source(root: Path, count: int, seed: int = 3) -> None:
    """Write `count` crate directories (name-version/Cargo.toml, some with src/main.rs) under `root`."""
    rng = random.Random(seed)
    vocabulary = WORDS + _pseudo_words(rng, 3000)
    made: set[str] = set()
    while len(made) < count:
        name = rng.choice("-_").join(rng.choice(vocabulary) for _ in range(rng.randint(1, 3)))
        version = f"{rng.randint(0, 3)}.{rng.randint(0, 30)}.{rng.randint(0, 20)}"
        if f"{name}-{version}" in made:
            continue
        made.add(f"{name}-{version}")
        directory = root / f"{name}-{version}"
        (directory / "src").mkdir(parents=True)
        description = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(4, 16)))
        keywords = json.dumps(rng.sample(WORDS, rng.randint(0, 5)))
        manifest = f'[package]\nname = "{name}"\nversion = "{version}"\ndescription = "{description}"\nkeywords = {keywords}\nlicense = "{rng.choice(LICENSES)}"\n'
        if rng.random() < 0.5:
            manifest += f'repository = "https://example.org/{name}"\n'
        manifest += '\n[dependencies]\nserde = "1"\n'
        (directory / "Cargo.toml").write_text(manifest)
        (directory / ("src/main.rs" if rng.random() < 0.15 else "src/lib.rs")).write_text("")


def _raw_read_seconds(root: Path) -> float:
    """The floor any index build pays: list the source and read every Cargo.toml."""
    start = time.perf_counter()
    total = sum(len((entry / "Cargo.toml").read_bytes()) for entry in root.iterdir())
    assert total > 0
    return time.perf_counter() - start


def _median_query_ms(registry: LocalRegistry, queries: list[str], repeat: int) -> float:
    registry.ranker()
    samples = []
    for query in queries:
        for _ in range(repeat):
            start = time.perf_counter()
            registry.search(query, 10)
            samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def measure(root: Path, cache: Path, queries: list[str], repeat: int) -> dict[str, Any]:
    """Cold build, cached load, ranker build and median query time for one directory source."""
    raw = _raw_read_seconds(root)
    start = time.perf_counter()
    entries = len(LocalRegistry(root, cache).entries())
    cold = time.perf_counter() - start
    start = time.perf_counter()
    registry = LocalRegistry(root, cache)
    registry.entries()
    cached = time.perf_counter() - start
    start = time.perf_counter()
    registry.ranker()
    ranker = time.perf_counter() - start
    query_ms = _median_query_ms(registry, queries, repeat)
    return {
        "crates": entries,
        "raw_read_s": round(raw, 4),
        "index_build_s": round(cold, 4),
        "build_over_raw_read": round(cold / raw, 2),
        "cached_load_s": round(cached, 4),
        "ranker_build_s": round(ranker, 4),
        "median_query_ms": round(query_ms, 3),
        "new_process_search_s": round(
            cached + ranker + query_ms / 1000, 4
        ),  # what one `flakebot search` pays beyond start-up
    }


def search_page(template: dict[str, Any], query: str, size: int) -> dict[str, Any]:
    """A crates.io search body: `size` crates shaped like the fixture's, named and described from the query's words."""
    rng = random.Random(query)
    crates = []
    for i in range(size):
        crate = copy.deepcopy(template)
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 2))] + query.split()[:1]
        crate.update(
            id=f"{'-'.join(words)}-{i}",
            name=f"{'-'.join(words)}-{i}",
            downloads=rng.randint(0, 10**7),
            exact_match=False,
        )
        crate["description"] = " ".join([*query.split(), *(rng.choice(WORDS) for _ in range(8))])
        crates.append(crate)
    return {"crates": crates, "meta": {"total": size, "next_page": None}}


@contextmanager
def fake_cratesio(template: dict[str, Any]) -> Iterator[str]:
    """A crates.io search endpoint on 127.0.0.1 (port 0); yields its base URL and stops it afterwards."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            target = urlsplit(self.path)
            query = parse_qs(target.query)
            body = json.dumps(
                search_page(template, query.get("q", [""])[0], int(query.get("per_page", ["10"])[0]))
            ).encode()
            self.send_response(200 if target.path == "/api/v1/crates" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with LoopbackServer(Handler) as server:
        yield server.url


def cratesio(cache: Path, repeat: int) -> dict[str, Any]:
    """Median query time of the crates.io client: cold (over HTTP to 127.0.0.1) and warm (from its HTTP cache)."""
    if not SEARCH_FIXTURE.is_file():
        return {"skipped": f"{SEARCH_FIXTURE} not found (the shared fixtures sit beside the repository)"}
    template = json.loads(SEARCH_FIXTURE.read_text())["crates"][0]
    with fake_cratesio(template) as url:
        # details off: the stand-in serves search pages only; the interval off: the 1 request/s policy is crates.io's, not this server's
        settings = Settings(cratesio_api_url=url, cache_dir=str(cache), cratesio_details=0, cratesio_interval=0.0)
        client = CratesIo(settings)
        cold = [_timed_ms(client, query) for query in DEBIAN_QUERIES]
        warm = [_timed_ms(client, query) for _ in range(repeat) for query in DEBIAN_QUERIES]
    return {
        "cold_query_ms": round(statistics.median(cold), 3),
        "median_query_ms": round(statistics.median(warm), 3),
        "warm_over_cold": round(statistics.median(warm) / statistics.median(cold), 3),
    }


def _timed_ms(client: CratesIo, query: str) -> float:
    start = time.perf_counter()
    found = client.search(query, 10)
    assert found, f"no result for {query}"
    return (time.perf_counter() - start) * 1000


def run(crates: int = 20_000, repeat: int = 5) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-search-") as tmp:
        if DEBIAN_REGISTRY.is_dir():
            results["debian"] = measure(DEBIAN_REGISTRY, Path(tmp) / "cache-debian", DEBIAN_QUERIES, repeat)
        source = Path(tmp) / "source"
        start = time.perf_counter()
        generate_source(source, crates)
        generated = time.perf_counter() - start
        synthetic_queries = [
            "parse json",
            "http client",
            "command line argument",
            "zenka",
            "a fast csv parser",
            "async network socket server",
            "log",
        ]
        results["synthetic"] = {
            "generate_s": round(generated, 2),
            **measure(source, Path(tmp) / "cache-synthetic", synthetic_queries, repeat),
        }
        results["cratesio"] = cratesio(Path(tmp) / "cache-cratesio", repeat)
    for name, goal in GOALS_MS.items():
        if name in results:
            results[name]["goal_query_ms"] = goal
            results[name]["query_over_goal"] = round(results[name]["median_query_ms"] / goal, 3)
            results[name]["met"] = results[name]["median_query_ms"] < goal
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crates", type=int, default=20_000, help="size of the generated directory source")
    parser.add_argument("--repeat", type=int, default=5, help="times each query is timed")
    args = parser.parse_args()
    print(json.dumps(run(args.crates, args.repeat), indent=2))


@dataclass(frozen=True, kw_only=True)
class QueryTimes:
    """One source's timings: a registry's (crates to new_process_search_s) or the crates.io client's (cold_query_ms,
    warm_over_cold); `skipped` says why a source was not measured. One record for both shapes, so most are optional."""

    median_query_ms: float | None = None
    crates: int | None = None
    generate_s: float | None = None
    raw_read_s: float | None = None
    index_build_s: float | None = None
    build_over_raw_read: float | None = None
    cached_load_s: float | None = None
    ranker_build_s: float | None = None
    new_process_search_s: float | None = None
    cold_query_ms: float | None = None
    warm_over_cold: float | None = None
    goal_query_ms: float | None = None
    query_over_goal: float | None = None
    met: bool | None = None
    skipped: str | None = None


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    """run()'s result, as report.json holds it: a source is missing when it was not there to measure."""

    debian: QueryTimes | None = None
    synthetic: QueryTimes | None = None
    cratesio: QueryTimes | None = None


RESULT = SearchResult


if __name__ == "__main__":
    main()
