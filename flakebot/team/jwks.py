"""An identity provider's signing keys as it publishes them: a JWKS fetched over HTTPS from `--jwt-jwks URL`, or from
the `jwks_uri` its `/.well-known/openid-configuration` names (with --jwt-issuer and neither --jwt-key nor --jwt-jwks).

Fetched when first needed, then kept for a TTL (--jwt-jwks-ttl); a token naming a `kid` the keys lack (the provider
rotated its keys) makes one fetch again, but never more than one fetch per REFETCH_SECONDS whatever the tokens say,
so a flood of made-up kids cannot make this front hammer the provider. A failed fetch keeps the keys held (a stale
key still verifies until the provider answers again); with none held, JWTs are refused (401) and the admin reads one
log line naming the URL and what went wrong (never a token: this module never sees one). HTTPS is required except
to a loopback address (never through an HTTP proxy from the environment); redirects are not followed; a document over
MAX_DOCUMENT bytes is refused; a whole fetch ends within FETCH_DEADLINE_SECONDS. Keys past their TTL keep verifying
while one fetch refreshes them in the background, and no caller waits behind a fetch another started, except for the
very first keys.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt

from flakebot.errors import UsageError
from flakebot.loopback import is_loopback

logger = logging.getLogger(__name__)

DEFAULT_TTL_SECONDS = 300.0
REFETCH_SECONDS = 30.0  # the least time between two fetches (unknown kids, failures)
FETCH_TIMEOUT_SECONDS = 5.0
FETCH_DEADLINE_SECONDS = 10.0  # a whole fetch (discovery and keys), however slowly the provider trickles
MAX_DOCUMENT = 1 << 20
DISCOVERY = "/.well-known/openid-configuration"
ASYMMETRIC = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}


@dataclass(frozen=True)
class Key:
    key: Any
    algorithms: list[str]
    kid: str | None = None


def parse_jwks(data: bytes) -> list[Key]:
    """The public signing keys of a JWKS document (a ValueError saying what is wrong otherwise). A key that cannot be
    used here (an algorithm PyJWT lacks, a broken key, private material) is skipped, not fatal to the others."""
    try:
        published = json.loads(data)["keys"]
        if not isinstance(published, list):
            raise TypeError("its `keys` is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"not a usable JWKS: {exc}") from None
    usable = [key for key in map(_usable, published) if key is not None]
    if not usable:
        raise ValueError("it holds no public signing key")
    return usable


def _usable(jwk: Any) -> Key | None:
    """One published key as a Key, or None when it is no public signing key of an asymmetric algorithm (logged by
    its kid, type and algorithm, and the error's class: never its material, which a provider's mistake makes
    private)."""
    if not isinstance(jwk, dict) or jwk.get("use", "sig") != "sig":
        return None
    why = "it carries private key material (anyone holding this JWKS could sign)" if "d" in jwk else ""
    if not why:
        try:
            parsed = jwt.PyJWK(jwk)
        except Exception as exc:  # noqa: BLE001 (PyJWT raises NotImplementedError for `none`, ValueError for a bad point)
            why = f"PyJWT cannot read it ({type(exc).__name__})"
        else:
            if parsed.algorithm_name in ASYMMETRIC and not hasattr(parsed.key, "private_bytes"):
                return Key(parsed.key, [parsed.algorithm_name], parsed.key_id)
            why = f"{parsed.algorithm_name} is not an asymmetric signature flakebot accepts"
    described = ", ".join(f"{name} {str(jwk.get(name))[:64]!r}" for name in ("kid", "kty", "alg") if name in jwk)
    logger.warning("a key of the identity provider skipped (%s): %s", described, why)
    return None


def url_problem(url: str) -> str | None:
    """Why url may not be fetched from (None when it may): HTTPS, or HTTP to a loopback address only."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "is not an http(s) URL"
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        return "is plain HTTP beyond loopback (keys an attacker on the path could replace)"
    return None


def check_url(url: str, option: str) -> str:
    problem = url_problem(url)
    if problem is not None:
        raise UsageError(f"{option} {url[:120]!r} {problem}", fix="pass the provider's https:// URL")
    return url


class FetchError(Exception):
    """One fetch of the provider's keys failed (its message: the URL and what went wrong)."""


class RemoteKeys:
    """The provider's keys, fetched and cached (thread-safe: the front verifies in worker threads)."""

    def __init__(
        self,
        issuer: str,
        jwks_url: str | None,
        ttl: float = DEFAULT_TTL_SECONDS,
        refetch: float = REFETCH_SECONDS,
    ) -> None:
        self.issuer, self.jwks_url, self.ttl, self.refetch = issuer, jwks_url, ttl, refetch
        self.fetches = 0  # attempts made (the tests and /metrics read it)
        self._keys: list[Key] = []
        self._fetched: float | None = None  # when the keys held were fetched
        self._attempted: float | None = None  # when the last fetch was tried, successful or not
        self._lock = threading.Lock()

    def keys(self) -> list[Key]:
        """The keys held; past the TTL they still answer at once while one fetch refreshes them in the background
        (a hung provider never makes a caller wait, nor the front's event loop, which verifies a token again). With
        none held, a fetch (the very first one under way waited for, at most FETCH_DEADLINE_SECONDS)."""
        if self._fresh():
            return self._keys
        if self._keys:
            self._refresh_in_background("expired")
            return self._keys
        # only the very first fetch is waited for: behind a provider that failed, a flood would hold every worker
        # thread for a whole deadline at each retry
        if self._lock.acquire(timeout=FETCH_DEADLINE_SECONDS + 1 if self._attempted is None else 0):
            try:
                if not self._keys:
                    self._fetch_if_due(time.monotonic(), "first use")
            finally:
                self._lock.release()
        return self._keys

    def _fresh(self) -> bool:
        fetched = self._fetched
        return fetched is not None and time.monotonic() - fetched < self.ttl

    def after_unknown_kid(self) -> list[Key]:
        """The keys after one more fetch, if none was tried in the last `refetch` seconds (a rotation). A fetch
        already under way is not waited for (a flood of made-up kids would hold every worker thread behind it)."""
        if not self._lock.acquire(blocking=False):
            return self._keys
        try:
            self._fetch_if_due(time.monotonic(), "a token names a key not held")
        finally:
            self._lock.release()
        return self._keys

    def _refresh_in_background(self, why: str) -> None:
        attempted = self._attempted
        if attempted is not None and time.monotonic() - attempted < self.refetch:
            return  # not due: no thread started per verification while the provider stays down
        if not self._lock.acquire(blocking=False):
            return  # a fetch is under way

        def refresh() -> None:
            try:
                self._fetch_if_due(time.monotonic(), why)
            finally:
                self._lock.release()

        try:
            threading.Thread(target=refresh, name="jwks-refresh", daemon=True).start()
        except BaseException:
            self._lock.release()
            raise

    def _fetch_if_due(self, now: float, why: str) -> None:
        if self._attempted is not None and now - self._attempted < self.refetch:
            return
        self._attempted = now
        self.fetches += 1
        try:
            keys = self._fetch()
        except FetchError as exc:
            kept = f"keeping the {len(self._keys)} key(s) held" if self._keys else "JWTs are refused (401)"
            logger.error(
                "cannot fetch the identity provider's keys (%s): %s; %s, next try in %.0f s at the earliest",
                why,
                exc,
                kept,
                self.refetch,
            )
            return
        self._keys = keys  # before _fetched: a lock-free reader that sees the new time sees these keys
        self._fetched = time.monotonic()
        logger.info("fetched %d key(s) of the identity provider (%s)", len(keys), why)

    def _fetch(self) -> list[Key]:
        """The keys, fetched within FETCH_DEADLINE_SECONDS whatever the provider does: the read timeout alone lets one
        that trickles a byte every few seconds hold the fetch for days. On an event loop of its own, in a thread of its
        own (the caller may be on the front's loop), so the deadline cuts a read mid-way."""
        outcome: list[list[Key] | FetchError] = []

        def run() -> None:
            try:
                outcome.append(asyncio.run(asyncio.wait_for(self._fetch_async(), FETCH_DEADLINE_SECONDS)))
            except TimeoutError:
                where = self.jwks_url or self.issuer
                outcome.append(FetchError(f"{where}: no complete answer within {FETCH_DEADLINE_SECONDS:.0f} s"))
            except FetchError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run, name="jwks-fetch", daemon=True)
        thread.start()
        thread.join()
        if not outcome:
            raise FetchError(f"{self.jwks_url or self.issuer}: the fetch ended without an answer")
        if isinstance(outcome[0], FetchError):
            raise outcome[0]
        return outcome[0]

    async def _fetch_async(self) -> list[Key]:
        # plain HTTP (loopback only) never goes through a proxy from the environment: its keys would come from
        # wherever the proxy likes; HTTPS may (a CONNECT tunnel, the provider's certificate checked end to end)
        plain = httpx.AsyncHTTPTransport()
        async with httpx.AsyncClient(
            timeout=FETCH_TIMEOUT_SECONDS, follow_redirects=False, mounts={"http://": plain}
        ) as client:
            url = self.jwks_url or await self._discover(client)
            try:
                return parse_jwks(await _get(client, url))
            except ValueError as exc:
                raise FetchError(f"{url}: {exc}") from None

    async def _discover(self, client: httpx.AsyncClient) -> str:
        """The jwks_uri of the issuer's OpenID configuration (which must name this very issuer)."""
        url = self.issuer.rstrip("/") + DISCOVERY
        try:
            document = json.loads(await _get(client, url))
        except ValueError as exc:
            raise FetchError(f"{url}: not JSON ({exc})") from None
        if not isinstance(document, dict) or document.get("issuer") != self.issuer:
            raise FetchError(f"{url}: its `issuer` is not {self.issuer}")
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str):
            raise FetchError(f"{url}: no jwks_uri")
        problem = url_problem(jwks_uri)
        if problem is not None:
            raise FetchError(f"{url}: its jwks_uri {jwks_uri[:120]!r} {problem}")
        return jwks_uri


async def _get(client: httpx.AsyncClient, url: str) -> bytes:
    """The body of a 200 answer to GET url, at most MAX_DOCUMENT bytes (else a FetchError)."""
    try:
        # identity only: a compressed body is inflated before its size could be checked (a few KB of gzip -> 64 MB)
        headers = {"Accept": "application/json", "Accept-Encoding": "identity"}
        async with client.stream("GET", url, headers=headers) as answer:
            if answer.status_code != 200:
                raise FetchError(f"{url}: HTTP {answer.status_code}")
            encoding = answer.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise FetchError(f"{url}: answered with Content-Encoding {encoding[:40]!r}, not the identity asked for")
            body = b""
            async for chunk in answer.aiter_raw():
                body += chunk
                if len(body) > MAX_DOCUMENT:
                    raise FetchError(f"{url}: more than {MAX_DOCUMENT} bytes")
            return body
    except httpx.HTTPError as exc:
        raise FetchError(f"{url}: {type(exc).__name__}: {exc}") from None
