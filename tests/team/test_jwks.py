"""An identity provider's keys fetched from its JWKS (flakebot.team.jwks): a real HTTP server on 127.0.0.1 serves the
JWKS and the OpenID configuration, counting what it is asked; the verifier is flakebot's own (in this process, with a
short refetch interval) and, end to end, `flakebot serve` discovering the keys from the issuer."""

from __future__ import annotations

import asyncio
import gzip
import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from flakebot.loopback import LoopbackServer
from flakebot.team.idtokens import JwtOptions, JwtVerifier
from tests.conftest import run_cli
from tests.team.test_front import serving
from tests.team.test_jwt import AUDIENCE, claims, refused_with_metadata

pytestmark = pytest.mark.timeout(180)


@dataclass
class Provider:
    """What the IdP serves: its keys (kid -> private key, the public halves published) and the hits per path."""

    url: str = ""
    keys: dict[str, ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    hits: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    trickle: bool = False  # the keys answered one byte a second, never ending (a hung or hostile provider)
    gzipped: bool = False  # the keys answered gzip-compressed whatever the client asked for
    encodings: list[str] = field(default_factory=list)  # the Accept-Encoding of each request
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def jwks_url(self) -> str:
        return f"{self.url}/jwks.json"

    def rotate(self, kid: str) -> None:
        """The provider now signs with a new key, and publishes only that one."""
        with self.lock:
            self.keys = {kid: ec.generate_private_key(ec.SECP256R1())}

    def token(self, kid: str, **changes: Any) -> str:
        return jwt.encode(claims(iss=self.url, **changes), self.keys[kid], algorithm="ES256", headers={"kid": kid})

    def document(self, path: str) -> dict[str, Any] | None:
        if path == "/.well-known/openid-configuration":
            return {"issuer": self.url, "jwks_uri": self.jwks_url}
        if path.endswith("/jwks.json"):  # a proxy is asked for the whole URL
            with self.lock:
                published = [
                    {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key())), "kid": kid, "alg": "ES256"}
                    for kid, k in self.keys.items()
                ]
            return {"keys": published}
        return None


@pytest.fixture
def provider() -> Iterator[Provider]:
    yield from _provider()


@pytest.fixture
def proxy() -> Iterator[Provider]:
    """Another server, which a request through it as an HTTP proxy would reach: it answers its own keys."""
    yield from _provider()


def _provider() -> Iterator[Provider]:
    served = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            served.hits[self.path] += 1
            if served.trickle:
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 19))
                self.end_headers()
                while not served.stop.wait(1.0):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                return
            served.encodings.append(self.headers.get("Accept-Encoding", ""))
            document = served.document(self.path)
            body = json.dumps(document).encode()
            self.send_response(200 if document is not None else 404)
            if served.gzipped:
                body = gzip.compress(body)
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with LoopbackServer(Handler) as server:
        served.url = server.url
        served.rotate("k1")
        try:
            yield served
        finally:
            served.stop.set()  # a trickling answer stops writing


def _within(seconds: float, work: Any) -> tuple[bool, Any]:
    """Whether work() returned within seconds, and what it returned (a daemon thread: a hang fails, never blocks)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(result), result[0] if result else None


def test_rotated_keys_are_fetched_again_on_an_unknown_kid(provider: Provider) -> None:
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url, refetch_seconds=0.5))
    assert provider.hits["/jwks.json"] == 0  # fetched when first needed, not before
    first = verifier.verify(provider.token("k1"))
    assert first is not None and first.tenant == "acme"
    assert verifier.verify(provider.token("k1")) is not None and provider.hits["/jwks.json"] == 1  # cached
    provider.rotate("k2")
    rotated = provider.token("k2")
    assert verifier.verify(rotated) is None  # within the refetch interval: no fetch, refused
    assert provider.hits["/jwks.json"] == 1
    time.sleep(0.6)
    assert verifier.verify(rotated) is not None  # the unknown kid fetched the keys again
    assert provider.hits["/jwks.json"] == 2
    assert verifier.verify(provider.token("k2", aud="another-service")) is None  # fetched keys, same checks


def test_a_flood_of_unknown_kids_fetches_once_per_interval(provider: Provider) -> None:
    interval, seconds = 0.5, 2.0
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url, refetch_seconds=interval))
    assert verifier.verify(provider.token("k1")) is not None
    signer = provider.keys["k1"]
    made_up = [
        jwt.encode(claims(iss=provider.url), signer, algorithm="ES256", headers={"kid": secrets.token_hex(4)})
        for _ in range(50)
    ]
    refused = Counter[bool]()
    end = time.monotonic() + seconds

    def flood() -> None:
        while time.monotonic() < end:
            for token in made_up:
                refused[verifier.verify(token) is None] += 1

    threads = [threading.Thread(target=flood) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # the first fetch, then at most one per interval during the flood (and one for a boundary)
    assert 2 <= provider.hits["/jwks.json"] <= 1 + seconds / interval + 1, (provider.hits, refused)
    assert refused[True] >= 400 and refused[False] == 0


def test_serve_discovers_the_keys_from_the_issuer(provider: Provider, flakebot_home: Path) -> None:
    from tests.team.test_front import agent_session

    log = flakebot_home / "serve.log"
    with serving("--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, log=log) as url:
        valid = provider.token("k1")
        assert asyncio.run(agent_session(url, valid, "legacy"))[2] == {"ok": True, "tools": []}
        assert provider.hits["/.well-known/openid-configuration"] == 1 and provider.hits["/jwks.json"] == 1
        assert refused_with_metadata(url, provider.token("k1", aud="another-service"))
    assert valid.split(".")[2] not in log.read_text() + log.with_suffix(".err").read_text()


def test_a_provider_that_cannot_be_reached_is_a_401_and_one_log_line(provider: Provider, flakebot_home: Path) -> None:
    """No key could be fetched: every JWT is refused (401, the front keeps serving), the admin reads why, once per
    refetch interval, and no token reaches the log."""
    log = flakebot_home / "serve.log"
    gone = f"{provider.url}/no-such-jwks.json"
    with serving("--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, "--jwt-jwks", gone, log=log) as url:
        tokens = [provider.token("k1") for _ in range(3)]
        assert all(refused_with_metadata(url, token) for token in tokens)
    text = log.read_text()
    lines = [line for line in text.splitlines() if "cannot fetch the identity provider's keys" in line]
    assert len(lines) == 1 and f"{gone}: HTTP 404" in lines[0] and "JWTs are refused (401)" in lines[0], text
    assert provider.hits["/no-such-jwks.json"] == 1
    assert not any(token.split(".")[2] in text for token in tokens)


def test_a_jwks_url_must_be_https_beyond_loopback(flakebot_home: Path) -> None:
    options = ["serve", "--port", "0", "--jwt-issuer", "https://idp.example.test", "--jwt-audience", AUDIENCE]
    plain = run_cli(*options, "--jwt-jwks", "http://idp.example.test/jwks.json", timeout=60)
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1 and "plain HTTP beyond loopback" in plain.stderr
    key = flakebot_home / "k.pem"
    key.write_text("x")
    both = run_cli(*options, "--jwt-jwks", "https://idp.example.test/jwks.json", "--jwt-key", str(key), timeout=60)
    assert both.returncode == 2 and "exclude each other" in both.stderr
    discovered = run_cli("serve", "--port", "0", "--jwt-issuer", "http://idp.example.test", "--jwt-audience", "a")
    assert discovered.returncode == 2 and "plain HTTP beyond loopback" in discovered.stderr


def test_a_trickling_jwks_is_given_up_within_the_deadline(provider: Provider) -> None:
    """A provider that answers one byte a second (each read well within the read timeout) is given up at the fetch's
    deadline: the token is refused, the verifier answers."""
    from flakebot.team.jwks import FETCH_DEADLINE_SECONDS

    provider.trickle = True
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    answered, principal = _within(FETCH_DEADLINE_SECONDS + 8, lambda: verifier.verify(provider.token("k1")))
    assert answered and principal is None


def test_held_keys_verify_while_the_provider_hangs(provider: Provider) -> None:
    """Keys past their TTL still verify at once while the provider hangs: the refresh never makes a caller wait (nor
    the front's event loop, which verifies a token again after the SDK's check)."""
    verifier = JwtVerifier(
        JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url, jwks_ttl=0.3, refetch_seconds=0.2)
    )
    assert verifier.verify(provider.token("k1")) is not None
    provider.trickle = True
    time.sleep(0.4)
    for _ in range(3):
        answered, principal = _within(2.0, lambda: verifier.verify(provider.token("k1")))
        assert answered and principal is not None


def test_an_http_proxy_from_the_environment_never_gets_a_loopback_fetch(
    provider: Provider, proxy: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain HTTP is allowed to a loopback JWKS only because nothing leaves the machine: an HTTP proxy from the
    environment (which could answer keys of its own) is never asked for it."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("ALL_PROXY", proxy.url)
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    forged = jwt.encode(claims(iss=provider.url), proxy.keys["k1"], algorithm="ES256", headers={"kid": "k1"})
    assert verifier.verify(forged) is None
    assert verifier.verify(provider.token("k1")) is not None
    assert sum(proxy.hits.values()) == 0 and provider.hits["/jwks.json"] == 1


@pytest.mark.slow
def test_a_hung_provider_stalls_no_other_tenant(provider: Provider, flakebot_home: Path, workdir: Path) -> None:
    """A flood of JWTs while the provider hangs (each waiting on its keys) never stops a static token's calls."""
    from tests.team.test_front import add_token, agent_session

    static = add_token("alice", "--tenant", "acme")
    provider.trickle = True
    jwt_options = ["--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, "--jwt-jwks", provider.jwks_url]
    with serving(*jwt_options, log=flakebot_home / "serve.log") as url:
        flood = [
            threading.Thread(target=_quietly, args=(refused_with_metadata, url, provider.token("k1")), daemon=True)
            for _ in range(60)
        ]
        for thread in flood:
            thread.start()
        time.sleep(2)
        answered, seen = _within(40, lambda: asyncio.run(agent_session(url, static, "2026-07-28")))
        assert answered and seen[2] == {"ok": True, "tools": []}


def _quietly(work: Any, *args: Any) -> None:
    try:
        work(*args)
    except Exception:  # noqa: BLE001 (a flood's request may time out; the test asks about another's call)
        pass


@pytest.mark.parametrize(
    "odd",
    [
        {"alg": "none"},  # PyJWT raises NotImplementedError for it, not a PyJWTError
        {"alg": "RSA-OAEP"},  # an encryption key published without `use`: no algorithm PyJWT verifies with
        {"kty": "OKP", "crv": "X25519", "x": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},  # a key agreement key
        {"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"},  # not a point on the curve
    ],
)
def test_a_jwks_key_flakebot_cannot_use_is_skipped_not_fatal(provider: Provider, odd: dict[str, Any]) -> None:
    """A key the verifier cannot use (an algorithm it lacks, a broken one) is skipped: the provider's other keys
    still verify, and no exception escapes a verification (the front would answer 500)."""
    signer = provider.keys["k1"]
    published = {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(signer.public_key())), "kid": "k1", "alg": "ES256"}
    odd_key = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(_rsa().public_key())), "kid": "odd", **odd}
    provider.document = lambda path: {"keys": [odd_key, published]}  # type: ignore[method-assign]
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    assert verifier.verify(provider.token("k1")) is not None
    forged = jwt.encode(claims(iss=provider.url), "x" * 32, algorithm="HS256", headers={"kid": "odd"})
    assert verifier.verify(forged) is None


def test_a_published_private_key_is_never_used(provider: Provider) -> None:
    """A JWKS that carries a private key (a provider's mistake: anyone could sign with it) verifies nothing with it,
    and the verification answers None rather than raising (cryptography's private key has no verify)."""
    private = _rsa()
    leaked = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private)), "kid": "k1", "alg": "RS256"}
    provider.document = lambda path: {"keys": [leaked]}  # type: ignore[method-assign]
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    token = jwt.encode(claims(iss=provider.url), private, algorithm="RS256", headers={"kid": "k1"})
    assert verifier.verify(token) is None


def test_two_keys_under_one_kid_each_verify_their_tokens(provider: Provider) -> None:
    """A kid two published keys share (a provider mid-rotation that reused it): a token signed by either verifies."""
    first, second = provider.keys["k1"], ec.generate_private_key(ec.SECP256R1())
    published = [
        {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(k.public_key())), "kid": "k1", "alg": "ES256"}
        for k in (first, second)
    ]
    provider.document = lambda path: {"keys": published}  # type: ignore[method-assign]
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    for signer in (first, second):
        token = jwt.encode(claims(iss=provider.url), signer, algorithm="ES256", headers={"kid": "k1"})
        assert verifier.verify(token) is not None


def _rsa() -> Any:
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def test_keys_are_fetched_uncompressed_and_a_compressed_answer_is_refused(provider: Provider) -> None:
    """The fetch asks for the identity encoding; a provider that compresses anyway is refused before anything is
    inflated (a few KB of gzip inflate to tens of MB, before the size cap could see them)."""
    verifier = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    assert verifier.verify(provider.token("k1")) is not None
    assert provider.encodings == ["identity"]
    provider.gzipped = True
    fresh = JwtVerifier(JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url))
    assert fresh.verify(provider.token("k1")) is None
