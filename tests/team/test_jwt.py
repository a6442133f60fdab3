"""`flakebot serve --jwt-issuer/--jwt-audience/--jwt-key`: an identity provider's JWTs, signed here with a key made in
the test, verified by the real server process (the MCP SDK's client for a valid one, plain HTTP for the refusals)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import json_result, run_cli
from tests.team.test_front import INITIALIZE, agent_session, post, serving

pytestmark = pytest.mark.timeout(180)

ISSUER = "https://idp.example.test/realms/team"
AUDIENCE = "flakebot-front"


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "carol@example.test",
        "iat": now,
        "exp": now + 600,
        "flakebot_tenant": "acme",
    }
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged(header: dict[str, Any], payload: dict[str, Any], secret: bytes | None) -> str:
    """A token PyJWT would not make: `alg: none` (no signature) or HS256 keyed with the provider's public key."""
    signing = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}"
    signature = b64(hmac.new(secret, signing.encode(), hashlib.sha256).digest()) if secret else ""
    return f"{signing}.{signature}"


def refused_with_metadata(url: str, token: str) -> bool:
    answer = post(url, INITIALIZE, token)
    return answer.status_code == 401 and 'resource_metadata="' in answer.headers.get("www-authenticate", "")


def test_an_identity_providers_jwts_are_verified_locally(flakebot_home: Path) -> None:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(public_pem)
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwt_options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    log = flakebot_home / "serve.log"
    with serving(*jwt_options, log=log) as url:
        valid = jwt.encode(claims(), private, algorithm="RS256")
        _, names, listed, _ = asyncio.run(agent_session(url, valid, "2026-07-28"))
        assert {"craft", "list", "show"} <= set(names) and listed == {"ok": True, "tools": []}

        metadata = httpx.get(url.replace("/mcp", "/.well-known/oauth-protected-resource"), timeout=10).json()
        assert metadata["authorization_servers"] == [ISSUER]

        refusals = {
            "wrong audience": jwt.encode(claims(aud="another-service"), private, algorithm="RS256"),
            "expired": jwt.encode(claims(exp=int(time.time()) - 3600), private, algorithm="RS256"),
            "wrong issuer": jwt.encode(claims(iss="https://evil.example.test"), private, algorithm="RS256"),
            "another key": jwt.encode(claims(), other, algorithm="RS256"),
            "no tenant": jwt.encode(claims(flakebot_tenant=None), private, algorithm="RS256"),
            "a tenant and a newline": jwt.encode(claims(flakebot_tenant="acme\n"), private, algorithm="RS256"),
            "no expiry": jwt.encode(claims(exp=None), private, algorithm="RS256"),
            "alg none": forged({"alg": "none", "typ": "JWT"}, claims(), None),
            "HS256 keyed with the public key": forged({"alg": "HS256", "typ": "JWT"}, claims(), public_pem),
        }
        for what, token in refusals.items():
            assert refused_with_metadata(url, token), what

    records = json_result(run_cli("token", "audit", "--json", check=True))["records"]
    assert {(r["principal"], r["tenant"]) for r in records} == {("carol@example.test", "acme")}
    assert valid.split(".")[2] not in log.read_text() + log.with_suffix(".err").read_text()


def test_a_jwks_file_names_its_keys_by_kid(flakebot_home: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
    key_file = flakebot_home / "jwks.json"
    key_file.write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "ES256"}]}))
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with serving(*options) as url:
        valid = jwt.encode(claims(), private, algorithm="ES256", headers={"kid": "k1"})
        assert asyncio.run(agent_session(url, valid, "legacy"))[2] == {"ok": True, "tools": []}
        unknown_kid = jwt.encode(claims(), private, algorithm="ES256", headers={"kid": "k2"})
        assert refused_with_metadata(url, unknown_kid)


def test_jwt_options_are_checked_before_serving(flakebot_home: Path) -> None:
    half = run_cli("serve", "--port", "0", "--jwt-issuer", ISSUER, timeout=60)
    assert half.returncode == 2 and half.stderr.count("\n") == 1 and "go together" in half.stderr
    junk = flakebot_home / "junk.pem"
    junk.write_text("not a key")
    bad = run_cli(
        "serve", "--port", "0", "--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(junk), timeout=60
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "neither a PEM public key nor a JWKS" in bad.stderr


def test_a_jwt_session_outlives_the_sweep_for_revoked_tokens(flakebot_home: Path) -> None:
    """The front ends, every second, the sessions of static tokens no longer active; an IdP lists no active users, so a
    JWT's session must be left to its token's expiry, not ended by that sweep."""
    from flakebot.mcp.front import REVOKED_SWEEP_SECONDS

    private = ec.generate_private_key(ec.SECP256R1())
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    token = jwt.encode(claims(), private, algorithm="ES256")

    async def one_session(url: str) -> list[bool]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
                first = await client.call_tool("list", {})
                await asyncio.sleep(REVOKED_SWEEP_SECONDS * 3)  # three sweeps
                second = await client.call_tool("list", {})
                return [bool(first.is_error), bool(second.is_error)]

    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with serving(*options, log=flakebot_home / "serve.log") as url:
        assert asyncio.run(one_session(url)) == [False, False]


def test_an_expired_jwts_open_session_hears_no_more_of_its_tenants_changes(flakebot_home: Path, tmp_path: Path) -> None:
    """carol's JWT (acme) expires while her session holds its stream open (the revocation sweep leaves a JWT's session
    to its expiry): alice's rm of an acme tool is told to alice's open session, and no longer to carol's."""
    import dataclasses

    from flakebot import config
    from tests.team.test_tenant_catalogs import catalogue, listen, rm_then_wait

    private = ec.generate_private_key(ec.SECP256R1())
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    catalogue(dataclasses.replace(config.load(), tenant="acme"), tmp_path, "acme-one")
    from flakebot.team.idtokens import LEEWAY_SECONDS

    expiry = int(time.time()) + 5 - LEEWAY_SECONDS  # it verifies for 5 s more (the leeway for clock skew)
    tokens = {
        "alice": jwt.encode(claims(sub="alice@example.test"), private, algorithm="ES256"),
        "carol": jwt.encode(claims(exp=expiry), private, algorithm="ES256"),
    }

    async def scenario(url: str) -> dict[str, Any]:
        heard: dict[str, list[Any]] = {name: [] for name in tokens}
        ready, done = {name: asyncio.Event() for name in tokens}, asyncio.Event()
        sessions = [asyncio.create_task(listen(url, tokens[n], heard[n], ready[n], done)) for n in tokens]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in ready.values())), 30)
        # carol's token no longer verifies; her stream is still open
        await asyncio.sleep(max(0.0, expiry + LEEWAY_SECONDS - time.time()) + 1.5)
        removed = await rm_then_wait(url, tokens["alice"], "acme-one", heard["alice"])  # and what carol's would hear
        told = {name: len(notes) for name, notes in heard.items()}
        done.set()
        await asyncio.gather(*sessions, return_exceptions=True)  # carol's closing DELETE is refused: expired
        return {"removed": removed, "told": told}

    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with serving(*options, log=flakebot_home / "serve.log") as url:
        seen = asyncio.run(scenario(url))
    assert not seen["removed"]["is_error"], seen
    assert seen["told"] == {"alice": 1, "carol": 0}, seen


def test_a_jwt_named_like_a_static_token_is_another_principal(flakebot_home: Path, database: str) -> None:
    """Static token 'alice' (cap 1) and JWTs of her tenant whose subject is 'alice', or her token's id: each is
    another principal. They neither cancel her queued craft nor are charged for it (their own crafts queue), nor see
    her detached task; `token audit --token alice` lists the static token's calls only (it listed the JWT named
    'alice' too), and a JWT user's are found by its principal_id."""
    from tests.team.test_front import add_token
    from tests.team.test_serve_queue import Session

    private = ec.generate_private_key(ec.SECP256R1())
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    alice = add_token("alice", "--tenant", "acme", "--concurrent-crafts", "1")
    alice_id = json_result(run_cli("token", "list", "--json", check=True))["tokens"][0]["id"]
    named = jwt.encode(claims(sub="alice"), private, algorithm="ES256")
    hexed = jwt.encode(claims(sub=alice_id), private, algorithm="ES256")
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]

    def task(session: Session, need: str) -> dict[str, Any]:
        return session.ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})

    with serving(*options, database=database, log=flakebot_home / "serve.log") as url:
        mine, as_name, as_id = Session(url, alice), Session(url, named), Session(url, hexed)
        job = str(task(mine, "need a csv deduper")["result"]["task"]["taskId"])
        for other in (as_name, as_id):
            refused = other.ask("tasks/cancel", {"taskId": job})
            assert "error" in refused and "result" not in refused, refused
            assert task(other, f"need a tool of {id(other)}")["result"]["task"]["status"] == "working"
        assert "concurrent crafts" in task(mine, "need a word counter")["error"]["message"]  # alice's one is hers
        detached = mine.ask("tools/call", {"name": "package", "arguments": {"target": str(flakebot_home)}, "task": {}})
        their_view = as_name.ask("tasks/get", {"taskId": detached["result"]["task"]["taskId"]})
        assert "error" in their_view, their_view
        assert mine.ask("tasks/cancel", {"taskId": job})["result"]["status"] == "cancelled"  # hers alone
    every = json_result(run_cli("token", "audit", "--json", check=True))["records"]
    records = json_result(run_cli("token", "audit", "--token", "alice", "--json", check=True))["records"]
    assert records and {r["principal_id"] for r in records} == {alice_id}, every
    jwt_ids = {r["principal_id"] for r in every} - {alice_id}
    assert len(jwt_ids) == 2 and all(i.startswith("jwt-") for i in jwt_ids), every
    for jwt_id in jwt_ids:  # a JWT user's calls, by its id
        theirs = json_result(run_cli("token", "audit", "--token", jwt_id, "--json", check=True))["records"]
        assert theirs and {r["principal_id"] for r in theirs} == {jwt_id}, theirs


def test_no_claim_of_a_jwt_grants_it_the_metrics(flakebot_home: Path) -> None:
    """/metrics answers a token granted `metrics` by `token add --grant`, and nothing a JWT says grants it: a claim
    named grants, scope, scp or metrics, a subject named as the granted static token, or as its id, is 403 in one
    line like any ungranted token (the claims are the IdP's users' to ask for, the grant the admin's to give)."""
    from tests.team.test_front import add_token

    private = ec.generate_private_key(ec.SECP256R1())
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    scraper = add_token("prometheus", "--grant", "metrics")
    scraper_id = json_result(run_cli("token", "list", "--json", check=True))["tokens"][0]["id"]
    asking = [
        claims(grants=["metrics"]),
        claims(scope="metrics openid"),
        claims(scp=["metrics"]),
        claims(metrics=True),
        claims(sub="prometheus", grants=["metrics"]),
        claims(sub=scraper_id),
    ]
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with serving(*options, log=flakebot_home / "serve.log") as url:
        scrape = url.replace("/mcp", "/metrics")
        assert httpx.get(scrape, headers={"Authorization": f"Bearer {scraper}"}, timeout=30).status_code == 200
        for asked in asking:
            token = jwt.encode(asked, private, algorithm="ES256")
            refused = httpx.get(scrape, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert refused.status_code == 403 and refused.text.count("\n") == 1, (asked, refused.text)
            assert "may not read /metrics" in refused.text and "flakebot_" not in refused.text, refused.text
