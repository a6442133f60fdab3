"""crates.io over httpx: search, crate and version details, the sparse index, and verified .crate downloads.

Follows the crates.io data-access policy: a User-Agent naming flakebot and a contact, at most one
API request per `cratesio_interval` seconds per process (one limiter shared by every thread and
client), retries with backoff on 429/5xx honouring Retry-After, and an on-disk cache with a TTL
so a repeated search makes no request. Only successful JSON answers are cached.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from flakebot import __version__
from flakebot.config import Settings
from flakebot.crates import Candidate, CrateInfo
from flakebot.crates.rank import newest_per_name, query_terms, rank, stop_words_removed
from flakebot.errors import AcquireError, SearchError
from flakebot.fsutil import atomic_write_text
from flakebot.tlscontext import tls_context

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_WAIT = 60.0  # a Retry-After longer than this ends the call instead of stalling a run
MAX_PAGES = 5
OFFLINE_FIX = "check your network, or search offline with '--registry local'"


class Unreachable(SearchError):
    """crates.io could not be connected to at all (the cue for falling back to the local registry)."""


class RateLimiter:
    """At most one call per `interval` seconds, shared by every thread that holds it."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._next = 0.0

    def wait(self) -> None:
        """Block until this caller's slot; slots are handed out in order, `interval` apart."""
        with self._lock:
            now = time.monotonic()
            slot = max(now, self._next)
            self._next = slot + self.interval
        if slot > now:
            time.sleep(slot - now)


_LIMITERS: dict[str, RateLimiter] = {}
_LIMITERS_LOCK = threading.Lock()


def limiter_for(base_url: str, interval: float) -> RateLimiter:
    """The process-wide limiter of one API (the policy counts requests per client, not per object)."""
    with _LIMITERS_LOCK:
        limiter = _LIMITERS.setdefault(base_url.rstrip("/"), RateLimiter(interval))
        limiter.interval = max(limiter.interval, interval)
        return limiter


class HttpCache:
    """Successful JSON answers on disk, fresh for `ttl` seconds, one file per URL."""

    def __init__(self, directory: Path, ttl: float) -> None:
        self.directory = directory
        self.ttl = ttl

    def _file(self, url: str) -> Path:
        return self.directory / (hashlib.sha256(url.encode()).hexdigest() + ".json")

    def get(self, url: str) -> Any | None:
        try:
            entry = json.loads(self._file(url).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.warning("ignoring unreadable cache entry for %s (%s)", url, exc)
            return None
        if entry.get("url") != url or time.time() - entry.get("time", 0) > self.ttl:
            return None
        return entry["body"]

    def put(self, url: str, body: Any) -> None:
        """Kept whole or not at all (an atomic rename), not synced: after a machine's crash an entry read empty or
        old is a miss (get), asked again; a search stores an answer per request (two fsyncs each)."""
        if self.ttl > 0:
            text = json.dumps({"url": url, "time": time.time(), "body": body})
            atomic_write_text(self._file(url), text, synced=False)


class CratesIo:
    """The crates.io registry: search, details and downloads, rate-limited and cached."""

    name = "crates-io"

    def __init__(
        self,
        settings: Settings,
        client: httpx.Client | None = None,
        *,
        retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 30.0,
    ) -> None:
        self.api_url = settings.cratesio_api_url.rstrip("/")
        self.static_url = settings.cratesio_static_url.rstrip("/")
        self.index_url = settings.cratesio_index_url.rstrip("/")
        self.details = settings.cratesio_details
        self.client = client
        self.retries = retries
        self.backoff = backoff
        self.timeout = httpx.Timeout(timeout, connect=settings.connect_timeout)
        self.headers = {"User-Agent": f"flakebot/{__version__} ({settings.contact})", "Accept": "application/json"}
        self.limiter = limiter_for(self.api_url, settings.cratesio_interval)
        self.cache = HttpCache(settings.path("cache_dir") / "crates-io", settings.http_cache_ttl)

    # ------------------------------------------------------------ public

    def search(self, query: str, limit: int = 10) -> list[Candidate]:
        """Ranked crates for `query`: crates.io's matches, re-ranked; the top few enriched with version details."""
        query_terms(query)
        words = stop_words_removed(query)
        crates = self._search_pages(" ".join(words), want=max(limit * 3, 20))
        if not crates and len(words) > 1:
            # crates.io ANDs the words; when all of them together match nothing, take each alone.
            for word in words[:3]:
                crates += self._search_pages(word, want=20)
        ranked = rank(query, crates, limit=len(crates))
        if self.details and ranked:
            enriched = {c.crate.name: self._enrich(c.crate) for c in ranked[: self.details]}
            ranked = rank(query, [enriched.get(c.crate.name, c.crate) for c in ranked], limit=len(ranked))
        return (ranked + _unmatched(crates, ranked))[:limit]

    def get(self, name: str, version: str | None = None) -> CrateInfo:
        """A crate's details, for its default version or for `version`."""
        data = self._api_json(f"/api/v1/crates/{quote(name)}", what=f"crate '{name}'", expect=("crate", dict))
        crate = _crate_info(_field(data, "crate", dict))
        versions = [v for v in data.get("versions") or [] if isinstance(v, dict)]
        wanted = version or crate.version
        found = next((v for v in versions if v.get("num") == wanted), None)
        if found is None:
            return _merge(crate, self.version(name, wanted)) if version else crate
        return _merge(crate, _version_info(found))

    def version(self, name: str, version: str) -> CrateInfo:
        """One version's details: licence, bin_names, has_lib, checksum, yanked."""
        data = self._api_json(
            f"/api/v1/crates/{quote(name)}/{quote(version)}",
            what=f"crate '{name}' version {version}",
            expect=("version", dict),
        )
        return _version_info(_field(data, "version", dict))

    def index_versions(self, name: str) -> list[dict[str, Any]]:
        """The sparse-index records of a crate (one per version: vers, cksum, deps, yanked); not rate-limited."""
        url = f"{self.index_url}/{sparse_path(name)}"
        cached = self.cache.get(url)
        if cached is not None:
            return list(cached)
        response = self._send_with_retries(url, {}, what=f"index entry of '{name}'", limited=False)
        try:
            records = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        except ValueError:
            raise SearchError(
                f"the sparse index sent malformed JSON for '{name}' ({url})", fix="try again later"
            ) from None
        self.cache.put(url, records)
        return records

    def download(self, name: str, version: str, dest: Path, checksum: str | None = None) -> Path:
        """Fetch `{name}-{version}.crate` into directory `dest`, refusing it unless its sha256 matches."""
        expected = (checksum or self._index_checksum(name, version)).lower()
        created = not dest.exists()
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / f"{name}-{version}.crate"
        url = f"{self.static_url}/crates/{quote(name)}/{quote(name)}-{quote(version)}.crate"
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{target.name}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as handle:
                digest = self._stream(url, handle, f"{name} {version}")
            if digest != expected:
                raise AcquireError(
                    f"{target.name} failed its checksum (expected sha256 {expected[:12]}..., got {digest[:12]}...)",
                    fix="retry the download; if it keeps failing, the mirror or a proxy is altering crates",
                    crate=name,
                    version=version,
                )
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            if created and not any(dest.iterdir()):
                dest.rmdir()
            raise
        return target

    # ------------------------------------------------------------ internals

    def _search_pages(self, text: str, want: int) -> list[CrateInfo]:
        params: dict[str, Any] = {"q": text, "per_page": min(want, 100)}
        path = "/api/v1/crates"
        crates: list[CrateInfo] = []
        for _ in range(MAX_PAGES):
            data = self._api_json(path, params, what=f"search for '{text}'", expect=("crates", list))
            crates += [_crate_info(c) for c in _field(data, "crates", list) if isinstance(c, dict)]
            next_page = (data.get("meta") or {}).get("next_page")
            if len(crates) >= want or not next_page:
                break
            path, params = "/api/v1/crates" + next_page, {}
        return crates

    def _enrich(self, crate: CrateInfo) -> CrateInfo:
        try:
            return _merge(crate, self.version(crate.name, crate.version))
        except Unreachable:
            raise
        except SearchError as exc:
            logger.warning("no version details for %s %s: %s", crate.name, crate.version, exc.message)
            return crate

    def _index_checksum(self, name: str, version: str) -> str:
        try:
            records = self.index_versions(name)
        except SearchError as exc:
            raise AcquireError(exc.message, fix=exc.fix, crate=name) from None
        for record in records:
            if record.get("vers") == version and record.get("cksum"):
                return str(record["cksum"])
        raise AcquireError(
            f"crate '{name}' version {version} is not in the crates.io index",
            fix="check the name and version with 'flakebot search'",
        )

    def _api_json(
        self, path: str, params: dict[str, Any] | None = None, *, what: str, expect: tuple[str, type]
    ) -> dict[str, Any]:
        """The JSON object at `path`, from the cache or the API; it must hold `expect` = (key, type) to be cached."""
        url = self.api_url + path
        key = f"{url}?{urlencode(params)}" if params else url
        cached = self.cache.get(key)
        if cached is not None:
            logger.debug("cache hit %s", key)
            return dict(cached)
        response = self._send_with_retries(url, params or {}, what=what, limited=True)
        try:
            data = response.json()
        except ValueError:
            raise SearchError(
                f"crates.io sent malformed JSON for {what} ({response.url})", fix="try again later; " + OFFLINE_FIX
            ) from None
        if not isinstance(data, dict):
            raise SearchError(
                f"crates.io sent unexpected JSON for {what} ({response.url})", fix="try again later; " + OFFLINE_FIX
            )
        _field(data, *expect)
        self.cache.put(key, data)
        return data

    def _send_with_retries(self, url: str, params: dict[str, Any], *, what: str, limited: bool) -> httpx.Response:
        for attempt in range(self.retries + 1):
            if limited:
                self.limiter.wait()
            response = self._send(
                lambda client: client.get(url, params=params or None, headers=self.headers, timeout=self.timeout)
            )
            if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                break
            delay = self._retry_delay(response, attempt, what)
            logger.info("crates.io answered %d for %s; retrying in %.1fs", response.status_code, what, delay)
            time.sleep(delay)
        if not response.is_success:
            raise _status_error(response, what, self.retries)
        return response

    def _send(self, call: Callable[[httpx.Client], httpx.Response]) -> httpx.Response:
        """One request, with the caller's client or a short-lived one (requests are a second apart anyway), which
        verifies TLS with httpx's default context made once per process (tls_context: 35 ms a client otherwise)."""
        try:
            if self.client is not None:
                return call(self.client)
            with httpx.Client(follow_redirects=True, verify=tls_context(httpx.create_ssl_context)) as client:
                return call(client)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise Unreachable(f"cannot connect to {_host(exc)}: {exc}", fix=OFFLINE_FIX) from None
        except httpx.TimeoutException as exc:
            raise SearchError(
                f"crates.io did not answer in time ({_host(exc)}, read timeout {self.timeout.read}s)",
                fix="try again later; " + OFFLINE_FIX,
            ) from None
        except httpx.HTTPError as exc:
            raise SearchError(
                f"crates.io request failed ({type(exc).__name__}: {exc})", fix="try again later; " + OFFLINE_FIX
            ) from None

    def _retry_delay(self, response: httpx.Response, attempt: int, what: str) -> float:
        wait = _retry_after(response.headers.get("Retry-After"))
        if wait is None:
            return self.backoff * 2.0**attempt
        if wait > MAX_RETRY_WAIT:
            raise SearchError(
                f"crates.io asks flakebot to wait {wait:.0f}s before the {what}", fix="try again later; " + OFFLINE_FIX
            )
        return wait

    def _stream(self, url: str, handle: Any, what: str) -> str:
        """Write the body of `url` to `handle`, returning its sha256 (retrying 429/5xx like API calls)."""
        digest = hashlib.sha256()

        def fetch(client: httpx.Client) -> httpx.Response:
            with client.stream("GET", url, headers=self.headers, timeout=self.timeout) as response:
                if response.is_success:
                    for chunk in response.iter_bytes():
                        digest.update(chunk)
                        handle.write(chunk)
                else:
                    response.read()
                return response

        for attempt in range(self.retries + 1):
            response = self._send(fetch)
            if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                break
            time.sleep(self._retry_delay(response, attempt, f"download of {what}"))
        if not response.is_success:
            error = _status_error(response, f"download of {what}", self.retries)
            raise AcquireError(error.message, fix=error.fix, crate=what)
        return digest.hexdigest()


def _unmatched(crates: list[CrateInfo], ranked: list[Candidate]) -> list[Candidate]:
    """crates.io's matches that our text ranking cannot see (it also searches READMEs), in crates.io's order."""
    seen = {c.crate.name for c in ranked}
    return [Candidate(c, 0.0, "matched by crates.io") for c in newest_per_name(crates) if c.name not in seen]


def sparse_path(name: str) -> str:
    """A crate's path in the sparse index: 1/a, 2/ab, 3/a/abc, ab/cd/abcd..."""
    lower = name.lower()
    if len(lower) <= 2:
        return f"{len(lower)}/{lower}"
    if len(lower) == 3:
        return f"3/{lower[0]}/{lower}"
    return f"{lower[:2]}/{lower[2:4]}/{lower}"


def _crate_info(data: dict[str, Any]) -> CrateInfo:
    """A search result or `crate` object (fields absent in old answers are tolerated)."""
    version = (
        data.get("default_version")
        or data.get("max_stable_version")
        or data.get("max_version")
        or data.get("newest_version")
        or ""
    )
    return CrateInfo(
        name=str(data.get("name") or data.get("id") or ""),
        version=str(version),
        description=" ".join(str(data.get("description") or "").split()),
        keywords=[str(k) for k in data.get("keywords") or []],
        categories=[str(c) for c in data.get("categories") or []],
        repository=str(data.get("repository") or ""),
        homepage=str(data.get("homepage") or ""),
        downloads=data.get("downloads"),
        recent_downloads=data.get("recent_downloads"),
        yanked=bool(data.get("yanked")),
        source="crates-io",
    )


def _version_info(data: dict[str, Any]) -> CrateInfo:
    """A `version` object: bin_names and has_lib may be null on old versions."""
    return CrateInfo(
        name=str(data.get("crate") or ""),
        version=str(data.get("num") or ""),
        license=str(data.get("license") or ""),
        has_lib=data.get("has_lib"),
        bin_names=[str(b) for b in data.get("bin_names") or []],
        downloads=data.get("downloads"),
        yanked=bool(data.get("yanked")),
        checksum=str(data.get("checksum") or ""),
        source="crates-io",
    )


def _merge(crate: CrateInfo, version: CrateInfo) -> CrateInfo:
    """A crate's search/crate data completed with one version's details."""
    merged = CrateInfo.from_dict(crate.to_dict())
    merged.version = version.version or crate.version
    merged.license = version.license or crate.license
    merged.has_lib = version.has_lib if version.has_lib is not None else crate.has_lib
    merged.bin_names = version.bin_names or crate.bin_names
    merged.yanked = version.yanked
    merged.checksum = version.checksum or crate.checksum
    return merged


def _field(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise SearchError(f"crates.io answer lacks '{key}'", fix="try again later; " + OFFLINE_FIX)
    return value


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _status_error(response: httpx.Response, what: str, retries: int) -> SearchError:
    code = response.status_code
    detail = _error_detail(response)
    said = f": {detail}" if detail else ""
    if code == 404:
        return SearchError(
            f"crates.io has no {what} (404{said})", fix="check the spelling, or search with 'flakebot search'"
        )
    if code == 403:
        fix = "set a contact crates.io accepts with 'flakebot config set contact you@example.com', or use '--registry local'"
        return SearchError(f"crates.io refused the {what} (403{said})", fix=fix)
    tried = f" after {retries} retries" if code in RETRY_STATUSES and retries else ""
    return SearchError(f"crates.io answered {code} to the {what}{tried}{said}", fix="try again later; " + OFFLINE_FIX)


def _error_detail(response: httpx.Response) -> str:
    """The first detail of a crates.io error body ({"errors":[{"detail":...}]}), or ''."""
    try:
        errors = response.json().get("errors") or []
        return " ".join(str(errors[0].get("detail", "")).split())[:200]
    except (ValueError, AttributeError, IndexError, TypeError):
        return ""


def _host(exc: httpx.HTTPError) -> str:
    try:
        return str(exc.request.url.host)
    except RuntimeError:
        return "crates.io"
