"""A JWT principal's limits from its `flakebot_limits` claim, held to the front's caps (flakebot.team.claimlimits):
tokens signed by an identity provider serving its JWKS on 127.0.0.1 (tests/team/test_jwks.py), verified by the real
`flakebot serve`, called through the MCP SDK over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
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
    zero = run_cli(
        "serve",
        "--port",
        "0",
        "--jwt-issuer",
        "https://idp.example.test",
        "--jwt-audience",
        AUDIENCE,
        "--jwt-key",
        str(flakebot_home),
        "--jwt-max-concurrent-crafts",
        "0",
        timeout=60,
    )
    assert (
        zero.returncode == 2 and zero.stderr.count("\n") == 1 and "--jwt-max-concurrent-crafts must be" in zero.stderr
    )
