"""A JWT principal's limits from its `flakebot_limits` claim, held to the front's caps (flakebot.team.claimlimits):
tokens signed by an identity provider serving its JWKS on 127.0.0.1 (tests/team/test_jwks.py), verified by the real
`flakebot serve`, called through the MCP SDK over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from flakebot.team.claimlimits import Caps
from flakebot.team.idtokens import JwtOptions, JwtVerifier
from tests.team.test_front import serving
from tests.team.test_jwks import Provider, _provider
from tests.team.test_jwt import AUDIENCE, refused_with_metadata

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def provider() -> Iterator[Provider]:
    yield from _provider()


async def calls(url: str, token: str, count: int) -> list[str]:
    """What each of `count` tool calls of one agent came to: "ok", or the error's text."""
    outcomes = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:  # type: ignore[arg-type]
            for _ in range(count):
                try:
                    result = await client.call_tool("list", {})
                except Exception as exc:  # the SDK raises the JSON-RPC error of a refused call
                    outcomes.append(str(exc))
                    continue
                outcomes.append("error" if result.is_error else "ok")
    return outcomes


def test_a_jwts_limits_claim_is_held_to_the_fronts_cap(provider: Provider, flakebot_home: Path) -> None:
    """The front caps JWTs at 5 calls a minute. carol's claim asks for 2: her third call is refused at 2. dave's asks
    for 1,000: he is held to 5. erin's names none: the default (120) held to the cap, 5 too."""
    log = flakebot_home / "serve.log"
    options = ["--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, "--jwt-max-calls-per-minute", "5"]
    tight = provider.token("k1", sub="carol@example.test", flakebot_limits={"calls_per_minute": 2})
    wide = provider.token("k1", sub="dave@example.test", flakebot_limits={"calls_per_minute": 1000})
    unnamed = provider.token("k1", sub="erin@example.test")
    with serving(*options, log=log) as url:
        carol = asyncio.run(calls(url, tight, 3))
        dave = asyncio.run(calls(url, wide, 6))
        erin = asyncio.run(calls(url, unnamed, 6))
    assert carol[:2] == ["ok", "ok"] and "its limit: 2" in carol[2], carol
    assert dave[:5] == ["ok"] * 5 and "its limit: 5" in dave[5], dave
    assert erin[:5] == ["ok"] * 5 and "its limit: 5" in erin[5], erin


BAD_CLAIMS: list[Any] = [
    {"calls_per_minute": "lots"},
    {"calls_per_minute": 0},
    {"calls_per_minute": 2.5},
    {"calls_per_minute": True},
    {"calls_per_minute": 3.0},
    {"calls_per_minute": -1},
    {"calls_per_minute": 10**4000},
    {"calls_per_minute": {"calls_per_minute": 3}},
    {"concurrent_crafts": 100_000},
    {"calls_per_min": 3},
    [3],
    "3",
]


def test_a_limits_claim_that_cannot_be_read_refuses_the_token(provider: Provider, flakebot_home: Path) -> None:
    """Each bad claim is 401 (never the defaults, never the cap), and the log says why in one line naming the claim,
    once however often the token comes back."""
    log = flakebot_home / "serve.log"
    with serving("--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, log=log) as url:
        for bad in BAD_CLAIMS:
            token = provider.token("k1", flakebot_limits=bad)
            assert refused_with_metadata(url, token) and refused_with_metadata(url, token), bad
        assert not refused_with_metadata(url, provider.token("k1", flakebot_limits={"concurrent_crafts": 1}))
    refusals = [line for line in log.read_text().splitlines() if "a JWT refused: its flakebot_limits claim" in line]
    assert len(refusals) == len(BAD_CLAIMS), refusals
    assert any("names 'calls_per_min', no limit" in line for line in refusals), refusals


def test_concurrent_crafts_from_the_claim_are_held_to_the_cap(provider: Provider) -> None:
    verifier = JwtVerifier(
        JwtOptions(
            provider.url, AUDIENCE, jwks_url=provider.jwks_url, caps=Caps(calls_per_minute=50, concurrent_crafts=4)
        )
    )
    asked = {
        "tight": {"concurrent_crafts": 1},
        "wide": {"concurrent_crafts": 200, "calls_per_minute": 10},
        "none": None,
    }
    held = {}
    for what, claim in asked.items():
        principal = verifier.verify(provider.token("k1", flakebot_limits=claim))
        assert principal is not None, what
        held[what] = (principal.concurrent_crafts, principal.calls_per_minute)
    assert held == {"tight": (1, 50), "wide": (4, 10), "none": (2, 50)}, held


def test_caps_are_checked_before_serving(flakebot_home: Path) -> None:
    from tests.conftest import run_cli

    alone = run_cli("serve", "--port", "0", "--jwt-max-calls-per-minute", "10", timeout=60)
    assert alone.returncode == 2 and alone.stderr.count("\n") == 1 and "need --jwt-issuer" in alone.stderr
    serve = ["serve", "--port", "0", "--jwt-issuer", "https://idp.example.test", "--jwt-audience", AUDIENCE]
    serve += ["--jwt-key", str(flakebot_home)]
    zero = run_cli(*serve, "--jwt-max-concurrent-crafts", "0", timeout=60)
    assert (
        zero.returncode == 2 and zero.stderr.count("\n") == 1 and "--jwt-max-concurrent-crafts must be" in zero.stderr
    )
    for claim in ("exp", "sub", "flakebot_tenant"):  # served, every token was refused, said once in the log
        named = run_cli(*serve, "--jwt-limits-claim", claim, timeout=60)
        assert named.returncode == 2 and named.stderr.count("\n") == 1 and "--jwt-limits-claim" in named.stderr, claim


def test_duplicate_keys_in_a_signed_payload_are_held_to_the_cap(provider: Provider) -> None:
    """JSON with a key twice: PyJWT's parser keeps the last, another parser (the IdP's) may have read the first. Which
    ever is read, the limit is held to the cap: a payload can say no more than the front allows."""
    import json

    from tests.team.test_jwt import claims

    verifier = JwtVerifier(
        JwtOptions(provider.url, AUDIENCE, jwks_url=provider.jwks_url, caps=Caps(calls_per_minute=5))
    )
    base = json.dumps(claims(iss=provider.url))[:-1]
    held = []
    for limits in (
        '{"calls_per_minute": 1, "calls_per_minute": 1000}',
        '{"calls_per_minute": 1000, "calls_per_minute": 3}',
    ):
        for payload in (
            f'{base}, "flakebot_limits": {limits}}}',
            f'{base}, "flakebot_limits": {{"calls_per_minute": 2}}, "flakebot_limits": {limits}}}',
        ):
            token = jwt.api_jws.encode(payload.encode(), provider.keys["k1"], algorithm="ES256", headers={"kid": "k1"})
            principal = verifier.verify(token)
            held.append(principal.calls_per_minute if principal is not None else None)
    assert held == [5, 5, 3, 3], held


async def one_call_each(url: str, tokens: list[str]) -> list[str]:
    """What one tool call with each token came to, in order (a fresh client each: the SDK sends one token a client)."""
    return [(await calls(url, token, 1))[0] for token in tokens]


def test_one_subjects_tokens_share_its_window_each_held_to_its_own_claim(
    provider: Provider, flakebot_home: Path
) -> None:
    """The IdP lowers carol's limit from 4 to 2 a minute: her new token is refused at 2 calls counted under her older
    token's (the window is her subject's, not a token's), while her older token, valid until it expires, still reads
    its own 4. A token of another subject counts from nothing. And a token signed with an issued-at no float holds
    (PyJWT lets it through: it is in the past) raised an OverflowError out of the front's verify: a 500 and a
    traceback for each of its requests; now it is answered."""
    options = ["--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, "--jwt-max-calls-per-minute", "5"]
    older = provider.token("k1", sub="carol@example.test", flakebot_limits={"calls_per_minute": 4})
    newer = provider.token("k1", sub="carol@example.test", flakebot_limits={"calls_per_minute": 2})
    other = provider.token("k1", sub="dave@example.test", flakebot_limits={"calls_per_minute": 2})
    ancient = provider.token("k1", sub="erin@example.test", iat=-(10**400))
    log = flakebot_home / "serve.log"
    with serving(*options, log=log) as url:
        outcomes = asyncio.run(one_call_each(url, [older, older, newer, older, older, older, other, ancient]))
    assert outcomes[:2] == ["ok", "ok"] and "its limit: 2" in outcomes[2], outcomes
    assert outcomes[3:5] == ["ok", "ok"] and "its limit: 4" in outcomes[5], outcomes
    assert outcomes[6:] == ["ok", "ok"], outcomes
    assert "Traceback" not in log.read_text() + log.with_suffix(".err").read_text()


def test_a_jwts_concurrent_crafts_in_the_queue_are_held_to_the_cap_per_subject(
    provider: Provider, database: str
) -> None:
    """With a team database, crafts are counted in the queue. The front caps JWTs at 1 craft at once: carol's claim
    asks for 200 and gets 1 (her second craft refused, told to ask for the claim, not `token add`'s option); a fresh
    token of hers (no claim: the default 2, held to 1) counts the craft her first token queued, her identity being her
    subject, not her token."""
    from tests.team.test_serve_queue import call

    options = ["--jwt-issuer", provider.url, "--jwt-audience", AUDIENCE, "--jwt-max-concurrent-crafts", "1"]
    wide = provider.token("k1", flakebot_limits={"concurrent_crafts": 200})
    fresh = provider.token("k1", jti="another")
    with serving(*options, database=database) as url:
        assert call(url, wide, "craft", {"need": "need a csv deduper"})["status"] == "queued"
        refused = [call(url, token, "craft", {"need": "need a word counter"}) for token in (wide, fresh)]
    for answer in refused:
        assert answer["is_error"] and answer["type"] == "QuotaExceeded", answer
        assert "has 1 crafts queued or running" in answer["error"] and "limits claim" in answer["fix"], answer
