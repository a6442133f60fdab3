"""Each tenant's tools in a catalog of its own, over the organisation's catalog every token reads
(flakebot/deliver/catalog.py), as agents meet them through a real `flakebot serve` and the MCP SDK's client; and a
worker crafting a queued job into the job row's tenant's catalog."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from psycopg.types.json import Jsonb

from flakebot import config
from flakebot.deliver.catalog import Catalog
from flakebot.pipeline.request import RunRequest
from flakebot.team import db, queue
from flakebot.team.dburl import ENV as DATABASE_ENV
from tests.conftest import FLAKEBOT
from tests.team.test_front import ACCEPT, INITIALIZE, add_token, serving

pytestmark = pytest.mark.timeout(180)

UNKNOWN = "zz-never-made"  # what another tenant's tool must be indistinguishable from


def catalogue(settings: config.Settings, root: Path, name: str) -> None:
    """`name`, a shell script standing in for a crafted binary (its directory as the store path), catalogued as a
    craft catalogues it: into the catalog `settings` open (a tenant's, with `tenant` set)."""
    store = root / f"store-{name}"
    (store / "bin").mkdir(parents=True)
    (store / "bin" / name).write_text('#!/bin/sh\necho "made by $0"\n')
    (store / "bin" / name).chmod(0o755)
    flake = root / f"flake-{name}"
    flake.mkdir()
    manifest = {"name": name, "main_program": name, "store_path": str(store), "nix_run_argv": ["nix", "run", "x"]}
    Catalog.open(settings).add(
        name, need=f"{name} rows", flake_dir=flake, manifest={**manifest, "summary": ""}, usage_md=f"# {name}\n",
        store_path=str(store), run_id=f"r-{name}", origin={},
    )  # fmt: skip


def answer(result: Any) -> dict[str, Any]:
    return {**json.loads(result.content[0].text), "is_error": result.is_error}


async def tenant_view(url: str, token: str, probes: list[str], rm: list[str]) -> dict[str, Any]:
    """What `token` sees: its tools/list's crafted names, `list`'s names, and for each probed name the answers of
    show, run, improve and a call of it as a tool; then `rm` of each name in `rm`, and the list after."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
            listed = {tool.name for tool in (await client.list_tools()).tools}
            names = {t["name"] for t in answer(await client.call_tool("list", {}))["tools"]}
            probed = {}
            for name in probes:
                probed[name] = {
                    "show": answer(await client.call_tool("show", {"name": name})),
                    "run": answer(await client.call_tool("run", {"tool": name, "args": []})),
                    "call": answer(await client.call_tool(name, {})),
                    "improve": answer(await client.call_tool("improve", {"tool": name, "request": "add --json"})),
                }
            removed = {name: answer(await client.call_tool("rm", {"tool": name})) for name in rm}
            after = {t["name"] for t in answer(await client.call_tool("list", {}))["tools"]}
            return {"listed": listed, "names": names, "probed": probed, "removed": removed, "after": after}


async def craft(url: str, token: str, need: str) -> dict[str, Any]:
    """`token`'s craft of `need`, waited for (a detached job of the front's, as every long call)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
            return answer(await client.call_tool("craft", {"need": need, "wait": True}))


def same_as_unknown(seen: dict[str, Any], name: str) -> dict[str, Any]:
    """`seen`'s answers for `name` with the name written as UNKNOWN: word for word an unknown name's, if hidden."""
    return json.loads(json.dumps(seen).replace(name, UNKNOWN))


def test_a_tenants_tools_are_its_own_and_the_organisations_everyones(flakebot_home: Path, tmp_path: Path) -> None:
    settings = config.load()
    catalogue(settings, tmp_path, "org-lines")  # the admin's catalog: catalog_dir itself
    catalogue(dataclasses.replace(settings, tenant="acme"), tmp_path, "acme-lines")
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "globex")
    with serving() as url:
        acme = asyncio.run(tenant_view(url, alice, ["acme-lines"], rm=["org-lines"]))
        globex = asyncio.run(tenant_view(url, bob, ["acme-lines", UNKNOWN], rm=["acme-lines", UNKNOWN, "org-lines"]))
        crafts = {
            ("acme", "own"): asyncio.run(craft(url, alice, "need acme-lines rows")),
            ("acme", "org"): asyncio.run(craft(url, alice, "need org-lines rows")),
            ("globex", "acme's"): asyncio.run(craft(url, bob, "need acme-lines rows")),
        }
        acme_again = asyncio.run(tenant_view(url, alice, [], rm=["acme-lines"]))
        scraper = add_token("prometheus", "--grant", "metrics")
        scraped = httpx.get(url.replace("/mcp", "/metrics"), headers={"Authorization": f"Bearer {scraper}"}, timeout=30)
    assert scraped.status_code == 200 and "acme-lines" not in scraped.text  # the scraper reads no tenant's tool name

    # acme sees its own tool and the organisation's, and calls its own
    assert {"acme-lines", "org-lines"} <= acme["listed"] and acme["names"] == {"acme-lines", "org-lines"}
    own = acme["probed"]["acme-lines"]
    assert not own["show"]["is_error"] and own["show"]["name"] == "acme-lines"
    assert not own["call"]["is_error"] and "made by" in own["call"]["stdout"], own["call"]
    assert not own["run"]["is_error"] and "made by" in own["run"]["stdout"], own["run"]

    # globex sees the organisation's tool, never acme's: every answer about it is an unknown name's, word for word
    assert "org-lines" in globex["listed"] and "acme-lines" not in globex["listed"]
    assert globex["names"] == {"org-lines"}
    hidden, unknown = globex["probed"]["acme-lines"], globex["probed"][UNKNOWN]
    assert all(hidden[door]["is_error"] for door in hidden), hidden
    assert same_as_unknown(hidden, "acme-lines") == unknown
    assert same_as_unknown(globex["removed"]["acme-lines"], "acme-lines") == globex["removed"][UNKNOWN]

    # a craft is answered from the caller's catalog or the organisation's, never from another tenant's
    assert crafts[("acme", "own")]["name"] == "acme-lines" and not crafts[("acme", "own")]["is_error"], crafts
    assert crafts[("acme", "org")]["name"] == "org-lines" and not crafts[("acme", "org")]["is_error"], crafts
    assert crafts[("globex", "acme's")]["is_error"] and "acme-lines" not in json.dumps(crafts[("globex", "acme's")])

    # no token removes (or improves) the organisation's tool: one line saying whose it is and what to do instead
    for refused in (acme["removed"]["org-lines"], globex["removed"]["org-lines"]):
        assert refused["is_error"] and "organisation's catalog" in refused["error"] and refused["fix"], refused
    improved = acme_again["removed"]  # acme removes its own tool: its catalog only
    assert not improved["acme-lines"]["is_error"], improved
    assert acme_again["after"] == {"org-lines"}
    assert Catalog.open(settings).entry("org-lines") is not None  # the organisation's catalog as it was
    assert Catalog.open(settings).tools().keys() == {"org-lines"}  # acme's tool was never in it


def test_an_organisations_tool_is_not_improved_by_a_token(flakebot_home: Path, tmp_path: Path) -> None:
    catalogue(config.load(), tmp_path, "org-lines")
    token = add_token("alice", "--tenant", "acme")

    async def improve(url: str) -> dict[str, Any]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
                return answer(await client.call_tool("improve", {"tool": "org-lines", "request": "add --json"}))

    with serving() as url:
        refused = asyncio.run(improve(url))
    assert refused["is_error"] and "organisation's catalog" in refused["error"], refused
    assert not (flakebot_home / "work" / "mcp-jobs").exists() or not list(
        (flakebot_home / "work/mcp-jobs").glob("*.jsonl")
    )


def forge(database: str, tenant: str, need: str) -> int:
    """A craft job row of `tenant`, written straight into the table (as anyone with the database's password could)."""
    with db.connect(database) as conn:
        queue.set_quota(conn, tenant, max_in_flight=99, max_per_day=99)
        row = conn.execute(
            "INSERT INTO jobs (tenant, principal, kind, need_digest, request) VALUES (%s, 'mallory', 'craft', "
            "md5(random()::text), %s) RETURNING id",
            (tenant, Jsonb(RunRequest(need=need).to_dict())),
        ).fetchone()
        conn.commit()
    assert row is not None
    return int(row["id"])


def test_a_worker_crafts_into_the_job_rows_tenants_catalog(database: str, flakebot_home: Path, tmp_path: Path) -> None:
    """A need acme's catalog holds is answered from it for acme's job, not for globex's (which goes on to craft, and
    fails on the worker's model); a row whose tenant is no tenant name fails before any catalog is touched."""
    settings = config.load()
    catalogue(dataclasses.replace(settings, tenant="acme"), tmp_path, "acme-lines")
    jobs = {tenant: forge(database, tenant, "need acme-lines rows") for tenant in ("acme", "globex", "../escape")}
    env = {**os.environ, DATABASE_ENV: database, "FLAKEBOT_MODEL": "scripted:/nonexistent.json"}
    for _ in jobs:
        done = subprocess.run(
            [*FLAKEBOT, "worker", "--once", "--json"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    with db.connect(database) as conn:
        rows = {tenant: queue.get(conn, job, tenant) for tenant, job in jobs.items()}
    acme, globex, escape = rows["acme"], rows["globex"], rows["../escape"]
    assert acme is not None and acme["state"] == "done" and acme["result"]["name"] == "acme-lines", acme
    assert globex is not None and globex["state"] == "failed" and "acme-lines" not in json.dumps(globex["error"])
    assert escape is not None and escape["state"] == "failed" and escape["error"]["type"] == "UsageError", escape
    assert not (settings.path("catalog_dir") / "escape").exists()
    assert Catalog.open(settings).tools() == {}  # the organisation's catalog untouched


async def service_view(url: str, token: str, names: list[str], up: bool) -> dict[str, Any]:
    """`token`'s answers of every service verb naming each of `names` (after its own service_up of the first, with
    `up`), and its `services`."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
            seen: dict[str, Any] = {}
            if up:
                seen["up"] = answer(await client.call_tool("service_up", {"service": names[0]}))
            seen["services"] = answer(await client.call_tool("services", {}))
            for name in names:
                seen[name] = {
                    "logs": answer(await client.call_tool("service_logs", {"service": name, "lines": 5})),
                    "request": answer(
                        await client.call_tool("service_request", {"service": name, "method": "GET", "path": "/kv/x"})
                    ),
                    "rollback": answer(await client.call_tool("service_rollback", {"service": name})),
                    "down": answer(await client.call_tool("service_down", {"service": name})),
                    "up": answer(await client.call_tool("service_up", {"service": name})),
                }
            return seen


@pytest.mark.slow
def test_a_tenants_service_is_its_own(flakebot_home: Path, tmp_path: Path) -> None:
    """kv-service packaged into acme's catalog and into globex's (the CLI with the tenant setting: one program, one
    store path) and started by acme's agent: globex's agent neither lists it nor reaches, reads, rolls back or stops
    it (each answer is an unknown name's), and cannot start its own kv-service over it."""
    from tests.conftest import json_result, require, run_cli
    from tests.services.test_supervisor import KV_SERVICE

    require("nix", "cargo", "bwrap", "pasta")
    for tenant in ("acme", "globex"):
        done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json",
                       env={"FLAKEBOT_TENANT": tenant})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json_result(done)["kind"] == "service"
    assert Catalog.open(config.load()).tools() == {}  # in the tenants' catalogs, not the organisation's
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "globex")
    with serving() as url:
        try:
            acme = asyncio.run(service_view(url, alice, [], up=False))  # nothing started yet
            started = asyncio.run(service_view(url, alice, ["kv-service"], up=True))["up"]
            globex = asyncio.run(service_view(url, bob, ["kv-service", UNKNOWN], up=False))
            listed = asyncio.run(service_view(url, alice, [], up=False))["services"]
        finally:
            run_cli("down", "kv-service")
    assert acme["services"]["services"] == []
    assert not started["is_error"] and started["state"] == "running", started
    assert [s["name"] for s in listed["services"]] == ["kv-service"]
    assert globex["services"]["services"] == []
    hidden, unknown = globex["kv-service"], globex[UNKNOWN]
    taken = hidden.pop("up")
    assert taken["is_error"] and "taken on this machine" in taken["error"] and taken["fix"], taken
    assert all(hidden[verb]["is_error"] for verb in hidden), hidden
    unknown.pop("up")
    assert same_as_unknown(hidden, "kv-service") == unknown


@pytest.mark.slow
def test_a_tenants_service_cannot_need_another_tenants_running_service(flakebot_home: Path) -> None:
    """globex packages spy needing kv-service while acme's kv-service runs: globex's service_up of spy is refused
    in one line (its start would hand spy acme's kv-service at FLAKEBOT_KV_SERVICE_URL), and nothing of globex's
    starts."""
    from tests.conftest import require, run_cli
    from tests.services.test_supervisor import KV_SERVICE

    require("nix", "cargo", "bwrap", "pasta")
    common = [str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json"]
    for tenant, extra in (("acme", []), ("globex", []), ("globex", ["--name", "spy", "--needs", "kv-service"])):
        done = run_cli("package-service", *common, *extra, env={"FLAKEBOT_TENANT": tenant})
        assert done.returncode == 0, done.stderr
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "globex")
    with serving() as url:
        try:
            started = asyncio.run(service_view(url, alice, ["kv-service"], up=True))["up"]
            spy = asyncio.run(service_view(url, bob, ["spy"], up=True))["up"]
        finally:
            run_cli("down", "spy")
            run_cli("down", "kv-service")
    assert not started["is_error"] and started["state"] == "running", started
    assert spy["is_error"] and "kv-service" in spy["error"] and spy["fix"], spy
    assert not (flakebot_home / "work" / "services" / "spy" / "launch.json").exists()


async def calls(url: str, token: str, steps: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """`token`'s answers to each (tool, arguments) of `steps`, in one session."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
            return [answer(await client.call_tool(tool, arguments)) for tool, arguments in steps]


@pytest.mark.slow
def test_a_service_a_tenants_service_up_starts_as_a_need_is_that_tenants(flakebot_home: Path) -> None:
    """acme's web needs acme's kv-service; alice's service_up of web starts both: kv-service is acme's as web is
    (alice lists it, reads its logs and stops it), and globex's agent sees neither (its answers an unknown name's)."""
    from flakebot.mcp import tenantservices
    from tests.conftest import require, run_cli
    from tests.services.test_supervisor import KV_SERVICE

    require("nix", "cargo", "bwrap", "pasta")
    common = [str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json"]
    for extra in ([], ["--name", "web", "--needs", "kv-service"]):
        done = run_cli("package-service", *common, *extra, env={"FLAKEBOT_TENANT": "acme"})
        assert done.returncode == 0, done.stderr
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "globex")
    logs = {"service": "kv-service", "lines": 5}
    with serving() as url:
        try:
            up, listed = asyncio.run(calls(url, alice, [("service_up", {"service": "web"}), ("services", {})]))
            theirs, hidden, unknown = asyncio.run(
                calls(
                    url, bob, [("services", {}), ("service_logs", logs), ("service_logs", {**logs, "service": UNKNOWN})]
                )
            )
            read, down = asyncio.run(
                calls(url, alice, [("service_logs", logs), ("service_down", {"service": "kv-service"})])
            )
        finally:
            run_cli("down", "web")
            run_cli("down", "kv-service")
    assert not up["is_error"] and up["state"] == "running", up
    assert sorted(s["name"] for s in listed["services"]) == ["kv-service", "web"], listed
    assert theirs["services"] == [] and hidden["is_error"], (theirs, hidden)
    assert same_as_unknown(hidden, "kv-service") == unknown
    assert not read["is_error"] and not down["is_error"], (read, down)
    assert tenantservices.owner_of(config.load(), "kv-service") == "acme"


@pytest.mark.slow
def test_two_tenants_first_service_up_of_one_name_at_once_starts_one_and_refuses_the_other(flakebot_home: Path) -> None:
    """acme and globex each hold a kv-service and both agents ask for it at the same moment, before it ever ran
    here: one starts it and owns it, the other is told the name is taken (never "running already" at a port, never
    handed the other's service); the owner alone lists and stops it."""
    import threading

    from tests.conftest import require, run_cli
    from tests.services.test_supervisor import KV_SERVICE

    require("nix", "cargo", "bwrap", "pasta")
    for tenant in ("acme", "globex"):
        done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json",
                       env={"FLAKEBOT_TENANT": tenant})  # fmt: skip
        assert done.returncode == 0, done.stderr
    tokens = {"acme": add_token("alice", "--tenant", "acme"), "globex": add_token("bob", "--tenant", "globex")}
    barrier = threading.Barrier(len(tokens))
    ups: dict[str, dict[str, Any]] = {}

    def up(tenant: str, url: str) -> None:
        async def race() -> dict[str, Any]:
            headers = {"Authorization": f"Bearer {tokens[tenant]}"}
            async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
                async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
                    await asyncio.to_thread(barrier.wait, 30)  # both sessions open: the calls leave together
                    return answer(await client.call_tool("service_up", {"service": "kv-service"}))

        ups[tenant] = asyncio.run(race())

    with serving() as url:
        try:
            racers = [threading.Thread(target=up, args=(tenant, url)) for tenant in tokens]
            for racer in racers:
                racer.start()
            for racer in racers:
                racer.join(180)
            after = {t: asyncio.run(calls(url, token, [("services", {})]))[0] for t, token in tokens.items()}
            won = [t for t, seen in ups.items() if not seen["is_error"]]
            lost = [t for t in tokens if t not in won]
            assert len(won) == 1 and len(lost) == 1, ups
            (down,) = asyncio.run(calls(url, tokens[won[0]], [("service_down", {"service": "kv-service"})]))
        finally:
            run_cli("down", "kv-service")
    winner, loser = ups[won[0]], ups[lost[0]]
    assert winner["state"] == "running", winner
    assert "taken on this machine" in loser["error"] and loser["fix"] and "port" not in loser["error"], loser
    assert [s["name"] for s in after[won[0]]["services"]] == ["kv-service"], after
    assert after[lost[0]]["services"] == [], after
    assert not down["is_error"], down


@pytest.mark.slow
def test_a_tenants_service_up_of_the_organisations_stopped_service_leaves_it_the_organisations(
    flakebot_home: Path,
) -> None:
    """The admin started the organisation's kv-service and stopped it (its state kept: what every tenant's agents
    stored in it): alice's (acme) service_up starts it again, and it stays the organisation's, not acme's with that
    state: bob (globex) still lists it and stops it."""
    from flakebot.mcp import tenantservices
    from tests.conftest import require, run_cli
    from tests.services.test_supervisor import KV_SERVICE

    require("nix", "cargo", "bwrap", "pasta")
    done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json")
    assert done.returncode == 0, done.stderr
    for verb in ("up", "down"):
        done = run_cli(verb, "kv-service")
        assert done.returncode == 0, done.stderr
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "globex")
    with serving() as url:
        try:
            (up,) = asyncio.run(calls(url, alice, [("service_up", {"service": "kv-service"})]))
            listed, down = asyncio.run(calls(url, bob, [("services", {}), ("service_down", {"service": "kv-service"})]))
        finally:
            run_cli("down", "kv-service")
    assert not up["is_error"] and up["state"] == "running", up
    assert tenantservices.owner_of(config.load(), "kv-service") is None
    assert [s["name"] for s in listed["services"]] == ["kv-service"], listed
    assert not down["is_error"], down


@pytest.mark.slow
def test_a_tenants_first_service_up_of_an_organisations_service_does_not_take_its_name(flakebot_home: Path) -> None:
    """kv-service is the organisation's, never started here: alice's (acme) service_up starts it as the organisation's,
    not as acme's (else the first tenant to ask would take every organisation service's name, and what other
    tenants store in it, from all the others): bob (globex) lists it and stops it, and starts it again himself."""
    from flakebot.mcp import tenantservices
    from tests.conftest import require, run_cli
    from tests.services.test_supervisor import KV_SERVICE

    require("nix", "cargo", "bwrap", "pasta")
    done = run_cli("package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--json")
    assert done.returncode == 0, done.stderr
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "globex")
    up = {"service": "kv-service"}
    with serving() as url:
        try:
            (started,) = asyncio.run(calls(url, alice, [("service_up", up)]))
            listed, down, again = asyncio.run(
                calls(url, bob, [("services", {}), ("service_down", up), ("service_up", up)])
            )
        finally:
            run_cli("down", "kv-service")
    assert not started["is_error"] and started["state"] == "running", started
    assert [s["name"] for s in listed["services"]] == ["kv-service"], listed
    assert not down["is_error"] and not again["is_error"], (down, again)
    assert tenantservices.owner_of(config.load(), "kv-service") is None


def test_a_tenants_tool_is_never_shown_another_tenants_catalog_or_flakebots_own_files(
    flakebot_home: Path, tmp_path: Path
) -> None:
    """alice's (acme) own tool prints the file its argument names; named globex's tool's USAGE.md, globex's catalog
    database or the directory its signing keys live in (catalog_dir/tenants/globex/keys), the run is refused in one
    line before the tool starts (an argument's file is bound into the sandbox; flakebot's own directories hold every
    tenant's catalog, keys, runs and services), as is one naming the organisation's catalog; a file of the caller's
    own reaches the tool. A path there that does not exist is refused alike (the refusal tells nothing). The tree is made traversable as a server's /var/lib is (else the sandbox's unprivileged uid
    could not reach it under root anyway)."""
    settings = config.load()
    acme, globex = dataclasses.replace(settings, tenant="acme"), dataclasses.replace(settings, tenant="globex")
    catalogue(globex, tmp_path, "globex-one")
    store = tmp_path / "store-peek"
    (store / "bin").mkdir(parents=True)
    (store / "bin" / "peek").write_text('#!/bin/sh\ncat "$1"\n')
    (store / "bin" / "peek").chmod(0o755)
    (tmp_path / "flake-peek").mkdir()
    manifest = {"name": "peek", "main_program": "peek", "store_path": str(store), "nix_run_argv": ["nix", "run", "x"]}
    Catalog.open(acme).add(
        "peek", need="print a file", flake_dir=tmp_path / "flake-peek", manifest={**manifest, "summary": ""},
        usage_md="# peek\n", store_path=str(store), run_id="r-peek", origin={},
    )  # fmt: skip
    theirs = Path(Catalog.open(globex).entry("globex-one")["dir"]) / "USAGE.md"
    keys = Catalog.open(globex).root / "keys"
    keys.mkdir()
    mine = flakebot_home / "mine.txt"
    mine.write_text("acme's own data\n")
    assert "globex-one" in theirs.read_text()
    opened = [p for p in [theirs, *theirs.parents] if p.is_relative_to(Path("/tmp")) and p != Path("/tmp")]
    modes = {p: p.stat().st_mode & 0o777 for p in [*opened, store, store / "bin"]}
    alice = add_token("alice", "--tenant", "acme")
    try:
        for path in modes:
            path.chmod(modes[path] | 0o755 if path.is_dir() else modes[path] | 0o644)
        targets = [theirs, Catalog.open(globex).index.path, keys, settings.path("catalog_dir") / "catalog.db",
                   flakebot_home / "data", keys / "flakebot-x_globex-1.secret", mine]  # fmt: skip
        with serving() as url:
            seen = asyncio.run(calls(url, alice, [("run", {"tool": "peek", "args": [str(t)]}) for t in targets]))
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    *refused, own = seen
    for answered in refused:
        assert answered["is_error"] and "flakebot's own files" in answered["error"] and answered["fix"], answered
        assert "stdout" not in answered, answered
    assert not own["is_error"] and "acme's own data" in json.dumps(own), own


def test_a_craft_from_a_path_in_another_tenants_catalog_is_as_from_an_unknown_one(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """globex's craft `from` a directory of acme's catalog (its tool's flake) is answered as from a path of a tool
    acme does not hold: the server's files are no door into another tenant's catalog."""
    script = tmp_path / "model.json"
    script.write_text(json.dumps({"turns": []}))
    monkeypatch.setenv("FLAKEBOT_MODEL", f"scripted:{script}")
    acme = dataclasses.replace(config.load(), tenant="acme")
    catalogue(acme, tmp_path, "secret")
    flake = Catalog.open(acme).get("secret")["dir"] + "/flake"
    bob = add_token("bob", "--tenant", "globex")

    async def craft(url: str, source: str, **more: str) -> dict[str, Any]:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bob}"}, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
                return answer(
                    await client.call_tool("craft", {"need": "need a copy", "from": source, "wait": True, **more})
                )

    with serving() as url:
        known = asyncio.run(craft(url, flake))
        unknown = asyncio.run(craft(url, flake.replace("/secret/", f"/{UNKNOWN}/")))
        registry = asyncio.run(craft(url, "https://example.test/x.git", registry=flake))  # a directory registry
    assert known == json.loads(json.dumps(unknown).replace(UNKNOWN, "secret")), (known, unknown)
    assert known["type"] == registry["type"] == "UsageError" and "registry" in registry["error"], registry


async def listen(url: str, token: str, heard: list[Any], ready: asyncio.Event, done: asyncio.Event) -> None:
    """A 2025-11-25 session of `token` that lists its tools, then holds its stream open until `done`, keeping every
    notification it hears in `heard`."""
    import mcp_types as types

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.append(message)

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", message_handler=on_message) as client:  # type: ignore[arg-type]
            await client.list_tools()
            await asyncio.sleep(1)  # the session's standalone stream (GET) opens after initialize
            ready.set()
            await done.wait()


async def rm_then_wait(url: str, token: str, tool: str, heard: list[Any]) -> dict[str, Any]:
    """`rm TOOL` as `token`'s own session; then up to 5 s for `heard` (a listener of the same tenant) to hear of it,
    and 1 s more: what any other session would have heard by then."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:  # type: ignore[arg-type]
            removed = answer(await client.call_tool("rm", {"tool": tool}))
    for _ in range(50):
        await asyncio.sleep(0.1)
        if heard:
            break
    await asyncio.sleep(1)
    return removed


def test_a_tenants_catalog_change_is_told_to_each_of_its_sessions_and_no_other_tenants(
    flakebot_home: Path, tmp_path: Path
) -> None:
    """alice removes one of acme's tools: carol's open session (another token of acme) hears tools/list_changed as
    alice's does, bob's (globex) hears nothing; then bob's removal of his own tool is told to bob, not to acme."""
    settings = config.load()
    catalogue(dataclasses.replace(settings, tenant="acme"), tmp_path, "acme-one")
    catalogue(dataclasses.replace(settings, tenant="globex"), tmp_path, "globex-one")
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    bob, dave = add_token("bob", "--tenant", "globex"), add_token("dave", "--tenant", "globex")

    async def scenario(url: str) -> dict[str, Any]:
        heard: dict[str, list[Any]] = {"alice": [], "carol": [], "bob": [], "dave": []}
        ready = {name: asyncio.Event() for name in heard}
        done = asyncio.Event()
        tokens = {"alice": alice, "carol": carol, "bob": bob, "dave": dave}
        sessions = [asyncio.create_task(listen(url, tokens[n], heard[n], ready[n], done)) for n in heard]
        await asyncio.wait_for(asyncio.gather(*(event.wait() for event in ready.values())), 30)
        removed = {"acme": await rm_then_wait(url, alice, "acme-one", heard["carol"])}
        after_acme = {name: len(notes) for name, notes in heard.items()}
        removed["globex"] = await rm_then_wait(url, bob, "globex-one", heard["dave"])
        done.set()
        await asyncio.gather(*sessions)
        return {"removed": removed, "after_acme": after_acme, "after_globex": {n: len(v) for n, v in heard.items()}}

    with serving() as url:
        seen = asyncio.run(scenario(url))
        opened = httpx.post(url, json=INITIALIZE, headers={**ACCEPT, "Authorization": f"Bearer {alice}"}, timeout=30)
    # a client acts on tools/list_changed only from a server that said it sends it (as `flakebot mcp` says)
    capabilities = json.loads(opened.text.split("data: ", 1)[1].splitlines()[0])["result"]["capabilities"]
    assert capabilities["tools"]["listChanged"] is True, capabilities
    assert not seen["removed"]["acme"]["is_error"] and not seen["removed"]["globex"]["is_error"], seen
    assert seen["after_acme"] == {"alice": 1, "carol": 1, "bob": 0, "dave": 0}, seen
    assert seen["after_globex"] == {"alice": 1, "carol": 1, "bob": 1, "dave": 1}, seen
