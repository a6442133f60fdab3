"""A local crates.io on 127.0.0.1, made of the real crates of cargo directory sources.

Each crate directory (Debian's /usr/share/cargo/registry/NAME-VERSION, a `cargo vendor` folder, a
crate a test just wrote) becomes a real `.crate`, listed in a sparse index in cargo's registry-index
format and served on crates.io's paths: the index, the download and static paths, and the few API
answers flakebot's client reads. Cargo takes it as the crates-io replacement, so lockfiles keep
crates.io's identity and the online path (generate-lockfile, fetch, add) runs with no network:

    with serve_mirror([Path("/usr/share/cargo/registry")]) as mirror:
        subprocess.run(["cargo", *mirror.cargo_config(), "fetch"], env={"CARGO_HOME": ...})

    python -m flakebot.crates.mirror /usr/share/cargo/registry --port 8080
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import logging
import os
import shlex
import tarfile
import threading
import tomllib
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from flakebot.crates import CrateInfo
from flakebot.crates.cratesio import sparse_path
from flakebot.crates.local import read_crate
from flakebot.crates.rank import normal_name, version_key
from flakebot.loopback import LoopbackServer, is_loopback

logger = logging.getLogger(__name__)

# top-level names `cargo package` leaves out (and the checksum file of a directory source)
SKIPPED = frozenset({".cargo-checksum.json", ".cargo-ok", ".git", "target"})
DEP_TABLES = {
    "dependencies": "normal",
    "dev-dependencies": "dev",
    "dev_dependencies": "dev",
    "build-dependencies": "build",
    "build_dependencies": "build",
}
PER_PAGE, MAX_PER_PAGE = 10, 100


@dataclass
class Entry:
    """One crate version of a directory source."""

    info: CrateInfo
    manifest: dict[str, Any]
    directory: Path

    @property
    def key(self) -> str:
        return f"{self.info.name}-{self.info.version}"


@dataclass(frozen=True)
class Request:
    """One request as the mirror answered it."""

    method: str
    path: str  # path and query
    status: int
    size: int  # body bytes sent


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- crates


class CrateStore:
    """The crates of some directory sources by lowercase name; each .crate is packed on first use and kept."""

    def __init__(self, sources: Iterable[Path] = ()) -> None:
        self._crates: dict[str, dict[str, Entry]] = {}
        self._packed: dict[str, bytes] = {}
        self._lock = threading.Lock()
        for source in sources:
            self.add(source)

    def add(self, source: Path) -> list[str]:
        """Add one crate directory, or every crate directory of a directory source; a later copy of a version wins."""
        added = [entry for entry in map(_read_entry, _crate_dirs(Path(source))) if entry is not None]
        with self._lock:
            for entry in added:
                self._crates.setdefault(entry.info.name.lower(), {})[entry.info.version] = entry
                self._packed.pop(entry.key, None)
        logger.info("mirror: %d crate versions from %s", len(added), source)
        return [entry.key for entry in added]

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._crates)

    def versions(self, name: str) -> list[Entry]:
        """Every version of `name` (any case), oldest first."""
        with self._lock:
            found = list(self._crates.get(name.lower(), {}).values())
        return sorted(found, key=lambda e: version_key(e.info.version))

    def find(self, name: str, version: str) -> Entry | None:
        return next((e for e in self.versions(name) if e.info.version == version), None)

    def crate_bytes(self, entry: Entry) -> bytes:
        with self._lock:
            packed = self._packed.get(entry.key)
        if packed is None:
            packed = pack_crate(entry.directory, entry.info.name, entry.info.version)
            with self._lock:
                self._packed[entry.key] = packed
        return packed

    def cksum(self, entry: Entry) -> str:
        return hashlib.sha256(self.crate_bytes(entry)).hexdigest()

    def index_file(self, name: str) -> bytes | None:
        """The sparse-index file of `name`: one JSON line per version, None when there is no such crate."""
        records = [index_record(e.manifest, self.cksum(e)) for e in self.versions(name)]
        return "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode() if records else None


def _crate_dirs(source: Path) -> list[Path]:
    if (source / "Cargo.toml").is_file():
        return [source]
    return [d for d in sorted(source.iterdir()) if (d / "Cargo.toml").is_file()]


def _read_entry(directory: Path) -> Entry | None:
    info = read_crate(directory)  # warns and returns None for a broken Cargo.toml
    if info is None:
        return None
    # read_crate keeps what search needs; the index wants the whole manifest (dependency tables, features).
    return Entry(info, tomllib.loads((directory / "Cargo.toml").read_text()), directory)


def pack_crate(directory: Path, name: str, version: str) -> bytes:
    """A crate directory as a `.crate`: a gzip'd tar with every file under NAME-VERSION/, byte-for-byte repeatable."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        for path in _members(directory):
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{name}-{version}/{path.relative_to(directory).as_posix()}")
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if os.stat(path).st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _members(directory: Path) -> list[Path]:
    """The files of a crate directory (symlinked files followed), sorted, without what `cargo package` leaves out."""
    found = []
    for root, dirs, files in os.walk(directory):
        if Path(root) == directory:
            dirs[:] = [d for d in dirs if d not in SKIPPED]
            files = [f for f in files if f not in SKIPPED]
        found += [Path(root, f) for f in files if Path(root, f).is_file()]
    return sorted(found, key=lambda p: p.relative_to(directory).as_posix())


# ---------------------------------------------------------------- index format


def index_record(manifest: dict[str, Any], cksum: str) -> dict[str, Any]:
    """One line of the sparse index for a crate version, as cargo's registry-index format documents it."""
    package = manifest["package"]
    features, features2 = _split_features(manifest.get("features") or {})
    record: dict[str, Any] = {
        "name": package["name"],
        "vers": package["version"],
        "deps": index_deps(manifest),
        "cksum": cksum,
        "features": features,
    }
    if features2:
        record.update(features2=features2, v=2)  # v2 tells cargo >= 1.60 to merge features2 in
    record.update(yanked=False, links=package.get("links"))
    if isinstance(package.get("rust-version"), str):
        record["rust_version"] = package["rust-version"]
    return record


def index_deps(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every dependency of a manifest, platform-specific ones with their `target`."""
    deps = _table_deps(manifest, None)
    for target, tables in (manifest.get("target") or {}).items():
        if isinstance(tables, dict):
            deps += _table_deps(tables, target)
    return deps


def _table_deps(tables: dict[str, Any], target: str | None) -> list[dict[str, Any]]:
    deps = []
    for table, kind in DEP_TABLES.items():
        deps += [_index_dep(key, spec, kind, target) for key, spec in (tables.get(table) or {}).items()]
    return deps


def _index_dep(key: str, spec: Any, kind: str, target: str | None) -> dict[str, Any]:
    """A dependency as the index has it: `name` is the name in Cargo.toml (a rename), `package` the real crate."""
    spec = {"version": spec} if isinstance(spec, str) else spec
    dep = {
        "name": key,
        "req": normal_req(str(spec.get("version", "*"))),
        "features": list(spec.get("features") or []),
        "optional": bool(spec.get("optional", False)),
        "default_features": bool(spec.get("default-features", spec.get("default_features", True))),
        "target": target,
        "kind": kind,
        "registry": spec.get("registry-index"),  # null: the same registry
    }
    if isinstance(spec.get("package"), str):
        dep["package"] = spec["package"]
    return dep


def normal_req(req: str) -> str:
    """A version requirement as `cargo publish` sends it: a bare version gets its implied caret ("1.2" -> "^1.2")."""
    parts = [part.replace(" ", "") for part in req.split(",")]
    return ", ".join("^" + part if part[:1].isdigit() else part for part in parts)


def _split_features(features: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Features in the old syntax, and those using `dep:` or `pkg?/feat` (crates.io keeps these in features2)."""
    new = {k: v for k, v in features.items() if any(f.startswith("dep:") or "?/" in f for f in v)}
    return {k: v for k, v in features.items() if k not in new}, new


# ---------------------------------------------------------------- the server


class Mirror:
    """The HTTP side: routes crates.io's paths to a CrateStore and records every request."""

    def __init__(
        self,
        sources: Iterable[Path] = (),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        corrupt: Iterable[str] = (),
    ) -> None:
        if not is_loopback(host):
            raise ValueError(f"the mirror listens on loopback addresses only, not {host}")
        self.host = host
        self.store = CrateStore(sources)
        self.corrupt = set(corrupt)  # NAME-VERSION keys served with bytes that do not match their index cksum
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        self._httpd = LoopbackServer(_handler(self), host, port)

    @property
    def url(self) -> str:
        return self._httpd.url

    @property
    def index_url(self) -> str:
        return f"sparse+{self.url}/index/"

    @property
    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    @property
    def downloads(self) -> list[str]:
        """NAME-VERSION of every .crate sent, in order."""
        sent = [r.path for r in self.requests if r.status == 200 and r.path.endswith(".crate")]
        return [path.rsplit("/", 1)[1].removesuffix(".crate") for path in sent]

    def add(self, source: Path) -> list[str]:
        """Serve more crates (a directory source or one crate directory), also while running."""
        return self.store.add(source)

    def cargo_config(self, name: str = "flakebot-mirror") -> list[str]:
        """cargo arguments that replace crates-io with this mirror (crates.io stays the source id in Cargo.lock)."""
        return [
            "--config",
            f'source.crates-io.replace-with="{name}"',
            "--config",
            f'source.{name}.registry="{self.index_url}"',
        ]

    def respond(self, method: str, target: str, headers: Mapping[str, str]) -> Response:
        """The answer to one request (`headers` with lowercase names), recorded in `requests`."""
        split = urlsplit(target)
        parts = [unquote(p) for p in split.path.strip("/").split("/")]
        try:
            response = self._route(parts, parse_qs(split.query), headers)
        except Exception:  # a crate that cannot be read or packed: the client gets a 500, the log the traceback
            logger.exception("mirror failed on %s %s", method, target)
            response = _error(500, "Internal Server Error")
        with self._lock:
            self._requests.append(Request(method, target, response.status, len(response.body)))
        logger.debug("%s %s -> %d", method, target, response.status)
        return response

    def start(self) -> Mirror:
        """Serve from a daemon thread (what `with` does)."""
        self._httpd.start()
        logger.info("mirror of %d crates at %s", len(self.store.names()), self.url)
        return self

    def close(self) -> None:
        self._httpd.close()

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def __enter__(self) -> Mirror:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ routes

    def _route(self, parts: list[str], query: dict[str, list[str]], headers: Mapping[str, str]) -> Response:
        match parts:
            case ["index", "config.json"]:
                return _json({"dl": f"{self.url}/api/v1/crates", "api": self.url})
            case ["index", *prefix, name]:
                return self._index("/".join([*prefix, name]), name, headers)
            case ["api", "v1", "crates"]:
                return self._search(query)
            case ["api", "v1", "crates", name]:
                return self._crate(name)
            case ["api", "v1", "crates", name, version]:
                return self._version(name, version)
            case ["api", "v1", "crates", name, version, "download"]:
                return self._download(name, version)
            case ["crates", name, filename]:
                return self._static(name, filename)
        return _error(404, "Not Found")

    def _index(self, path: str, name: str, headers: Mapping[str, str]) -> Response:
        body = self.store.index_file(name) if path == sparse_path(name) else None
        if body is None:
            return Response(404, b"not found\n", "text/plain")
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if headers.get("if-none-match") == etag:
            return Response(304, headers={"ETag": etag})
        return Response(200, body, "text/plain; charset=utf-8", {"ETag": etag})

    def _search(self, query: dict[str, list[str]]) -> Response:
        text = query.get("q", [""])[0]
        per_page = min(max(_int(query, "per_page", PER_PAGE), 1), MAX_PER_PAGE)
        page = max(_int(query, "page", 1), 1)
        found = search(self.store, text)
        shown = found[(page - 1) * per_page : page * per_page]
        more = page * per_page < len(found)
        meta = {
            "total": len(found),
            "next_page": "?" + urlencode({"q": text, "page": page + 1, "per_page": per_page}) if more else None,
            "prev_page": None,
        }
        return _json(
            {
                "crates": [self._crate_json(v, exact=normal_name(v[0].info.name) == normal_name(text)) for v in shown],
                "meta": meta,
            }
        )

    def _crate(self, name: str) -> Response:
        versions = self.store.versions(name)
        if not versions:
            return _error(404, f"crate `{name}` does not exist")
        newest = versions[-1].info
        return _json(
            {
                "crate": self._crate_json(versions),
                "versions": [self._version_json(e) for e in reversed(versions)],
                "keywords": [{"id": k, "keyword": k} for k in newest.keywords],
                "categories": [{"id": c, "category": c, "slug": c} for c in newest.categories],
            }
        )

    def _version(self, name: str, version: str) -> Response:
        entry = self.store.find(name, version)
        if entry is None:
            return _error(404, f"crate `{name}` does not have a version `{version}`")
        return _json({"version": self._version_json(entry)})

    def _download(self, name: str, version: str) -> Response:
        entry = self.store.find(name, version)
        if entry is None:
            return _error(404, f"crate `{name}` does not have a version `{version}`")
        n, v = entry.info.name, entry.info.version
        location = f"{self.url}/crates/{quote(n)}/{quote(n)}-{quote(v)}.crate"
        return Response(302, headers={"Location": location})  # as crates.io does, to its static host

    def _static(self, name: str, filename: str) -> Response:
        entry = next((e for e in self.store.versions(name) if f"{e.key}.crate".lower() == filename.lower()), None)
        if entry is None:
            return Response(404, b"not found\n", "text/plain")
        return Response(200, self._served_bytes(entry), "application/gzip")

    def _served_bytes(self, entry: Entry) -> bytes:
        packed = self.store.crate_bytes(entry)
        if entry.key not in self.corrupt:
            return packed
        # A different gzip mtime: still a valid archive with the same files, but not the bytes the index vouches for.
        return packed[:4] + b"\x01" + packed[5:]

    # ------------------------------------------------------------ API shapes

    def _crate_json(self, versions: list[Entry], *, exact: bool | None = None) -> dict[str, Any]:
        """A crate as crates.io describes it; search results (`exact` set) have null keywords, categories, versions."""
        newest = versions[-1]
        info, package = newest.info, newest.manifest["package"]
        stable = [e.info.version for e in versions if "-" not in e.info.version.partition("+")[0]]
        name = info.name
        data: dict[str, Any] = {
            "id": name,
            "name": name,
            "description": info.description or None,
            "homepage": info.homepage or None,
            "documentation": package.get("documentation"),
            "repository": info.repository or None,
            "keywords": info.keywords if exact is None else None,
            "categories": info.categories if exact is None else None,
            "versions": [_version_id(e) for e in reversed(versions)] if exact is None else None,
            "badges": [],
            "created_at": _timestamp(versions[0]),
            "updated_at": _timestamp(newest),
            "downloads": 0,
            "recent_downloads": 0,
            "default_version": stable[-1] if stable else info.version,
            "num_versions": len(versions),
            "yanked": False,
            "max_version": info.version,
            "newest_version": info.version,
            "max_stable_version": stable[-1] if stable else None,
            "links": {
                "versions": f"/api/v1/crates/{name}/versions",
                "reverse_dependencies": f"/api/v1/crates/{name}/reverse_dependencies",
            },
        }
        if exact is not None:
            data["exact_match"] = exact
        return data

    def _version_json(self, entry: Entry) -> dict[str, Any]:
        info, package = entry.info, entry.manifest["package"]
        return {
            "id": _version_id(entry),
            "crate": info.name,
            "num": info.version,
            "dl_path": f"/api/v1/crates/{info.name}/{info.version}/download",
            "checksum": self.store.cksum(entry),
            "crate_size": len(self.store.crate_bytes(entry)),
            "license": info.license or None,
            "bin_names": info.bin_names,
            "has_lib": info.has_lib,
            "lib_links": package.get("links"),
            "edition": package.get("edition"),
            "rust_version": package.get("rust-version"),
            "features": entry.manifest.get("features") or {},
            "yanked": False,
            "yank_message": None,
            "downloads": 0,
            "created_at": _timestamp(entry),
            "updated_at": _timestamp(entry),
        }


serve_mirror = Mirror  # `with serve_mirror(sources, corrupt={...}) as mirror:` serves until the block ends


def search(store: CrateStore, text: str) -> list[list[Entry]]:
    """Crates (their versions, oldest first) whose name, keywords or description hold every word of `text`;
    the exact name first, then names holding the words, then the rest, each by name."""
    words = text.lower().split()
    found = []
    for name in store.names():
        versions = store.versions(name)
        info = versions[-1].info
        haystack = " ".join([info.name, *info.keywords, info.description]).lower()
        if all(w in haystack for w in words):  # no words: every crate, as crates.io lists them
            found.append((normal_name(name) != normal_name(text), not all(w in name for w in words), name, versions))
    return [versions for *_, versions in sorted(found, key=lambda f: f[:3])]


def _handler(mirror: Mirror) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: cargo fetches many small files
        timeout = 5  # an idle keep-alive connection ends instead of holding a thread

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def _answer(self, body: bool) -> None:
            response = mirror.respond(self.command, self.path, {k.lower(): v for k, v in self.headers.items()})
            try:
                self.send_response(response.status)
                for name, value in {"Content-Type": response.content_type, **response.headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(response.body)))
                self.end_headers()
                if body:
                    self.wfile.write(response.body)
            except ConnectionError:
                logger.debug("client left before the answer to %s", self.path)

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug(format, *args)

    return Handler


def _json(data: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(data).encode())


def _error(status: int, detail: str) -> Response:
    return _json({"errors": [{"detail": detail}]}, status)


def _int(query: dict[str, list[str]], key: str, default: int) -> int:
    value = query.get(key, [""])[0]
    return int(value) if value.isdigit() else default


def _version_id(entry: Entry) -> int:
    return zlib.crc32(entry.key.encode())  # stable across restarts, unlike a counter


def _timestamp(entry: Entry) -> str:
    mtime = (entry.directory / "Cargo.toml").stat().st_mtime
    return datetime.fromtimestamp(mtime, UTC).isoformat()


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted (Ctrl-C)."""
    parser = argparse.ArgumentParser("python -m flakebot.crates.mirror", description="A crates.io of real crates.")
    parser.add_argument("sources", nargs="+", type=Path, metavar="SOURCE_DIR", help="a directory source, or one crate")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on")
    parser.add_argument(
        "--corrupt",
        action="append",
        default=[],
        metavar="NAME-VERSION",
        help="serve this crate with bytes that fail its checksum",
    )
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        parser.error(f"--host {args.host}: the mirror serves on loopback addresses only")
    for source in args.sources:
        if not source.is_dir():
            parser.error(f"{source} is not a directory")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mirror = Mirror(args.sources, host=args.host, port=args.port, corrupt=args.corrupt)
    print(f"serving {len(mirror.store.names())} crates at {mirror.url}", flush=True)
    print(f"use with: cargo {shlex.join(mirror.cargo_config())} ...", flush=True)
    try:
        mirror.serve_forever()
    except KeyboardInterrupt:
        logger.info("stopped")
    finally:
        mirror.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
