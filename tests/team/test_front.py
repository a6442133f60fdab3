"""`flakebot serve`, the team front, as agents meet it: the real server in a process of its own on a free loopback
port, the MCP SDK's own Streamable HTTP client (both the 2025-11-25 session protocol and the stateless 2026-07-28 one)
and plain HTTP for what a client SDK hides (status codes, headers)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from benchmarks.scenarios import pileup
from flakebot.team.dburl import ENV as DATABASE_ENV
from tests.conftest import FLAKEBOT, json_result, require, run_cli

pytestmark = pytest.mark.timeout(180)  # each scenario bounded: a front that hangs fails its test, not the suite

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def add_token(name: str, *options: str) -> str:
    return str(json_result(run_cli("token", "add", name, *options, "--json", check=True))["token"])


@contextmanager
def serving(*options: str, log: Path | None = None, database: str | None = None) -> Iterator[str]:
    """`flakebot serve --port 0` until the block ends; its URL (the line it prints once listening, within a minute).
    Its stderr goes to `log`.err (a pipe nobody reads could fill and stall it). Stopped by its pid (SIGTERM, then
    SIGKILL), whatever happens in the block. `database`: the team database's URL (password and all), given as an
    admin should, in FLAKEBOT_DATABASE_URL (on the command line a password is refused)."""
    with serving_process(*options, log=log, database=database) as (url, _):
        yield url


@contextmanager
def serving_process(
    *options: str, log: Path | None = None, database: str | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """serving's URL and the front's process (for a test that kills it)."""
    logging = ["-vv", "--log-file", str(log)] if log else []
    errors = (log or Path(os.getcwd()) / "serve.log").with_suffix(".err")
    with errors.open("w") as stderr:
        process = subprocess.Popen(
            [*FLAKEBOT, *logging, "serve", "--port", "0", *options],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, **({DATABASE_ENV: database} if database else {})},
        )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("flakebot serve: "), f"{line}{errors.read_text()}"
        yield line.split()[2], process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


def post(url: str, body: Any, token: str | None = None, **headers: str) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url, json=body, headers={**ACCEPT, **auth, **headers}, timeout=30)


async def agent_session(
    url: str, token: str, mode: str
) -> tuple[str | None, list[str], dict[str, Any], dict[str, Any]]:
    """What one agent sees with `token`: the protocol spoken, the tool names, `list`'s and `show`'s results."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:  # type: ignore[arg-type]
            names = [tool.name for tool in (await client.list_tools()).tools]
            listed = await client.call_tool("list", {})
            shown = await client.call_tool("show", {"name": "no-such-tool"})
            texts = [json.loads(r.content[0].text) for r in (listed, shown)]  # type: ignore[union-attr]
            return client.session.protocol_version, names, texts[0], {**texts[1], "is_error": shown.is_error}


def test_a_token_opens_the_front_and_nothing_else_does(flakebot_home: Path, workdir: Path) -> None:
    token = add_token("alice", "--tenant", "acme")
    log = flakebot_home / "serve.log"
    with serving(log=log) as url:
        refused = post(url, INITIALIZE)
        assert refused.status_code == 401
        challenge = refused.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and 'resource_metadata="' in challenge
        metadata_url = challenge.split('resource_metadata="')[1].split('"')[0]
        metadata = httpx.get(metadata_url, timeout=10).json()
        assert metadata["resource"] == url and metadata["bearer_methods_supported"] == ["header"]
        assert httpx.get(url.replace("/mcp", "/.well-known/oauth-protected-resource"), timeout=10).json() == metadata
        assert post(url, INITIALIZE, "fbt_" + "x" * 43).status_code == 401  # well formed, never issued
        assert post(url, INITIALIZE, token[:-1]).status_code == 401

        for mode, protocol in (("legacy", "2025-11-25"), ("2026-07-28", "2026-07-28")):
            spoken, names, listed, shown = asyncio.run(agent_session(url, token, mode))
            assert spoken == protocol
            assert {"craft", "list", "show", "status"} <= set(names)
            assert listed == {"ok": True, "tools": []}
            assert shown["is_error"] and shown["ok"] is False and "no-such-tool" in shown["error"]

        run_cli("token", "revoke", "alice", check=True)
        assert post(url, INITIALIZE, token).status_code == 401  # the running server sees the revocation at once

    # who called what is audited with the token's principal and tenant, the arguments as a digest only
    records = json_result(run_cli("token", "audit", "--json", check=True))["records"]
    assert {(r["method"], r["tool"]) for r in records} >= {("tools/list", None), ("tools/call", "list")}
    # the two lists the agents asked for; a stateless call with arguments runs no listing of its own (the SDK's check
    # of Mcp-Param headers asks the server for the tool's schema: a whole tools/list per call before)
    assert sum(r["method"] == "tools/list" for r in records) == 2
    assert {(r["principal"], r["tenant"]) for r in records} == {("alice", "acme")}
    show = [r for r in records if r["tool"] == "show"]
    assert len(show) == 2 and all(r["outcome"] == "error" and r["exit_code"] == 4 for r in show)
    assert all(len(r["arguments_sha256"]) == 64 for r in records if r["method"] == "tools/call")
    audit_text = (workdir / "team/audit.jsonl").read_text()
    assert "no-such-tool" not in audit_text

    # the token is nowhere on disk but as its hash, nor in the server's log or output
    stored = (workdir / "team/tokens.json").read_text()
    assert token not in stored and token[4:] not in stored
    assert (workdir / "team/tokens.json").stat().st_mode & 0o077 == 0
    for path in [*workdir.rglob("*"), log]:
        if path.is_file():
            assert token[4:] not in path.read_text(errors="replace"), path
    assert log.stat().st_size > 0 and token[4:] not in log.with_suffix(".err").read_text()
    listed = run_cli("token", "list", "--json", check=True)
    assert token[4:] not in listed.stdout and json_result(listed)["tokens"][0]["revoked"]


def test_origin_and_sessions_belong_to_their_caller(flakebot_home: Path) -> None:
    alice, bob = add_token("alice"), add_token("bob")
    with serving() as url:
        assert post(url, INITIALIZE, alice, Origin="https://evil.example").status_code == 403
        assert post(url, INITIALIZE, alice, Host="evil.example").status_code == 421  # a rebound DNS name
        opened = post(url, INITIALIZE, alice, Origin="http://localhost:1234")
        assert opened.status_code == 200
        session = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
        version = {"mcp-session-id": session, "mcp-protocol-version": "2025-11-25"}
        assert post(url, listing, bob, **version).status_code == 404  # another principal: as if it did not exist
        assert post(url, listing, alice, **version).status_code == 200


def test_calls_past_a_tokens_rate_are_429_with_retry_after(flakebot_home: Path) -> None:
    slow, other = add_token("slow", "--calls-per-minute", "2"), add_token("other")
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list", "arguments": {}}}
    with serving() as url:
        session = {"mcp-session-id": post(url, INITIALIZE, slow).headers["mcp-session-id"]}
        answers = [post(url, call, slow, **session) for _ in range(3)]
        assert [a.status_code for a in answers[:2]] == [200, 200], answers[0].text
        refused = answers[2]
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        error = refused.json()["error"]
        assert (
            refused.json()["id"] == 3 and "limit: 2" in error["message"] and "Fix: call again after" in error["message"]
        )
        # another token's calls go on; so do the slow token's calls that are no tool calls
        assert asyncio.run(agent_session(url, other, "2026-07-28"))[2] == {"ok": True, "tools": []}
        listing = {"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}}
        assert post(url, listing, slow, **session).status_code == 200
        with pytest.raises(Exception) as raised:  # the SDK's client: the call fails, it does not hang
            asyncio.run(agent_session(url, slow, "legacy"))
        assert "its limit: 2" in repr(raised.value)  # the MCP error carries the one line
    refusals = [r for r in json_result(run_cli("token", "audit", "--json"))["records"] if r["outcome"] == "refused"]
    assert [(r["principal"], r["tool"]) for r in refusals][:1] == [("slow", "list")]


def test_serve_beyond_loopback_needs_tls_and_a_token(flakebot_home: Path) -> None:
    refused = run_cli("serve", "--host", "0.0.0.0", "--port", "0", timeout=60)
    assert refused.returncode == 71
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: refusing to serve on 0.0.0.0") and "Fix: " in lines[0]
    assert "TLS and a token" in lines[0]
    cert, key = flakebot_home / "cert.pem", flakebot_home / "key.pem"
    cert.write_text("x"), key.write_text("x")
    with_tls = run_cli("serve", "--host", "0.0.0.0", "--port", "0", "--tls-cert", str(cert), "--tls-key", str(key))
    assert with_tls.returncode == 71 and "without a token" in with_tls.stderr
    bad_pair = run_cli("serve", "--port", "0", "--tls-cert", str(cert), "--tls-key", str(key))
    assert bad_pair.returncode == 2 and bad_pair.stderr.count("\n") == 1 and "cannot use" in bad_pair.stderr
    as_json = run_cli("serve", "--host", "0.0.0.0", "--json")
    assert as_json.returncode == 2  # serve has no --json: a usage error, still one line


def served_slow_craft(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A slow craft's arguments as a token sends them: its model, a script on the server, is the server's own
    setting (set in the environment `serve` starts with): a token may not name a script."""
    craft = pileup.slow_craft(tmp_path)
    monkeypatch.setenv("FLAKEBOT_MODEL", craft.pop("model"))
    return craft


async def crafts(url: str, token: str, craft: dict[str, Any], count: int, mode: str) -> list[dict[str, Any]]:
    """`count` detached crafts from one session with `token`: each answer (a run handle, or an error)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:  # type: ignore[arg-type]
            answers = [await client.call_tool("craft", craft) for _ in range(count)]
            return [json.loads(a.content[0].text) for a in answers]  # type: ignore[union-attr]


def test_concurrent_crafts_are_counted_per_token_not_per_session(
    flakebot_home: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A token's cap holds across its sessions (and protocols): a client cannot open sessions to multiply it."""
    require("nix")
    one, two = add_token("one", "--concurrent-crafts", "1"), add_token("two", "--concurrent-crafts", "1")
    craft = served_slow_craft(tmp_path, monkeypatch)
    try:
        with serving() as url:
            first = asyncio.run(crafts(url, one, craft, 1, "legacy"))
            again = asyncio.run(crafts(url, one, craft, 1, "2026-07-28"))
            other = asyncio.run(crafts(url, two, craft, 1, "legacy"))
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")
    assert first[0]["ok"] and first[0]["status"] == "running", first
    assert again[0]["ok"] is False and again[0]["type"] == "JobLimit", again
    assert "1 jobs are running on token 'one'" in again[0]["error"]
    assert other[0]["ok"] and other[0]["status"] == "running", other


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its IP in the subject alternative names) and its key, as PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flakebot test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_tls_serves_https_to_an_agent_that_checks_the_certificate(flakebot_home: Path, tmp_path: Path) -> None:
    import ssl

    token = add_token("alice")
    cert, key = self_signed(tmp_path)
    with serving("--tls-cert", str(cert), "--tls-key", str(key)) as url:
        assert url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(cert))
        assert httpx.post(url, json=INITIALIZE, headers=ACCEPT, verify=context, timeout=30).status_code == 401
        metadata_url = url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp")
        assert httpx.get(metadata_url, verify=context, timeout=10).json()["resource"] == url

        async def agent() -> list[str]:
            headers = {"Authorization": f"Bearer {token}"}
            async with httpx2.AsyncClient(headers=headers, verify=context, timeout=30) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:  # type: ignore[arg-type]
                    return [tool.name for tool in (await client.list_tools()).tools]

        assert "craft" in asyncio.run(agent())


def test_a_long_running_fronts_tried_tools_are_bounded(flakebot_home: Path, tmp_path: Path, caplog: Any) -> None:
    """A front tries to install each finished job's tool its catalog lacks, again only after a wait
    (fetch_retry_seconds, 10 s here: test_tenant_publish tries it again); what it remembers of those tries is bounded
    (the least recently asked forgotten first), or a front serving for months would grow without end."""
    import dataclasses
    import logging

    from flakebot import config
    from flakebot.deliver.publish import signing_key
    from flakebot.mcp import front
    from flakebot.team.admission import MemoryAdmission
    from flakebot.team.tokens import TokenStore

    settings = dataclasses.replace(config.load(), tenant="acme")
    done = run_cli("config", "set", "catalogs", f"file://{tmp_path} {signing_key(settings).public}",
                   env={"FLAKEBOT_TENANT": "acme"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    settings = dataclasses.replace(config.load(), tenant="acme")
    state = front.TeamMCP(settings, [], TokenStore(settings.path("workdir")), MemoryAdmission())

    def tries(ref: str) -> int:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=front.__name__):
            state.fetch_tool(settings, ref, "need it")
        return sum(ref in record.getMessage() for record in caplog.records)

    assert tries("tool-0@0.1.0") == 1 and tries("tool-0@0.1.0") == 0  # tried once
    for n in range(1, front.FETCHED_KEPT + 1):
        state.fetch_tool(settings, f"tool-{n}@0.1.0", "need it")
    assert len(state._fetched) == front.FETCHED_KEPT
    assert tries(f"tool-{front.FETCHED_KEPT}@0.1.0") == 0  # the latest still remembered
    assert tries("tool-0@0.1.0") == 1  # the oldest forgotten: tried again
