"""`flakebot serve --database`: crafts go to the team's PostgreSQL queue under the caller's tenant, identical needs
join one job, quotas refuse in one line, any front answers a job's status and task, a tenant sees only its own
jobs, tasks and runs, and /metrics reports it all. Real fronts (two, on two ports), the MCP SDK's client with bearer
tokens, a real PostgreSQL and (slow) a real `flakebot worker` crafting offline."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from psycopg.types.json import Jsonb

from benchmarks.scenarios import pileup
from flakebot.mcp import tooltable
from flakebot.mcp.server import TABLE_TOOLS
from flakebot.team import audit, db, queue
from flakebot.team.dburl import ENV as DATABASE_ENV
from flakebot.team.frontqueue import job_number
from tests.conftest import REPO, json_result, require, run_cli, wait_for
from tests.fakes.processes import own_processes
from tests.team.conftest import Cluster
from tests.team.test_front import INITIALIZE, add_token, post, served_slow_craft, serving, serving_process
from tests.team.test_worker import job_row, worker

pytestmark = pytest.mark.timeout(300)

SESSION = REPO / "flakebot/data/sessions/csv-dedup.json"


async def _call(url: str, token: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=90) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:  # type: ignore[arg-type]
            answer = await client.call_tool(name, arguments)
            return {**json.loads(answer.content[0].text), "is_error": answer.is_error}  # type: ignore[union-attr]


def call(url: str, token: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tool call through the SDK's client (the stateless protocol): its JSON answer, and isError."""
    return asyncio.run(_call(url, token, name, arguments))


class Session:
    """A 2025-11-25 session spoken as raw JSON-RPC (the SDK's client cannot create a task: it checks every
    tools/call result against CallToolResult)."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token, self.next = url, token, 10
        opened = post(url, INITIALIZE, token)
        assert opened.status_code == 200, opened.text
        self.headers = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, token, **self.headers)

    def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The JSON-RPC answer ({result} or {error}) to one request."""
        self.next += 1
        answer = post(
            self.url,
            {"jsonrpc": "2.0", "id": self.next, "method": method, "params": params},
            self.token,
            **self.headers,
        )
        assert answer.status_code == 200, answer.text
        if answer.headers["content-type"].startswith("text/event-stream"):
            for line in answer.text.splitlines():
                if line.startswith("data:") and line[5:].strip():
                    message = json.loads(line[5:])
                    if message.get("id") == self.next:
                        return dict(message)
            raise AssertionError(answer.text)
        return dict(answer.json())


def rows(database: str) -> list[dict[str, Any]]:
    with db.connect(database) as conn:
        return conn.execute("SELECT * FROM jobs ORDER BY id").fetchall()


def metrics(url: str, token: str | None) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(url.replace("/mcp", "/metrics"), headers=auth, timeout=30)


def test_crafts_are_queued_joined_across_fronts_and_seen_by_their_tenant_only(
    flakebot_home: Path, database: str, postgres: Cluster
) -> None:
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    bob, scraper = add_token("bob", "--tenant", "other"), add_token("prometheus", "--grant", "metrics")
    with db.connect(database) as conn:
        queue.set_quota(conn, "acme", max_in_flight=2, max_per_day=10)
    craft = {"need": "need a csv deduper", "registry": "local"}
    log_one, log_two = flakebot_home / "one.log", flakebot_home / "two.log"
    with serving(database=database, log=log_one) as one, serving(database=database, log=log_two) as two:
        assert one != two
        first = call(one, alice, "craft", craft)
        assert (first["ok"], first["status"], first["joined"]) == (True, "queued", False), first
        job = first["run_id"]
        assert job.startswith("job-") and "status" in first["follow"]
        # the same need (as the catalog keys needs) from another agent of the tenant, on the other front: one job
        second = call(two, carol, "craft", {**craft, "need": "Need a CSV deduper"})
        assert (second["run_id"], second["joined"]) == (job, True), second
        status = call(two, alice, "status", {"run_id": job})
        assert (status["ok"], status["status"], status["need"]) == (True, "queued", "need a csv deduper"), status

        # another tenant's job is not found, word for word as one that never was
        theirs, never = call(one, bob, "status", {"run_id": job}), call(one, bob, "status", {"run_id": "job-99999"})
        assert theirs["is_error"] and theirs["type"] == never["type"] == "RunError"
        assert theirs["error"].replace(job, "J") == never["error"].replace("job-99999", "J")

        # a craft as a task: created on one front, read on the other by its tenant only
        created = Session(one, carol).ask(
            "tools/call", {"name": "craft", "arguments": {**craft, "need": "need a word counter"}, "task": {}}
        )
        task = created["result"]["task"]
        assert task["taskId"].startswith("job-") and task["status"] == "working", created
        got = Session(two, alice).ask("tasks/get", {"taskId": task["taskId"]})
        assert got["result"]["status"] == "working" and got["result"]["statusMessage"] == "queued", got
        hidden = Session(two, bob).ask("tasks/get", {"taskId": task["taskId"]})
        unknown = Session(two, bob).ask("tasks/get", {"taskId": "job-99999"})
        assert hidden["error"]["message"].replace(task["taskId"], "J") == unknown["error"]["message"].replace(
            "job-99999", "J"
        )

        # the tenant's quota (2 in flight): one line, QuotaExceeded, exit code 72; over tasks, a JSON-RPC error
        refused = call(one, alice, "craft", {**craft, "need": "need a json pretty printer"})
        assert refused["is_error"] and (refused["type"], refused["exit_code"]) == ("QuotaExceeded", 72), refused
        in_flight = f"tenant acme has 2 crafts queued or running, its limit: {job}, {task['taskId']}"
        assert refused["error"] == in_flight and "wait for one" in refused["fix"], refused
        as_task = Session(two, alice).ask(
            "tools/call", {"name": "craft", "arguments": {**craft, "need": "need a json pretty printer"}, "task": {}}
        )
        assert "tenant acme has 2 crafts" in as_task["error"]["message"], as_task
        # arguments the door refuses queue nothing
        bad = call(one, alice, "craft", {**craft, "need": 42})
        assert bad["is_error"] and bad["type"] == "UsageError", bad
        # bob's tenant has its own quota and queue
        theirs_job = call(two, bob, "craft", craft)
        assert theirs_job["status"] == "queued" and not theirs_job["joined"]
        # tasks/list: the tenant's queued crafts, newest first, and no other tenant's
        listed = Session(one, alice).ask("tasks/list", {})["result"]["tasks"]
        assert [t["taskId"] for t in listed] == [task["taskId"], job], listed
        assert [t["taskId"] for t in Session(two, bob).ask("tasks/list", {})["result"]["tasks"]] == [
            theirs_job["run_id"]
        ]

        # /metrics: behind the token check, to the scraper's token; the queue's depth, refusals, calls per tool
        assert metrics(one, None).status_code == 401
        assert metrics(one, alice).status_code == 403
        scraped = metrics(one, scraper)
        assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = scraped.text
        assert 'flakebot_queue_jobs{state="queued"} 3' in text and 'flakebot_queue_jobs{state="done"} 0' in text
        assert 'flakebot_refusals_total{reason="quota"} 1' in text
        assert 'flakebot_tool_calls_total{tool="craft",outcome="ok"} 2' in text  # alice's, carol's as a task
        assert 'flakebot_tool_calls_total{tool="craft",outcome="error"} 1' in text  # the bad argument
        assert 'flakebot_tool_calls_total{tool="craft",outcome="refused"} 1' in text  # the quota
        assert 'flakebot_tool_call_seconds_count{tool="status"}' in text
        told = metrics(two, scraper).text  # alice's task call, its quota refused on the other front: counted there
        assert 'flakebot_tool_calls_total{tool="craft",outcome="refused"} 1' in told, told
        assert 'flakebot_refusals_total{reason="quota"} 1' in told, told

    made = rows(database)
    assert [(r["tenant"], r["principal"], r["state"]) for r in made] == [
        ("acme", "alice", "queued"),
        ("acme", "carol", "queued"),
        ("other", "bob", "queued"),
    ]
    # the request in the row is the one the door built from the checked arguments
    assert made[0]["request"] == tooltable.arguments(TABLE_TOOLS["craft"], craft)["request"].to_dict()
    with db.connect(database) as conn:
        joined = conn.execute("SELECT principal FROM audit WHERE action = 'joined'").fetchall()
    assert [r["principal"] for r in joined] == ["carol"]
    for log in (log_one, log_two):
        assert postgres.password not in log.read_text() + log.with_suffix(".err").read_text()


def test_serve_with_an_unreachable_database_is_one_line(flakebot_home: Path, postgres: Cluster) -> None:
    wrong = f"postgresql://flakebot:{postgres.password}@127.0.0.1:1/postgres"
    done = run_cli("serve", "--port", "0", env={DATABASE_ENV: wrong}, timeout=60)
    assert done.returncode == 5, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the team database"), done.stderr
    assert postgres.password not in done.stderr + done.stdout


def test_a_front_given_its_database_in_the_environment_shows_its_password_nowhere(
    flakebot_home: Path, database: str, postgres: Cluster
) -> None:
    """FLAKEBOT_DATABASE_URL (no --database): the front queues crafts in that database, and neither its command line
    (every local user reads it), its log nor the job's row holds the password."""
    alice = add_token("alice", "--tenant", "acme")
    log = flakebot_home / "serve.log"
    with serving_process(log=log, database=database) as (url, front):
        cmdline = Path(f"/proc/{front.pid}/cmdline").read_bytes()
        assert b"serve" in cmdline and postgres.password.encode() not in cmdline, cmdline
        answer = call(url, alice, "craft", {"need": "need a csv deduper", "registry": "local"})
        assert answer.get("status") == "queued", answer
    text = log.read_text() + log.with_suffix(".err").read_text()
    assert "postgresql://[REDACTED]@127.0.0.1" in text and postgres.password not in text, text
    assert postgres.password not in json.dumps(rows(database), default=str)


def test_without_a_database_a_tenants_tasks_and_runs_are_its_own(
    flakebot_home: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("nix")
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "other")
    craft = served_slow_craft(tmp_path, monkeypatch)
    try:
        with serving() as url:
            created = Session(url, alice).ask("tools/call", {"name": "craft", "arguments": craft, "task": {}})
            task_id = created["result"]["task"]["taskId"]
            assert Session(url, alice).ask("tasks/get", {"taskId": task_id})["result"]["status"] == "working"
            hidden = Session(url, bob).ask("tasks/get", {"taskId": task_id})
            assert hidden["error"]["message"].startswith(f"no task '{task_id}'"), hidden
            assert Session(url, bob).ask("tasks/list", {})["result"]["tasks"] == []
            listed = Session(url, alice).ask("tasks/list", {})["result"]["tasks"]
            assert [t["taskId"] for t in listed] == [task_id]
            # its run, once it exists: in alice's runs and status, unknown to bob's tenant
            mine = wait_for(lambda: call(url, alice, "runs", {})["runs"], timeout=120, interval=0.5)
            run_id = mine[0]["id"]
            assert call(url, alice, "status", {"run_id": run_id})["status"] in ("created", "running")
            assert call(url, bob, "runs", {})["runs"] == []
            theirs = call(url, bob, "status", {"run_id": run_id})
            assert theirs["is_error"] and theirs["error"].startswith(f"no run '{run_id}'"), theirs
            assert call(url, bob, "show", {"name": run_id})["error"] == f"no run or tool named '{run_id}'"
            prefix = run_id[:10]  # a unique prefix: the run for its tenant, unknown to another
            assert call(url, alice, "status", {"run_id": prefix})["run_id"] == run_id
            assert call(url, bob, "status", {"run_id": prefix})["error"].startswith(f"no run '{prefix}'")
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")


def test_another_tenants_run_is_unknown_to_a_resume_asked_as_a_task(flakebot_home: Path, workdir: Path) -> None:
    """`resume` asked as a task (tools/call with `task`) meets the tenant check a plain call meets: a run the caller's
    tenant did not make is answered as an unknown run, word for word, and no job touches it (the task door had
    started a resume of it, reading its state.json, and would have catalogued it for the caller's tenant)."""
    bob = add_token("bob", "--tenant", "other")
    theirs, never = "20260101-000000-abcdef", "20260101-000000-ffffff"
    (workdir / "runs" / theirs).mkdir(parents=True)  # a run of the server's user, not of bob's tenant
    try:
        with serving() as url:
            session = Session(url, bob)
            answers = [
                session.ask("tools/call", {"name": "resume", "arguments": {"run_id": run}, "task": {}})
                for run in (theirs, never)
            ]
            plain = call(url, bob, "resume", {"run_id": theirs})
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")
    told = [answer.get("error", answer) for answer in answers]
    assert told[0]["message"].replace(theirs, "R") == told[1]["message"].replace(never, "R"), told
    assert plain["error"].startswith(f"no run '{theirs}'"), plain


def test_a_tool_call_asked_as_a_task_is_audited_and_counted(flakebot_home: Path, workdir: Path) -> None:
    """A tools/call with `task` is answered by the tasks handlers, not call_tool: it is still one audit record (who,
    tool, argument digest, outcome: ok once its task exists, error when refused) and one call in /metrics."""
    bob = add_token("bob", "--tenant", "other")
    (flakebot_home / "empty").mkdir()
    try:
        with serving() as url:
            session = Session(url, bob)
            made = session.ask(
                "tools/call", {"name": "package", "arguments": {"target": str(flakebot_home / "empty")}, "task": {}}
            )
            refused = session.ask("tools/call", {"name": "resume", "arguments": {"run_id": "no-such-run"}, "task": {}})
            counted = metrics(url, add_token("prometheus", "--grant", "metrics")).text
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")
    assert "result" in made and "error" in refused, (made, refused)
    records = json_result(run_cli("token", "audit", "--json", check=True))["records"]
    calls = [(r["principal"], r["tool"], r["outcome"]) for r in records if r["method"] == "tools/call"]
    assert calls == [("bob", "package", "ok"), ("bob", "resume", "error")], records
    assert 'flakebot_tool_calls_total{tool="package",outcome="ok"} 1' in counted, counted
    assert 'flakebot_tool_calls_total{tool="resume",outcome="error"} 1' in counted, counted


@contextlib.asynccontextmanager
async def listening(url: str, token: str) -> AsyncIterator[tuple[Any, Callable[[int], Awaitable[bool]]]]:
    """A 2025-11-25 session (the SDK's legacy mode) whose notifications are kept: its client, and `told(tries)`:
    whether the session was told the tool list changed within `tries` looks 0.2 s apart."""
    import mcp_types as types

    notices: list[Any] = []

    async def on_message(message: Any) -> None:
        notices.append(message)

    async def told(tries: int) -> bool:
        for _ in range(tries):
            if any(isinstance(n, types.ToolListChangedNotification) for n in notices):
                return True
            await asyncio.sleep(0.2)
        return False

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=90) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", message_handler=on_message) as client:  # type: ignore[arg-type]
            yield client, told


async def craft_and_watch(url: str, token: str, craft: dict[str, Any], work: Any) -> tuple[dict[str, Any], bool]:
    """A detached craft from a 2025-11-25 session that stays open while `work()` runs: its answer, and whether the
    session was told the tool list changed (within a poll of the job's end)."""
    import anyio

    async with listening(url, token) as (client, told):
        answer = json.loads((await client.call_tool("craft", craft)).content[0].text)  # type: ignore[union-attr]
        await anyio.to_thread.run_sync(work)
        return answer, await told(100)  # the front reads the row every 5 s


@pytest.mark.slow
def test_a_worker_crafts_the_queued_job_and_its_run_is_its_tenants_only(
    flakebot_home: Path, database: str, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")  # the worker crafts from the local registry
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "other")
    craft = {"need": "need a CSV deduper", "registry": "local"}
    log = tmp_path / "worker.log"

    def work() -> None:
        with worker(database, log) as proc:
            assert proc.wait(timeout=600) == 0, log.read_text()

    with serving(database=database) as one, serving(database=database) as two:
        answer, changed = asyncio.run(craft_and_watch(one, alice, craft, work))
        job = answer["run_id"]
        assert changed, "no tools/list_changed once the queued craft catalogued its tool"
        done = call(two, alice, "status", {"run_id": job, "wait_seconds": 5})
        assert done["status"] == "succeeded" and done["result"]["name"] == "csv-dedup", done
        run_id = done["worker_run_id"]
        assert call(one, alice, "status", {"run_id": run_id})["status"] == "succeeded"
        assert run_id in [r["id"] for r in call(one, alice, "runs", {})["runs"]]
        # bob's tenant: the run is as unknown to it as a run that never was
        theirs, never = call(one, bob, "status", {"run_id": run_id}), call(one, bob, "status", {"run_id": "0" * 8})
        assert theirs["is_error"] and theirs["error"].replace(run_id, "R") == never["error"].replace("0" * 8, "R")
        shown = call(one, bob, "show", {"name": run_id})
        assert shown["is_error"] and shown["error"] == f"no run or tool named '{run_id}'", shown
        assert call(one, bob, "runs", {})["runs"] == []
        assert call(two, bob, "status", {"run_id": job})["is_error"]
        # the tool is in acme's catalog: alice's list has it, bob's does not, nor does the organisation's
        assert "csv-dedup" in [t["name"] for t in call(two, alice, "list", {})["tools"]]
        assert call(two, bob, "list", {})["tools"] == []
    assert json_result(run_cli("list", "--json", check=True))["tools"] == []


def test_a_waited_craft_follows_its_job_to_the_workers_end(flakebot_home: Path, database: str, tmp_path: Path) -> None:
    """wait: true holds the call until a worker ended the job (here at its first check: no model script there), and
    tasks/result of the job's task answers the same error."""
    import concurrent.futures

    alice = add_token("alice", "--tenant", "acme")
    craft = {"need": "need a csv deduper", "registry": "local"}
    with serving(database=database) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        waited = pool.submit(call, url, alice, "craft", {**craft, "wait": True})
        wait_for(lambda: rows(database), timeout=60, interval=0.2)
        assert not waited.done()  # queued, no worker yet: the call holds
        session = Session(url, alice)
        task = session.ask("tools/call", {"name": "craft", "arguments": craft, "task": {}})["result"]["task"]
        job_id = int(rows(database)[0]["id"])
        assert task["taskId"] == f"job-{job_id}"  # the same need: the task is the waited job
        with worker(database, tmp_path / "worker.log", model="scripted:/nonexistent.json") as proc:
            assert proc.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()
        answer = waited.result(timeout=60)
        assert answer["is_error"] and answer["type"] == "ScriptError", answer
        result = session.ask("tasks/result", {"taskId": task["taskId"]})["result"]
        assert result["isError"] and json.loads(result["content"][0]["text"])["type"] == "ScriptError", result
        assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
        assert session.ask("tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "failed"


def test_a_front_killed_with_a_task_in_flight_loses_no_task(flakebot_home: Path, database: str, tmp_path: Path) -> None:
    """A craft started as a task on one front, that front then killed with SIGKILL: the task lives in the queue,
    so the other front answers tasks/get while it waits, and tasks/result once a worker ended it."""
    import signal

    alice = add_token("alice", "--tenant", "acme")
    craft = {"need": "need a csv deduper", "registry": "local"}
    with serving(database=database) as two:
        with serving_process(database=database) as (one, front):
            created = Session(one, alice).ask("tools/call", {"name": "craft", "arguments": craft, "task": {}})
            task = created["result"]["task"]
            front.send_signal(signal.SIGKILL)
            front.wait(timeout=30)
        session = Session(two, alice)
        got = session.ask("tasks/get", {"taskId": task["taskId"]})["result"]
        assert (got["taskId"], got["status"], got["statusMessage"]) == (task["taskId"], "working", "queued"), got
        with worker(database, tmp_path / "worker.log", model="scripted:/nonexistent.json") as proc:
            assert proc.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()
        result = session.ask("tasks/result", {"taskId": task["taskId"]})["result"]
        assert result["isError"] and json.loads(result["content"][0]["text"])["type"] == "ScriptError", result
        assert session.ask("tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "failed"


def test_serve_takes_the_database_from_libpqs_environment(
    flakebot_home: Path, database: str, postgres: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--database postgresql://` alone: host, port, user, database from PG* and the password from a passfile, so
    none of it is on the command line."""
    passfile = flakebot_home / "pgpass"
    name = database.rsplit("/", 1)[1]
    passfile.write_text(f"127.0.0.1:{postgres.port}:{name}:flakebot:{postgres.password}\n")
    passfile.chmod(0o600)
    for key, value in (("PGHOST", "127.0.0.1"), ("PGPORT", str(postgres.port)), ("PGUSER", "flakebot")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PGDATABASE", name)
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    alice = add_token("alice", "--tenant", "acme")
    with serving("--database", "postgresql://") as url:
        answer = call(url, alice, "craft", {"need": "need a csv deduper"})
        assert answer.get("status") == "queued", answer
    assert [(r["tenant"], r["principal"]) for r in rows(database)] == [("acme", "alice")]


def test_a_tokens_concurrent_crafts_bound_its_queued_crafts(flakebot_home: Path, database: str) -> None:
    solo, other = (
        add_token("solo", "--tenant", "acme", "--concurrent-crafts", "1"),
        add_token("other", "--tenant", "acme"),
    )
    craft = {"need": "need a csv deduper", "registry": "local"}
    with serving(database=database) as url:
        assert call(url, solo, "craft", craft)["status"] == "queued"
        refused = call(url, solo, "craft", {**craft, "need": "need a word counter"})
        assert refused["is_error"] and (refused["type"], refused["exit_code"]) == ("QuotaExceeded", 72), refused
        assert refused["error"].startswith("token 'solo' has 1 crafts queued or running, its limit"), refused
        assert call(url, solo, "craft", craft)["joined"]  # joining adds no craft: never refused
        assert call(url, other, "craft", {**craft, "need": "need a word counter"})["status"] == "queued"
    assert [r["principal"] for r in rows(database)] == ["solo", "other"]


def test_a_token_cannot_shed_its_concurrent_crafts_by_leaving_them_to_a_joiner(
    flakebot_home: Path, database: str
) -> None:
    """A craft a token queued stays one of its concurrent crafts until it ends, even once the token left it to a
    joiner (tasks/cancel while another agent follows it): were it shed at the leave, a token of cap 1 and a second
    token that joins each of its crafts would hold as many crafts as the tenant allows (queue, joined, left, again).
    The refusal names the craft to wait for, one the token left included (its task reads cancelled for it)."""
    solo = add_token("solo", "--tenant", "acme", "--concurrent-crafts", "1")
    friend = add_token("friend", "--tenant", "acme", "--concurrent-crafts", "1")
    with db.connect(database) as conn:
        queue.set_quota(conn, "acme", max_in_flight=50, max_per_day=50)
    with serving(database=database) as url:
        mine, theirs = Session(url, solo), Session(url, friend)
        held = []
        for n in range(3):
            need = {"name": "craft", "arguments": {"need": f"need tool number {n}"}, "task": {}}
            created = mine.ask("tools/call", need)
            if "error" in created:
                break
            job = str(created["result"]["task"]["taskId"])
            assert theirs.ask("tools/call", need)["result"]["task"]["taskId"] == job  # friend joins it
            assert mine.ask("tasks/cancel", {"taskId": job})["result"]["status"] == "cancelled"  # solo leaves it
            held.append(job)
        assert held == ["job-1"], (held, rows(database))
        message = created["error"]["message"]
        assert message.startswith("token 'solo' has 1 crafts queued or running, its limit") and "job-1" in message
        assert "\n" not in message, message
    assert [(r["state"], r["principal"]) for r in rows(database)] == [("queued", "solo")]


def test_fronts_of_one_database_count_a_tokens_calls_together(flakebot_home: Path, database: str) -> None:
    slow = add_token("slow", "--calls-per-minute", "2")
    listing = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list", "arguments": {}}}
    with serving(database=database) as one, serving(database=database) as two:
        sessions = {
            url: {"mcp-session-id": post(url, INITIALIZE, slow).headers["mcp-session-id"]} for url in (one, two)
        }
        assert post(one, listing, slow, **sessions[one]).status_code == 200
        assert post(two, listing, slow, **sessions[two]).status_code == 200
        refused = post(one, listing, slow, **sessions[one])  # its third call in the minute, whichever front
        assert refused.status_code == 429 and 1 <= int(refused.headers["retry-after"]) <= 60, refused.text
        assert "made 2 tool calls in the last minute (its limit: 2)" in refused.json()["error"]["message"]
        assert post(two, listing, slow, **sessions[two]).status_code == 429
        scraper = add_token("prometheus", "--grant", "metrics")
        assert 'flakebot_refusals_total{reason="rate_limit"} 1' in metrics(two, scraper).text


async def _starve(url: str, bob: str, alice: str, job: str, holds: int) -> tuple[dict[str, Any], int]:
    """`holds` status calls of bob's queued job held (wait_seconds), then alice's `list`: her answer, and how many of
    bob's holds had ended by then."""

    async def hold() -> None:
        await _call(url, bob, "status", {"run_id": job, "wait_seconds": 50})

    held = [asyncio.create_task(hold()) for _ in range(holds)]
    await asyncio.sleep(5)  # every hold has reached the front
    assert not any(task.done() for task in held), [task.exception() for task in held if task.done()]
    answer = await asyncio.wait_for(_call(url, alice, "list", {}), 45)
    ended = sum(task.done() for task in held)
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    return answer, ended


def test_one_tenants_held_status_calls_do_not_starve_another(flakebot_home: Path, database: str) -> None:
    """Held `status` calls of a queued job (wait_seconds) take no worker thread the other calls need: a tenant holding
    more of them than the server has threads does not stop another tenant's `list` (nor its admission)."""
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "other")
    craft = {"need": "need a csv deduper", "registry": "local"}
    with serving(database=database, log=flakebot_home / "serve.log") as url:
        job = call(url, bob, "craft", craft)["run_id"]  # no worker: it stays queued, so status holds
        answer, ended = asyncio.run(_starve(url, bob, alice, job, holds=48))  # anyio's default: 40 threads
        assert answer["ok"] is True and not answer["is_error"], answer
        assert ended == 0, "alice's list waited for bob's held status calls"


def test_another_tenants_craft_of_the_same_need_neither_fails_a_job_nor_shows_its_run(
    flakebot_home: Path, database: str, workdir: Path, tmp_path: Path
) -> None:
    """Needs join only within a tenant; a job of one tenant whose need another tenant's run is crafting right now
    waits for that run (then crafts its own into its tenant's catalog) instead of failing with the other tenant's run
    id."""
    require("nix")
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "other")
    slow = pileup.slow_craft(tmp_path)  # stays in its spec stage for minutes: its model is the workers' setting
    model = slow.pop("model")
    craft = {**slow, "fresh": None}
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with serving(database=database) as url:
        theirs = job_number(call(url, alice, "craft", craft)["run_id"])
        assert theirs is not None
        with worker(database, first_log, model=model):
            run = wait_for(lambda: rows(database)[0]["run_id"], timeout=120, interval=0.5)
            mine = call(url, bob, "craft", craft)
            assert mine["joined"] is False, mine  # another tenant's job is never joined
            with worker(database, second_log, model=model):

                def settled() -> bool:
                    row = rows(database)[1]
                    return row["state"] == "failed" or "waits for the run" in second_log.read_text()

                wait_for(settled, timeout=120, interval=0.5)
                status = call(url, bob, "status", {"run_id": mine["run_id"]})
    assert status["status"] == "running", status
    assert run not in json.dumps(status), status


def test_tool_names_a_caller_makes_up_take_no_room_in_metrics_or_the_audit(flakebot_home: Path, workdir: Path) -> None:
    """/metrics labels a call by its tool's name only for flakebot's own tools (every other name is `crafted`: one
    tenant's tool names are not another's to read), and the audit records a name only when it has a tool name's shape
    (MCP: at most 128 of A-Z a-z 0-9 _ - .): a tenant calling made-up names of a megabyte each would otherwise make
    every front keep (and every scrape carry) what it sent, and the audit grow by it."""
    bob = add_token("bob", "--tenant", "other")
    with serving() as url:
        # a name in the body only (a session's raw JSON-RPC), up to the body's 4 MB: the SDK's client also sends
        # it in a header, which the HTTP server bounds
        huge = Session(url, bob).ask("tools/call", {"name": "x" * 1_000_000, "arguments": {}})
        assert huge["result"]["isError"], str(huge)[:300]
        for name in ('a"b\nc', "no-such-tool"):
            assert call(url, bob, name, {})["is_error"]
        text = metrics(url, add_token("prometheus", "--grant", "metrics")).text
    assert len(text) < 20_000, len(text)
    assert 'flakebot_tool_calls_total{tool="crafted",outcome="error"} 3' in text, text  # no name but flakebot's own
    assert "no-such-tool" not in text, text
    records = audit.read(workdir)
    assert len(audit.audit_path(workdir).read_text()) < 5_000
    made_up = [r["tool"] for r in records if r["method"] == "tools/call"]
    assert made_up[0] == "sha256:" + hashlib.sha256(b"x" * 1_000_000).hexdigest() and made_up[2] == "no-such-tool"


def test_metrics_count_every_end_of_a_tool_call(flakebot_home: Path, database: str) -> None:
    """/metrics counted the tool calls answered only: one the rate limit refused (429) or one cancelled before its
    answer (a waited craft whose client went away) was in no counter, so a scrape showed nothing of a flood or of
    clients giving up. Now each end counts, by tool and outcome (ok, error, refused, cancelled); a refused call ran
    for no time, and is in no latency bucket."""
    alice = add_token("alice", "--tenant", "acme", "--calls-per-minute", "3")
    scraper = add_token("prometheus", "--grant", "metrics")
    with serving(database=database) as url:
        _waited_craft_given_up(url, alice, "need a csv deduper", None)
        assert call(url, alice, "craft", {"need": 42})["is_error"]
        assert not call(url, alice, "list", {})["is_error"]
        listing = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list", "arguments": {}}}
        assert post(url, listing, alice, **Session(url, alice).headers).status_code == 429  # its 4th call this minute

        def scraped() -> str | None:  # the craft's cancel is counted once the front ended its call
            text = metrics(url, scraper).text
            return text if 'flakebot_tool_calls_total{tool="craft",outcome="cancelled"} 1' in text else None

        text = wait_for(scraped, timeout=30)
    for counted in (
        'flakebot_tool_calls_total{tool="craft",outcome="error"} 1',
        'flakebot_tool_calls_total{tool="list",outcome="ok"} 1',
        'flakebot_tool_calls_total{tool="list",outcome="refused"} 1',
        'flakebot_tool_call_seconds_count{tool="list"} 1',
        'flakebot_tool_call_seconds_count{tool="craft"} 2',
        'flakebot_refusals_total{reason="rate_limit"} 1',
    ):
        assert counted in text, (counted, text)


def test_a_waited_craft_whose_row_names_a_refusal_is_counted_as_the_error_it_ran_to(
    flakebot_home: Path, database: str
) -> None:
    """alice's craft (wait: true) waits on its job; a writer of the table (anyone with the database's password, or a
    worker's failure) ends the row `failed` with the error type `JobLimit`. /metrics decided `refused` from the
    answer's error type, so that call, which ran until its job ended, counted as refused before any work, in no
    latency bucket, and as a concurrent-crafts refusal that never was. Now only the front's own refusal (its quota
    or concurrent crafts check) counts as one: this call is an `error`, timed, and no refusal."""
    alice = add_token("alice", "--tenant", "acme")
    scraper = add_token("prometheus", "--grant", "metrics")
    with serving(database=database) as url, concurrent.futures.ThreadPoolExecutor(1) as pool:
        waited = pool.submit(call, url, alice, "craft", {"need": "need a csv deduper", "wait": True})
        wait_for(lambda: rows(database), timeout=30, interval=0.2)
        forged = {"error": "cap reached", "fix": "wait", "type": "JobLimit"}
        with db.connect(database) as conn:
            conn.execute("UPDATE jobs SET state = 'failed', error = %s, ended = now()", (Jsonb(forged),))
        answer = waited.result(timeout=60)
        assert answer["is_error"] and answer["type"] == "JobLimit", answer
        text = metrics(url, scraper).text
    for counted in (
        'flakebot_tool_calls_total{tool="craft",outcome="error"} 1',
        'flakebot_tool_call_seconds_count{tool="craft"} 1',
        'flakebot_refusals_total{reason="job_limit"} 0',
    ):
        assert counted in text, (counted, text)
    assert 'outcome="refused"' not in text, text


def test_a_task_call_its_concurrent_crafts_refused_is_counted_as_a_refusal(
    flakebot_home: Path, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice (one concurrent craft) has a craft running and asks another as a task (no database: the front starts
    it): refused (-32600, JobLimit's line), counted `refused` by tool, but flakebot_refusals_total{job_limit} counted
    only a plain call's refusal, so the two counters disagreed. Now a refusal counts where the front refuses."""
    require("nix")
    alice = add_token("alice", "--concurrent-crafts", "1")
    scraper = add_token("prometheus", "--grant", "metrics")
    craft = served_slow_craft(tmp_path, monkeypatch)
    try:
        with serving() as url:
            assert call(url, alice, "craft", craft)["status"] == "running"
            refused = Session(url, alice).ask("tools/call", {"name": "craft", "arguments": craft, "task": {}})
            assert refused["error"]["code"] == -32600 and "jobs are running" in refused["error"]["message"], refused
            text = metrics(url, scraper).text
    finally:
        pileup.end_jobs(workdir / "mcp-jobs")
    for counted in (
        'flakebot_tool_calls_total{tool="craft",outcome="refused"} 1',
        'flakebot_refusals_total{reason="job_limit"} 1',
    ):
        assert counted in text, (counted, text)


def _transactions(database: str) -> int:
    with db.connect(database) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row["xact_commit"])


def test_joining_one_job_many_times_reads_its_row_once_per_poll(flakebot_home: Path, database: str) -> None:
    """A detached queued craft's row is read every 5 s for its end (tools/list_changed): once per job on a front,
    however many calls joined it. A tenant repeating an identical need (joining is never refused) would otherwise
    add a reader per call for a day, each a query on the front's one connection every other tenant's calls wait on."""
    bob = add_token("bob", "--tenant", "other")
    craft = {"need": "need a csv deduper", "registry": "local"}
    with serving(database=database) as url:
        handles = {call(url, bob, "craft", craft)["run_id"] for _ in range(15)}  # stateless requests
        for _ in range(15):  # and sessions (2025-11-25), each one to tell
            answer = Session(url, bob).ask("tools/call", {"name": "craft", "arguments": craft})
            handles.add(json.loads(answer["result"]["content"][0]["text"])["run_id"])
        assert len(handles) == 1  # one job, joined 29 times
        time.sleep(12)  # idle backends report their counts at least every 10 s
        before = _transactions(database)
        time.sleep(10)
        read = _transactions(database) - before
    assert read < 30, f"{read} transactions in 10 s: a reader per joined call"


async def _held_reads(url: str, bob: str, job: str, database: str, holds: int) -> int:
    """Transactions of the database in 10 s while `holds` status calls of one queued job are held."""
    held = [asyncio.create_task(_call(url, bob, "status", {"run_id": job, "wait_seconds": 30})) for _ in range(holds)]
    await asyncio.sleep(3)  # every hold reached the front
    before = await asyncio.to_thread(_transactions, database)
    await asyncio.sleep(10)
    read = await asyncio.to_thread(_transactions, database) - before
    for task in held:
        task.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    return read


def test_calls_following_one_job_share_its_row_reads(flakebot_home: Path, database: str) -> None:
    """Held calls following one queued job (status's wait_seconds, a waited craft, tasks/result) read its row twice a
    second together, not each: 30 held calls of one job would otherwise be 60 queries a second on the front's one
    connection, which every other tenant's calls wait on (their calls per minute are counted through it)."""
    bob = add_token("bob", "--tenant", "other")
    craft = {"need": "need a csv deduper", "registry": "local"}
    with serving(database=database) as url:
        job = call(url, bob, "craft", craft)["run_id"]
        read = asyncio.run(_held_reads(url, bob, job, database, holds=30))
    assert read < 100, f"{read} transactions in 10 s: each held call reads the row"


def test_a_queued_craft_its_only_follower_cancels_ends_cancelled(flakebot_home: Path, database: str) -> None:
    """tasks/cancel of a queued craft: cancelled when the caller alone follows it (no worker claims it, the same need
    queues afresh); only the caller's task stopped when another agent of the tenant joined it (the job goes on for
    that agent); cancelled too once a worker claimed it (its row says so at once: the worker's part is
    test_worker.py's); another tenant's, or a job the caller does not follow, is "no task" as an unknown one."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    bob = add_token("bob", "--tenant", "other")

    def task(session: Session, need: str) -> str:
        created = session.ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})
        return str(created["result"]["task"]["taskId"])

    with serving(database=database) as url:
        mine, theirs, ours = Session(url, alice), Session(url, bob), Session(url, carol)
        alone = task(mine, "need a csv deduper")
        hidden = theirs.ask("tasks/cancel", {"taskId": alone})
        unknown = theirs.ask("tasks/cancel", {"taskId": "job-99999"})
        assert hidden["error"]["message"].replace(alone, "J") == unknown["error"]["message"].replace("job-99999", "J")
        not_following = ours.ask("tasks/cancel", {"taskId": alone})  # carol's tenant, but not carol's task
        assert "error" in not_following, not_following
        cancelled = mine.ask("tasks/cancel", {"taskId": alone})
        assert cancelled["result"]["status"] == "cancelled", cancelled
        got = mine.ask("tasks/get", {"taskId": alone})["result"]
        assert got["status"] == "cancelled" and got["statusMessage"].startswith(
            "cancelled before a worker claimed it"
        ), got
        result = mine.ask("tasks/result", {"taskId": alone})["result"]  # the task's end, at once: an error result
        assert result["isError"] is True and "cancelled before a worker claimed it" in result["content"][0]["text"], (
            result
        )
        again = mine.ask("tasks/cancel", {"taskId": alone})  # as the spec asks of a terminal task: -32602, its state
        assert again["error"] == {
            "code": -32602,
            "message": f"cannot cancel task {alone}: it is already cancelled (get its result with tasks/result)",
            "data": {"taskId": alone, "status": "cancelled"},
        }, again
        assert mine.ask("tasks/cancel", {"taskId": alone})["error"] == again["error"]  # the same, however often

        shared = task(mine, "need a word counter")
        assert task(ours, "Need a word counter") == shared  # carol joined alice's job
        left = mine.ask("tasks/cancel", {"taskId": shared})  # carol follows it too: alice's task alone stops
        assert left["result"]["status"] == "cancelled", left
        assert mine.ask("tasks/get", {"taskId": shared})["result"]["status"] == "cancelled"
        twice = mine.ask("tasks/cancel", {"taskId": shared})  # cancelled for alice: the same answer, nothing audited
        assert twice["error"]["code"] == -32602 and twice["error"]["data"]["status"] == "cancelled", twice
        assert ours.ask("tasks/get", {"taskId": shared})["result"]["status"] == "working"  # the job goes on for carol
        assert task(mine, "need a word counter") == shared  # asked again: alice follows it again
        assert mine.ask("tasks/get", {"taskId": shared})["result"]["status"] == "working"
        assert mine.ask("tasks/cancel", {"taskId": shared})["result"]["status"] == "cancelled"

        claimed = task(mine, "need a json pretty printer")
        with db.connect(database) as conn:
            first = queue.claim(conn, "w1", 60)  # the oldest queued job no one cancelled: the shared one
            second = queue.claim(conn, "w1", 60)
        assert first is not None and second is not None
        assert {handle_of(first), handle_of(second)} == {shared, claimed}  # the cancelled job was never claimed
        running = mine.ask("tasks/cancel", {"taskId": claimed})  # a worker holds it: cancelled all the same
        assert running["result"]["status"] == "cancelled", running
        assert running["result"]["statusMessage"].startswith("cancelled while a worker crafted it"), running
        last = ours.ask("tasks/cancel", {"taskId": shared})  # carol, its one follower left, once a worker took it
        assert last["result"]["status"] == "cancelled", last
        assert ours.ask("tasks/get", {"taskId": shared})["result"]["status"] == "cancelled"
        anew = call(url, carol, "craft", {"need": "need a csv deduper"})  # free to queue again (alice: at her 2)
        assert anew["status"] == "queued" and anew["run_id"] != alone and anew["joined"] is False, anew
    states = {f"job-{r['id']}": r["state"] for r in rows(database)}
    assert (states[alone], states[shared], states[claimed]) == ("cancelled", "cancelled", "cancelled"), states
    with db.connect(database) as conn:
        actions = conn.execute(
            "SELECT principal, action, job FROM audit WHERE action IN ('cancelled', 'left') ORDER BY id"
        ).fetchall()
    assert [(a["principal"], a["action"], f"job-{a['job']}") for a in actions] == [
        ("alice", "cancelled", alone),
        ("alice", "left", shared),
        ("alice", "left", shared),
        ("alice", "cancelled", claimed),
        ("carol", "cancelled", shared),
    ], actions


@pytest.mark.slow
def test_a_running_craft_its_only_follower_cancels_stops_on_its_worker(
    flakebot_home: Path, database: str, workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tasks/cancel of a craft a real worker is crafting (mid-edit, a sandboxed command running): the task and the row
    end cancelled at once, the worker stops the craft as `flakebot craft` stops on SIGTERM (the run interrupted, none
    of its processes left), catalogues nothing, settles its CPU-seconds in the row, lives on and claims the next job.
    A lease of ten minutes: nothing here waits for one to run out."""
    require("bwrap", "cargo", "nix")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")
    alice = add_token("alice", "--tenant", "acme")
    log = tmp_path / "worker.log"

    def task(session: Session, need: str) -> str:
        arguments = {"need": need, "registry": "local"}
        return str(
            session.ask("tools/call", {"name": "craft", "arguments": arguments, "task": {}})["result"]["task"]["taskId"]
        )

    with (
        own_processes() as listing,
        serving_process(database=database) as (url, front),
        worker(database, log, "--lease", "600", "--name", "w1", once=False) as proc,
    ):

        def crafting() -> list[tuple[int, list[str]]]:  # the processes of the worker's craft: all below the worker
            return [(pid, argv) for pid, argv in listing() if pid not in (front.pid, proc.pid)]

        mine = Session(url, alice)
        job = task(mine, "need a CSV deduper")
        job_id = job_number(job)
        assert job_id is not None
        run_id = wait_for(lambda: job_row(database, job_id)["run_id"], timeout=120, interval=0.2)
        events = workdir / "runs" / run_id / "events.jsonl"
        wait_for(lambda: events.exists() and '"stage": "edit", "message": "' in events.read_text(), timeout=180)
        wait_for(lambda: any("bwrap" in argv[0] for _, argv in crafting()), timeout=120, interval=0.1)

        cancelled = mine.ask("tasks/cancel", {"taskId": job})["result"]
        assert cancelled["status"] == "cancelled", cancelled
        assert cancelled["statusMessage"].startswith("cancelled while a worker crafted it"), cancelled
        try:  # its sandboxes, cargo, rustc: gone (bounded generously: CI's machine runs other suites beside)
            wait_for(lambda: not crafting(), timeout=90, interval=0.1)
        except AssertionError:
            raise AssertionError(f"left running: {crafting()}\nworker's log: {log.read_text()[-3000:]}") from None
        wait_for(lambda: job_row(database, job_id)["cpu_seconds"] > 0, timeout=30, interval=0.2)  # settled
        assert proc.poll() is None, log.read_text()  # the worker lives on
        got = mine.ask("tasks/get", {"taskId": job})["result"]
        assert got["status"] == "cancelled", got
        assert call(url, alice, "list", {})["tools"] == []  # nothing catalogued
        assert json.loads((workdir / "runs" / run_id / "state.json").read_text())["status"] == "interrupted"

        following = job_number(task(mine, "need a word counter"))
        assert following is not None
        wait_for(lambda: job_row(database, following)["worker"] == "w1", timeout=60, interval=0.2)
    row = job_row(database, job_id)
    assert (row["state"], row["worker"], row["result"]) == ("cancelled", "w1", None), row
    assert row["cpu_seconds"] > 0 and row["error"] == queue.error_of_cancel(running=True), row
    with db.connect(database) as conn:
        said = conn.execute("SELECT principal, action FROM audit WHERE job = %s ORDER BY id", (job_id,)).fetchall()
        assert queue.quota_of(conn, "acme")["used"]["today"] == 2  # the cancelled craft ran: it counts
    assert [(a["principal"], a["action"]) for a in said] == [
        ("alice", "enqueued"),
        ("alice", "answered"),  # the task's id sent: its following outlives the front
        ("w1", "claimed"),
        ("alice", "cancelled"),
    ], said


def test_a_new_token_under_a_revoked_ones_name_cannot_cancel_its_craft(flakebot_home: Path, database: str) -> None:
    """tasks/cancel is keyed by the token's identity, not its name: after `token revoke alice` and `token add alice`
    the new alice is another principal, and the old alice's queued craft is no task of hers (the revocation cancelled
    it, and the new alice is told "no task", not that she ended it)."""
    old = add_token("alice", "--tenant", "acme")
    with serving(database=database) as url:
        created = Session(url, old).ask(
            "tools/call", {"name": "craft", "arguments": {"need": "need a csv deduper"}, "task": {}}
        )
        job = str(created["result"]["task"]["taskId"])
        run_cli("token", "revoke", "alice", check=True)
        wait_for(lambda: {handle_of(r): r["state"] for r in rows(database)}[job] == "cancelled", timeout=30)
        new = add_token("alice", "--tenant", "acme")
        refused = Session(url, new).ask("tasks/cancel", {"taskId": job})
        assert refused.get("error", {}).get("message", "").startswith(f"no task '{job}'"), refused


def handle_of(row: dict[str, Any]) -> str:
    return f"job-{row['id']}"


async def _first_follower_gone(url: str, alice: str, carol: str, database: str, gone: Any) -> bool:
    """alice's detached craft, joined by carol's; `gone(alice's session, job)`; the job then ends having catalogued
    its tool: whether carol's session was told the tool list changed."""
    import anyio

    craft = {"need": "need a csv deduper"}
    mine = await anyio.to_thread.run_sync(Session, url, alice)
    answer = await anyio.to_thread.run_sync(mine.ask, "tools/call", {"name": "craft", "arguments": craft})
    job = json.loads(answer["result"]["content"][0]["text"])["run_id"]  # detached: the front watches its end
    async with listening(url, carol) as (client, told):
        joined = json.loads((await client.call_tool("craft", craft)).content[0].text)  # type: ignore[union-attr]
        assert joined["run_id"] == job and joined["joined"] is True, joined
        await anyio.to_thread.run_sync(gone, mine, job)
        await asyncio.sleep(6)  # the front reads the queued row at least once since (every 5 s)
        with db.connect(database) as conn:  # its worker's end (the catalogued tool's name, as a worker says it)
            done = {"status": "crafted", "name": "csv-dedup", "version": "0.1.0"}
            conn.execute(
                "UPDATE jobs SET state = 'done', ended = now(), result = %s WHERE id = %s",
                (Jsonb(done), job_number(job)),
            )
            conn.commit()
        return await told(75)  # the front reads the row every 5 s


def _leave(mine: Session, job: str) -> None:
    left = mine.ask("tasks/cancel", {"taskId": job})
    assert left["result"]["status"] == "cancelled", left  # alice's task alone: carol still follows the job


def _revoke(mine: Session, job: str) -> None:
    run_cli("token", "revoke", "alice", check=True)


@pytest.mark.parametrize("gone", [_leave, _revoke], ids=["left", "revoked"])
def test_a_job_its_first_follower_left_still_tells_the_others_its_tool_list_changed(
    flakebot_home: Path, database: str, gone: Any
) -> None:
    """The front watches a detached queued craft's end once per job, through the call of its first follower on this
    front: once that follower left the job (tasks/cancel while another agent follows it) it read 'cancelled', once
    its token was revoked (or a JWT expired) it read no job, and stopped watching either way, so the agents still
    following were never told the tool list changed when the job ended."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    with serving(database=database) as url:
        assert asyncio.run(_first_follower_gone(url, alice, carol, database, gone)), "carol was never told"


async def _task_behind_held_calls(url: str, alice: str, job: str, holds: int) -> dict[str, Any]:
    """`holds` status calls of alice's queued job held (wait_seconds), then a craft of alice's asked as a task: its
    answer."""
    mine = await asyncio.to_thread(Session, url, alice)

    async def hold() -> None:
        await _call(url, alice, "status", {"run_id": job, "wait_seconds": 15})

    held = [asyncio.create_task(hold()) for _ in range(holds)]
    await asyncio.sleep(3)  # every hold has reached the front
    assert not any(task.done() for task in held), [task.exception() for task in held if task.done()]
    asked = {"name": "craft", "arguments": {"need": "need a word counter"}, "task": {}}
    created = await asyncio.wait_for(asyncio.to_thread(mine.ask, "tools/call", asked), 60)
    await asyncio.gather(*held)
    return created


def test_a_call_asked_as_a_task_waits_behind_its_tokens_calls_in_flight(
    flakebot_home: Path, database: str, workdir: Path
) -> None:
    """A token's tool calls in flight are TOKEN_CALLS_AT_ONCE (8), whichever route they take: a craft asked as a task
    skipped that limit (only a plain tools/call took it), so a flood of task calls from one token ran all at once.
    With 8 of alice's calls held, her task call now waits in her own queue until one of them ends: the audit (each
    call's record written as it ends, the held call's before its place is given to the next) has a held status
    before the task's craft."""
    from flakebot.mcp.front import TOKEN_CALLS_AT_ONCE

    alice = add_token("alice", "--tenant", "acme")
    with serving(database=database) as url:
        job = call(url, alice, "craft", {"need": "need a csv deduper"})["run_id"]  # no worker: it stays queued
        created = asyncio.run(_task_behind_held_calls(url, alice, job, TOKEN_CALLS_AT_ONCE))
        assert created["result"]["task"]["taskId"].startswith("job-"), created
    tools = [record["tool"] for record in audit.read(workdir) if record["method"] == "tools/call"]
    assert tools.count("status") == TOKEN_CALLS_AT_ONCE and tools.count("craft") == 2, tools
    assert tools.index("craft", 1) > tools.index("status"), f"alice's task call ran beside her 8 in flight: {tools}"


@contextlib.contextmanager
def serving_here(state: Any) -> Any:
    """The front's real application for `state` (a TeamMCP) on a free loopback port, served by uvicorn in a thread of
    this process, so a test reads what the front holds between calls; its URL."""
    import threading

    import uvicorn

    from flakebot.mcp import front

    options = front.FrontOptions(port=0)
    sock = front.bind(options.host, 0)
    url = front.resource_url(options, sock.getsockname()[1])
    config = uvicorn.Config(front.build_app(state, options, url), log_config=None, access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=30, interval=0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


async def _calls_in_flight(url: str, state: Any, tokens: list[str], alice: str, job: str) -> None:
    from flakebot.mcp.front import TOKEN_CALLS_AT_ONCE

    await asyncio.gather(*(_call(url, token, "list", {}) for token in tokens))
    assert state._in_flight == {}, f"{len(state._in_flight)} principals kept after their calls ended"
    held = [
        asyncio.create_task(_call(url, alice, "status", {"run_id": job, "wait_seconds": 5}))
        for _ in range(TOKEN_CALLS_AT_ONCE + 4)
    ]
    await asyncio.sleep(3)  # every call reached the front: 8 hold her place, 4 wait in her queue
    (calls,) = state._in_flight.values()
    stats = calls.limiter.statistics()
    assert (stats.borrowed_tokens, stats.tasks_waiting) == (TOKEN_CALLS_AT_ONCE, 4), stats
    await asyncio.gather(*(_call(url, token, "list", {}) for token in tokens[:5]))  # others come and go meanwhile
    assert list(state._in_flight.values()) == [calls], "alice's calls in flight were replaced while held"
    assert calls.limiter.statistics().borrowed_tokens == TOKEN_CALLS_AT_ONCE  # her cap still holds
    answers = await asyncio.gather(*held)
    assert all(answer["status"] == "queued" for answer in answers), answers
    assert state._in_flight == {}


def test_a_fronts_calls_in_flight_keep_no_principal_once_its_calls_ended(flakebot_home: Path, database: str) -> None:
    """Each principal's calls in flight were a limiter kept for the server's life, one per principal ever seen (a
    JWT's subjects are unbounded). Now its entry goes when its last call leaves, and never while a call holds or
    waits on it: 20 tokens' calls leave nothing behind, and one token's 12 calls at once still run 8 at a time while
    other tokens' calls come and go."""
    from flakebot import config
    from flakebot.mcp.front import TeamMCP
    from flakebot.team.admission import SharedAdmission
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import TokenStore

    settings = config.load()
    store = TokenStore(settings.path("workdir"))
    tokens = [store.add(f"agent{n}", tenant="acme")[1] for n in range(20)]
    alice = store.add("alice", tenant="acme")[1]
    front_queue = FrontQueue(database)
    state = TeamMCP(settings, [], store, SharedAdmission(front_queue), front_queue)
    try:
        with serving_here(state) as url:
            job = call(url, alice, "craft", {"need": "need a csv deduper"})["run_id"]  # no worker: it stays queued
            asyncio.run(_calls_in_flight(url, state, tokens, alice, job))
    finally:
        front_queue.close()


def test_a_revoked_tokens_following_keeps_no_job_alive(flakebot_home: Path, database: str) -> None:
    """Crafts carol queued alone (one of them claimed by a worker), and one alice queued and carol joined; then
    carol's token is revoked. The jobs she alone followed ran on for nobody (queued: claimed later; claimed: crafted
    to the end). Now the revocation itself ends her followings, as her own tasks/cancel would: the front sees it
    within a second, cancels the jobs nobody live follows (the claimed one as any sole follower's cancel: its worker
    stops it) and leaves alice's, which goes on for alice."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")

    def task(session: Session, need: str) -> str:
        created = session.ask("tools/call", {"name": "craft", "arguments": {"need": need}, "task": {}})
        return str(created["result"]["task"]["taskId"])

    with serving(database=database) as url:
        mine, theirs = Session(url, alice), Session(url, carol)
        claimed, queued = task(theirs, "need a csv deduper"), task(theirs, "need a word counter")
        ours = task(mine, "need a tac")
        assert task(theirs, "Need a tac") == ours
        with db.connect(database) as conn:
            taken = queue.claim(conn, "w1", 60)  # the oldest queued job
        assert taken is not None and handle_of(taken) == claimed
        run_cli("token", "revoke", "carol", check=True)
        wait_for(lambda: {handle_of(r): r["state"] for r in rows(database)}[queued] == "cancelled", timeout=30)
        got = mine.ask("tasks/get", {"taskId": ours})["result"]
        assert got["status"] == "working", got  # alice's job goes on
    states = {handle_of(r): r["state"] for r in rows(database)}
    assert (states[claimed], states[queued], states[ours]) == ("cancelled", "cancelled", "queued"), states
    with db.connect(database) as conn:
        actions = conn.execute(
            "SELECT principal, action, job, detail FROM audit WHERE action IN ('cancelled', 'left') ORDER BY job"
        ).fetchall()
    assert [(a["principal"], a["action"], f"job-{a['job']}", a["detail"].get("because")) for a in actions] == [
        ("carol", "cancelled", claimed, "revoked"),
        ("carol", "cancelled", queued, "revoked"),
        ("carol", "left", ours, "revoked"),
    ], actions
    assert actions[0]["detail"]["worker"] == "w1"  # the worker to stop, as any cancel of a claimed job names it


def _waited_craft_given_up(url: str, token: str, need: str, session: dict[str, str] | None, seconds: float = 3) -> None:
    """A craft called with wait: true (a synchronous tools/call, not a task) whose client gives up after `seconds` and
    closes its connection; `session`: the headers of a 2025-11-25 session, None for a stateless request."""
    from tests.team.test_front import ACCEPT

    stateless = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "craft"}
    version = stateless if session is None else session
    headers = {**ACCEPT, "Authorization": f"Bearer {token}", **version}
    params: dict[str, Any] = {"name": "craft", "arguments": {"need": need, "wait": True}}
    if session is None:
        params["_meta"] = {"io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}, "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                           "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
    with (
        contextlib.suppress(httpx.TimeoutException),
        httpx.stream("POST", url, json=body, headers=headers, timeout=seconds) as answer,
    ):
        for line in answer.iter_lines():
            assert '"result"' not in line and '"error"' not in line, line  # no worker: it cannot end


@pytest.mark.parametrize(
    "protocol",
    ["2026-07-28", "2025-11-25"],
)
def test_a_waited_craft_whose_client_went_away_is_left(flakebot_home: Path, database: str, protocol: str) -> None:
    """A craft called with wait: true whose client closes the connection before the job ends: nobody can get its
    answer any more, yet the job ran on (queued: a worker would still claim it). Now the call's end leaves the job, as
    the caller's tasks/cancel would: one its caller alone followed is cancelled, one another agent follows too goes on
    for that agent. A stateless request's handler the SDK cancels when its client goes away; a 2025-11-25 session's
    it did not (the handler followed the job to its end): flakebot.mcp.gone now cancels it, as the client's own
    notifications/cancelled would."""
    alice, carol = add_token("alice", "--tenant", "acme"), add_token("carol", "--tenant", "acme")
    with serving(database=database, log=flakebot_home / "serve.log") as url:
        session = Session(url, alice).headers if protocol == "2025-11-25" else None
        _waited_craft_given_up(url, alice, "need a csv deduper", session)
        shared = call(url, carol, "craft", {"need": "need a word counter"})["run_id"]
        _waited_craft_given_up(url, alice, "need a word counter", session)
        alone = f"job-{min(r['id'] for r in rows(database))}"
        wait_for(lambda: {handle_of(r): r["state"] for r in rows(database)}[alone] == "cancelled", timeout=30)
        wait_for(lambda: ("alice", "left") in _actions(database), timeout=30)
        assert {handle_of(r): r["state"] for r in rows(database)}[shared] == "queued"
    assert _actions(database) == [("alice", "cancelled"), ("alice", "left")]


def test_a_waited_craft_given_up_leaves_no_job_its_caller_still_follows(flakebot_home: Path, database: str) -> None:
    """A waited craft whose client goes away leaves its job for its caller; but the caller may follow that job in
    other ways still: another waited call of the same need (an agent's two sub-agents, one token), or a craft it
    detached before (its task handle). Its one call gone cancelled the job under the others: the call still waiting
    got "cancelled", the detached craft was cancelled for nobody's asking. Now a waited call gone ends only its own
    following of the job (each enqueue or join is one, in the audit); the job is left with the caller's last."""
    import threading

    alice = add_token("alice", "--tenant", "acme")
    with serving(database=database, log=flakebot_home / "serve.log") as url:
        detached = call(url, alice, "craft", {"need": "need a word counter"})["run_id"]
        _waited_craft_given_up(url, alice, "need a word counter", None)
        failed: list[BaseException] = []

        def held() -> None:
            try:
                _waited_craft_given_up(url, alice, "need a csv deduper", None, seconds=12)
            except BaseException as exc:  # an answer came: the job ended under this call
                failed.append(exc)

        waiting = threading.Thread(target=held)
        waiting.start()
        wait_for(lambda: len(rows(database)) == 2, timeout=30)
        _waited_craft_given_up(url, alice, "need a csv deduper", None)  # gives up while `held` still waits
        waiting.join(60)
        assert not failed, f"the job ended under alice's other waited call: {failed[0]}"
        assert {handle_of(r): r["state"] for r in rows(database)}[detached] == "queued"
        shared = f"job-{max(r['id'] for r in rows(database))}"
        wait_for(lambda: {handle_of(r): r["state"] for r in rows(database)}[shared] == "cancelled", timeout=30)
    assert _actions(database) == [("alice", "cancelled")]


def test_one_tokens_waited_calls_of_one_job_on_two_fronts_each_end_only_their_own_following(
    flakebot_home: Path, database: str, tmp_path: Path
) -> None:
    """One token waits on one job through two fronts: its call on the first queued it, its call on the second joined
    it, then the first's client goes away. Each front counted only its own waited calls, so the first's end was the
    token's whole following: the job was cancelled under the second front's call. Now each waited call's enqueue or
    join is one following in the audit and its end retracts that one only: the job goes on and the second call gets
    its end (a worker's, here a failed first check); the token's last following gone would have left it."""
    import concurrent.futures

    alice = add_token("alice", "--tenant", "acme")
    need = "need a csv deduper"
    with (
        serving(database=database, log=flakebot_home / "one.log") as one,
        serving(database=database, log=flakebot_home / "two.log") as two,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        first = pool.submit(_waited_craft_given_up, one, alice, need, None, 10)
        wait_for(lambda: rows(database), timeout=30, interval=0.2)
        second = pool.submit(call, two, alice, "craft", {"need": need, "wait": True})
        wait_for(lambda: "joined" in [action for _, action in _audited(database)], timeout=30, interval=0.2)
        assert not first.done(), "the first call gave up before the second joined: the scenario did not happen"
        first.result(timeout=60)  # its client went away
        wait_for(lambda: len(_audited(database)) > 2, timeout=30, interval=0.2)  # the first front's end of its call
        assert [r["state"] for r in rows(database)] == ["queued"], _audited(database)
        assert not second.done(), second.result()
        with worker(database, tmp_path / "worker.log", model="scripted:/nonexistent.json") as proc:
            assert proc.wait(timeout=120) == 0, (tmp_path / "worker.log").read_text()
        answer = second.result(timeout=60)
        assert answer["is_error"] and answer["type"] == "ScriptError", answer
    assert _actions(database) == []


def _audited(database: str) -> list[tuple[str, str]]:
    """Who queued, joined, left, cancelled or retracted a following of a job, in order."""
    with db.connect(database) as conn:
        said = conn.execute(
            "SELECT principal, action FROM audit WHERE action IN ('enqueued', 'joined', 'left', 'cancelled', "
            "'retracted') ORDER BY id"
        ).fetchall()
    return [(a["principal"], a["action"]) for a in said]


def test_only_a_token_granted_metrics_reads_them(flakebot_home: Path, database: str) -> None:
    """/metrics answered any active token, so every tenant read the whole queue's depth (and the front's calls and
    refusals): another tenant's work, counted. Now it is 403 in one line to a token without the `metrics` grant
    (`token add NAME --grant metrics`, the scraper's), whose scrape is the whole front's, as before."""
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "other")
    with serving(database=database) as url:
        assert call(url, alice, "craft", {"need": "need a csv deduper"})["status"] == "queued"
        refused = metrics(url, bob)
        assert refused.status_code == 403 and "flakebot_queue_jobs" not in refused.text, refused.text
        assert refused.text.count("\n") == 1 and "token 'bob' may not read /metrics" in refused.text, refused.text
        assert "Fix: " in refused.text and "--grant metrics" in refused.text, refused.text
        assert metrics(url, None).status_code == 401
        scraper = add_token("prometheus", "--grant", "metrics")
        scraped = metrics(url, scraper)
        assert scraped.status_code == 200 and 'flakebot_queue_jobs{state="queued"} 1' in scraped.text, scraped.text
    unknown = run_cli("token", "add", "eve", "--grant", "admin")
    assert unknown.returncode == 70 and unknown.stderr.count("\n") == 1, unknown.stderr
    assert "no grant 'admin'" in unknown.stderr and "metrics" in unknown.stderr, unknown.stderr
    listed = json_result(run_cli("token", "list", "--json", check=True))["tokens"]
    assert [(t["name"], t["grants"]) for t in listed] == [("alice", []), ("bob", []), ("prometheus", ["metrics"])]


def test_a_jwt_callers_cancel_is_answered_while_the_token_store_is_unsafe(
    flakebot_home: Path, database: str, workdir: Path
) -> None:
    """The store of static tokens becomes unsafe (group- and world-writable) while the front serves: every static token
    is refused, but an IdP's JWT is verified without it, and its tasks/cancel asked the store which tokens are revoked,
    which raised: a JSON-RPC error of code 0 with no fix, and a traceback in the front's log. Now an unsafe store holds
    no revoked token (nobody's following is discounted for it: its records may be anyone's), and carol, the only
    follower of her craft, cancels it."""
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from tests.team.test_jwt import AUDIENCE, ISSUER, claims

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    add_token("alice", "--tenant", "acme")  # the store exists: a token of the team's own
    carol = jwt.encode(claims(), private, algorithm="RS256")
    log = flakebot_home / "serve.log"
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    with serving(*options, log=log, database=database) as url:
        mine = Session(url, carol)
        created = mine.ask("tools/call", {"name": "craft", "arguments": {"need": "need a csv deduper"}, "task": {}})
        job = str(created["result"]["task"]["taskId"])
        (workdir / "team" / "tokens.json").chmod(0o666)
        cancelled = mine.ask("tasks/cancel", {"taskId": job})
        assert cancelled.get("result", {}).get("status") == "cancelled", cancelled
    assert {handle_of(r): r["state"] for r in rows(database)}[job] == "cancelled"
    logged = log.read_text()
    assert "no token counted as revoked" in logged and "Traceback" not in logged, logged[-2000:]


def test_an_unsafe_token_store_is_logged_once_each_time_it_becomes_so(
    flakebot_home: Path, database: str, workdir: Path
) -> None:
    """The token store becomes unsafe while the front serves (world-writable), is made safe again, then unsafe again.
    The front looks at it every second (revoked tokens' followings, sessions to end), and logged the same error
    lines each second for as long as it stayed so: a log filled with one fact. Now each line is logged when the
    store becomes unsafe, and once more only after it was safe again (which is logged too)."""
    add_token("alice", "--tenant", "acme")
    store = workdir / "team" / "tokens.json"
    log = flakebot_home / "serve.log"

    def said(text: str) -> int:
        return log.read_text().count(text) if log.exists() else 0

    with serving(log=log, database=database):
        for episode in (1, 2):
            store.chmod(0o666)
            wait_for(lambda n=episode: said("no token counted as revoked") >= n, timeout=30)
            time.sleep(3)  # three more looks at the unsafe store
            store.chmod(0o600)
            wait_for(lambda n=episode: said("the token store is safe again") >= n, timeout=30)
    assert said("no token counted as revoked") == 2, log.read_text()[-3000:]
    assert said("ending every session") == 2, log.read_text()[-3000:]


async def _flood_behind_held_calls(url: str, alice: str, bob: str, job: str) -> tuple[dict[str, Any], int]:
    """alice's TOKEN_CALLS_AT_ONCE status calls held, then a flood of her craft task calls, each waiting in her queue
    until its client gives up and cancels it (notifications/cancelled); meanwhile bob's craft task. bob's answer,
    and how many of alice's holds had ended when it came."""
    from flakebot.mcp.front import TOKEN_CALLS_AT_ONCE
    from tests.team.test_front import ACCEPT

    mine, theirs = await asyncio.gather(asyncio.to_thread(Session, url, alice), asyncio.to_thread(Session, url, bob))

    async def hold() -> None:
        await _call(url, alice, "status", {"run_id": job, "wait_seconds": 30})  # a margin for a loaded machine

    held = [asyncio.create_task(hold()) for _ in range(TOKEN_CALLS_AT_ONCE)]
    await asyncio.sleep(3)  # every hold has reached the front
    headers = {**ACCEPT, "Authorization": f"Bearer {alice}", **mine.headers}
    flood = range(100, 120)

    async def waits(number: int) -> None:
        asked = {"name": "craft", "arguments": {"need": f"need tool {number}"}, "task": {}}
        with contextlib.suppress(httpx.TimeoutException):  # the client gives up: the call still waits in her queue
            async with httpx.AsyncClient(timeout=2) as http:
                body = {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": asked}
                answer = await http.post(url, json=body, headers=headers)
                raise AssertionError(f"alice's task call ran beside her held calls: {answer.text}")

    await asyncio.gather(*(waits(number) for number in flood))
    asked = {"name": "craft", "arguments": {"need": "need a word counter"}, "task": {}}
    answer = await asyncio.wait_for(asyncio.to_thread(theirs.ask, "tools/call", asked), 60)
    ended = sum(task.done() for task in held)
    cancels = [{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": n}} for n in flood]
    told = await asyncio.gather(*(asyncio.to_thread(post, url, cancel, alice, **mine.headers) for cancel in cancels))
    assert [answer.status_code for answer in told] == [202] * len(cancels)
    assert not any(task.done() for task in held), "alice's holds ended before her waiting calls were cancelled"
    ended_job = await asyncio.to_thread(mine.ask, "tasks/cancel", {"taskId": job})  # her holds end with it
    assert ended_job["result"]["status"] == "cancelled", ended_job
    await asyncio.gather(*held)
    return answer, ended


def test_a_flood_of_one_tokens_task_calls_starves_no_other_and_a_cancelled_one_queues_nothing(
    flakebot_home: Path, database: str
) -> None:
    """A task call waits in its token's own queue (TOKEN_CALLS_AT_ONCE in flight): 20 of alice's craft task calls
    waiting behind her 8 held calls do not delay bob's (his own queue), and each she cancels while it waits leaves her
    queue without queueing its craft (only her first job and bob's are in the table after her holds ended)."""
    alice, bob = add_token("alice", "--tenant", "acme"), add_token("bob", "--tenant", "acme")
    with serving(database=database, log=flakebot_home / "serve.log") as url:
        job = call(url, alice, "craft", {"need": "need a csv deduper"})["run_id"]  # no worker: it stays queued
        answer, ended = asyncio.run(_flood_behind_held_calls(url, alice, bob, job))
        assert answer["result"]["task"]["taskId"].startswith("job-"), answer
        assert ended == 0, "bob's task call waited for alice's held calls"
        time.sleep(2)  # a waiting call that was not cancelled would take a place now and queue its craft
        later = Session(url, alice).ask(
            "tools/call", {"name": "craft", "arguments": {"need": "need a tac"}, "task": {}}
        )
        assert later["result"]["task"]["taskId"].startswith("job-"), later
    needs = [r["request"]["need"] for r in rows(database)]
    assert needs == ["need a csv deduper", "need a word counter", "need a tac"], needs


def test_revoking_a_token_cancels_no_job_a_live_principal_still_follows(flakebot_home: Path, database: str) -> None:
    """carol's static token queues a craft; a JWT of the same subject 'carol' and alice join it; static carol is
    revoked, which makes her leave the job (the front sees the revocation). The JWT carol's following still counts
    (another principal, never revoked by the token store): alice's tasks/cancel only leaves the job, which stays
    queued for JWT carol, whose cancel then ends it."""
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from tests.team.test_jwt import AUDIENCE, ISSUER, claims

    private = ec.generate_private_key(ec.SECP256R1())
    key_file = flakebot_home / "idp.pem"
    key_file.write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    carol, alice = add_token("carol", "--tenant", "acme"), add_token("alice", "--tenant", "acme")
    also_carol = jwt.encode(claims(sub="carol"), private, algorithm="ES256")
    options = ["--jwt-issuer", ISSUER, "--jwt-audience", AUDIENCE, "--jwt-key", str(key_file)]
    asked = {"name": "craft", "arguments": {"need": "need a csv deduper"}, "task": {}}
    with serving(*options, database=database, log=flakebot_home / "serve.log") as url:
        theirs, idps, mine = Session(url, carol), Session(url, also_carol), Session(url, alice)
        job = str(theirs.ask("tools/call", asked)["result"]["task"]["taskId"])
        assert idps.ask("tools/call", asked)["result"]["task"]["taskId"] == job
        assert mine.ask("tools/call", asked)["result"]["task"]["taskId"] == job
        run_cli("token", "revoke", "carol", check=True)
        wait_for(lambda: _actions(database) == [("carol", "left")], timeout=30)  # the front saw it: static carol left
        left = mine.ask("tasks/cancel", {"taskId": job})
        assert left["result"]["status"] == "cancelled", left  # alice's task: she left the job
        assert {handle_of(r): r["state"] for r in rows(database)}[job] == "queued"
        assert idps.ask("tasks/get", {"taskId": job})["result"]["status"] == "working"
        ended = idps.ask("tasks/cancel", {"taskId": job})
        assert ended["result"]["status"] == "cancelled", ended
    assert {handle_of(r): r["state"] for r in rows(database)}[job] == "cancelled"
    actions = _actions(database)
    assert actions == [("carol", "left"), ("alice", "left"), ("carol", "cancelled")], actions


def _actions(database: str) -> list[tuple[str, str]]:
    """Who left or cancelled a job, in order."""
    with db.connect(database) as conn:
        said = conn.execute(
            "SELECT principal, action FROM audit WHERE action IN ('cancelled', 'left') ORDER BY id"
        ).fetchall()
    return [(a["principal"], a["action"]) for a in said]


def test_a_queued_tasks_calls_while_the_database_is_away_are_one_line_errors(
    flakebot_home: Path, postgres: Cluster, database: str
) -> None:
    """The team database goes away (its connections ended, the database renamed) while alice follows her craft's
    task: every door a client reaches the queue by (tasks/get, tasks/cancel, tasks/list, a craft, status of a job,
    show and runs, which read the tenant's runs from the queue) answers one line with a fix that is the agent's to
    take, and none of them says where the database is (its host, port or name: the front's reconnect raised "cannot
    reach the team database postgresql://...@127.0.0.1:PORT/NAME" to the agent). The operator's log keeps that line;
    /metrics still answers the front's own counters."""
    import psycopg

    alice, scraper = add_token("alice", "--tenant", "acme"), add_token("prometheus", "--grant", "metrics")
    name = database.rsplit("/", 1)[1]
    log = flakebot_home / "serve.log"
    where = (name, f":{postgres.port}", "127.0.0.1", "postgresql", postgres.password)
    with serving(database=database, log=log) as url:
        mine = Session(url, alice)
        created = mine.ask("tools/call", {"name": "craft", "arguments": {"need": "need a csv deduper"}, "task": {}})
        job = str(created["result"]["task"]["taskId"])
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
            admin.execute(f"ALTER DATABASE {name} RENAME TO {name}_away")
        try:
            time.sleep(1)  # the row the front read last is no longer fresh (ROW_FRESH)
            for method, params in (
                ("tasks/get", {"taskId": job}),
                ("tasks/cancel", {"taskId": job}),
                ("tasks/list", {}),
                ("tasks/result", {"taskId": job}),
                ("tools/call", {"name": "craft", "arguments": {"need": "need a tac"}, "task": {}}),
            ):
                said = _database_error(mine.ask(method, params), method)
                assert not [w for w in where if w in said], (method, said)
            for tool, arguments in (
                ("craft", {"need": "need a word counter"}),
                ("craft", {"need": "need a word counter", "wait": True}),
                ("status", {"run_id": job}),
                ("status", {"run_id": job, "wait_seconds": 3}),
                ("show", {"name": "20260101-000000-abcdef"}),
                ("runs", {}),
            ):
                told = call(url, alice, tool, arguments)
                assert told["is_error"] and "team database" in told["error"] and told["fix"], (tool, told)
                assert not [w for w in where if w in json.dumps(told)], (tool, told)
            scraped = metrics(url, scraper)
            assert scraped.status_code == 200 and "flakebot_tool_calls_total" in scraped.text, scraped.text
        finally:
            with psycopg.connect(postgres.url(), autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE {name}_away RENAME TO {name}")
    logged = log.read_text()
    assert "Traceback" not in logged
    assert f"cannot reach the team database postgresql://[REDACTED]@127.0.0.1:{postgres.port}/{name}" in logged
    assert postgres.password not in logged


def test_a_team_database_that_refuses_writes_is_one_line_to_agents(
    flakebot_home: Path, postgres: Cluster, database: str
) -> None:
    """The team database answers but refuses what the front writes (made read-only, as a standby a failover left
    behind is, or an admin's default_transaction_read_only): the front passed only a connection's loss through its
    one line, so PostgreSQL's own error came out as it was: tasks/cancel a JSON-RPC error of code 0 with the server's
    text and no fix, a tools/call a bare HTTP 500 (the admission's count raised in the ASGI app), both a traceback in
    the log. Now every door answers the agent one line with a fix, saying nothing of the database's own text; the
    admission counts on this front alone meanwhile; the log keeps PostgreSQL's reason."""
    import psycopg

    alice = add_token("alice", "--tenant", "acme")
    name = database.rsplit("/", 1)[1]
    log = flakebot_home / "serve.log"
    with serving(database=database, log=log) as url:
        mine = Session(url, alice)
        created = mine.ask("tools/call", {"name": "craft", "arguments": {"need": "need a csv deduper"}, "task": {}})
        job = str(created["result"]["task"]["taskId"])
        with psycopg.connect(postgres.url(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        try:
            for method, params in (
                ("tasks/cancel", {"taskId": job}),
                ("tools/call", {"name": "craft", "arguments": {"need": "need a tac"}, "task": {}}),
            ):
                said = _database_error(mine.ask(method, params), method)
                assert "read-only" not in said, (method, said)
            for arguments in ({"need": "need a word counter"}, {"need": "need a word counter", "wait": True}):
                told = call(url, alice, "craft", arguments)
                assert told["is_error"] and "team database" in told["error"] and told["fix"], told
                assert "read-only" not in json.dumps(told), told
            assert mine.ask("tasks/get", {"taskId": job})["result"]["status"] == "working"  # reads still answer
        finally:
            with psycopg.connect(postgres.url(), autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")
    logged = log.read_text()
    assert "Traceback" not in logged and "Exception in ASGI application" not in logged, logged[-3000:]
    assert "read-only transaction" in logged


async def _calls_given_up_while_waiting(url: str, state: Any, alice: str, job: str) -> None:
    from flakebot.mcp.front import TOKEN_CALLS_AT_ONCE

    held = [
        asyncio.create_task(_call(url, alice, "status", {"run_id": job, "wait_seconds": 6}))
        for _ in range(TOKEN_CALLS_AT_ONCE)
    ]
    await asyncio.sleep(2)  # her 8 places are taken
    waiting = [asyncio.create_task(_call(url, alice, "list", {})) for _ in range(4)]
    await asyncio.sleep(2)  # the 4 wait in her queue, then their clients give up
    (calls,) = state._in_flight.values()
    assert (calls.users, calls.limiter.statistics().tasks_waiting) == (TOKEN_CALLS_AT_ONCE + 4, 4)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await asyncio.gather(*held)
    wait_for(lambda: state._in_flight == {}, timeout=30)
    answers = await asyncio.gather(*(_call(url, alice, "list", {}) for _ in range(TOKEN_CALLS_AT_ONCE)))
    assert all(not answer["is_error"] for answer in answers)
    assert state._in_flight == {}


def test_calls_given_up_while_waiting_for_their_tokens_place_leave_nothing_counted(
    flakebot_home: Path, database: str
) -> None:
    """Calls of one token waiting behind its 8 in flight whose clients give up (the SDK cancels their handlers while
    they wait on the limiter): each leaves its count, so once every call ended the token's entry is gone (not kept
    for the server's life by a count nobody will take back)."""
    from flakebot import config
    from flakebot.mcp.front import TeamMCP
    from flakebot.team.admission import SharedAdmission
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import TokenStore

    settings = config.load()
    store = TokenStore(settings.path("workdir"))
    alice = store.add("alice", tenant="acme")[1]
    front_queue = FrontQueue(database)
    state = TeamMCP(settings, [], store, SharedAdmission(front_queue), front_queue)
    try:
        with serving_here(state) as url:
            job = call(url, alice, "craft", {"need": "need a csv deduper"})["run_id"]
            asyncio.run(_calls_given_up_while_waiting(url, state, alice, job))
    finally:
        front_queue.close()


def test_a_front_stopping_leaves_its_waited_crafts_to_its_lease(flakebot_home: Path, database: str) -> None:
    """The front stops (SIGTERM) while waited crafts are held: the calls end with the server, but nobody gave them
    up. Each job goes on, in either protocol, and the front's lease stays to run out: a caller has that long to come
    back to its job (a retried craft joins it) before a live front's sweep ends the stopped front's followings (as a
    killed front's: tests/team/test_serve_followings.py)."""
    import threading

    import psycopg

    alice = add_token("alice", "--tenant", "acme")
    log = flakebot_home / "serve.log"

    def waited(url: str, need: str, headers: dict[str, str] | None) -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server went away mid-answer
            _waited_craft_given_up(url, alice, need, headers, 60)

    with serving(database=database, log=log) as url:
        session = Session(url, alice).headers
        held = [
            threading.Thread(target=waited, args=(url, need, headers), daemon=True)
            for need, headers in (("need a csv deduper", None), ("need a word counter", session))
        ]
        for thread in held:
            thread.start()
        wait_for(lambda: len(rows(database)) == 2, timeout=30)
    for thread in held:
        thread.join(30)
    assert [r["state"] for r in rows(database)] == ["queued", "queued"]
    assert _actions(database) == []
    assert "left: a call of it ended before its answer" not in log.read_text()
    with psycopg.connect(database) as conn:
        assert len(conn.execute("SELECT id FROM fronts WHERE lease_until > now()").fetchall()) == 1


def test_a_craft_queued_after_the_fronts_look_at_its_revoked_token_is_not_left_running(
    flakebot_home: Path, database: str
) -> None:
    """The token is revoked between the craft's admission and its enqueue, and the front's once-a-second look at
    revoked tokens passes in between (it finds no job of the token yet, and looks at that token never again): the
    enqueue sees the revocation after its commit, ends the token's following as that look would have (the job,
    followed by nobody live, cancelled) and refuses the call in one line. Before, the job stayed queued for nobody."""
    from flakebot import config
    from flakebot.mcp.front import REVOKED_SWEEP_SECONDS, TeamMCP
    from flakebot.team import db
    from flakebot.team.admission import SharedAdmission
    from flakebot.team.frontqueue import FrontQueue
    from flakebot.team.tokens import TokenStore

    settings = config.load()
    store = TokenStore(settings.path("workdir"))
    alice = store.add("alice", tenant="acme")[1]
    front_queue = FrontQueue(database)
    state = TeamMCP(settings, [], store, SharedAdmission(front_queue), front_queue)
    real_enqueue = front_queue.enqueue

    def revoked_meanwhile(*args: Any, **kwargs: Any) -> Any:
        TokenStore(settings.path("workdir")).revoke("alice")  # `flakebot token revoke alice`, from another process
        time.sleep(3 * REVOKED_SWEEP_SECONDS)  # the front's look passes: no job of alice's yet
        return real_enqueue(*args, **kwargs)

    front_queue.enqueue = revoked_meanwhile  # type: ignore[method-assign]
    try:
        with serving_here(state) as url:
            answer = call(url, alice, "craft", {"need": "need a csv deduper", "wait": False})
            assert answer["is_error"] and "revoked while its call was queued" in json.dumps(answer), answer
            time.sleep(3 * REVOKED_SWEEP_SECONDS)  # the front's looks go on: none of them would end it
    finally:
        front_queue.close()
    with db.connect(database) as conn:
        jobs = [dict(row) for row in conn.execute("SELECT * FROM jobs WHERE tenant = 'acme'").fetchall()]
    assert [job["state"] for job in jobs] == ["cancelled"], jobs


def _database_error(answer: dict[str, Any], method: str) -> str:
    """The JSON-RPC error a request got while the team database was away or refusing: one line of flakebot's own,
    with its fix, under a real error code. Its message."""
    error = answer.get("error") or {}
    said = str(error.get("message", ""))
    assert "team database" in said and "Fix: " in said, (method, answer)
    assert error["code"] != 0 and "\n" not in said, (method, answer)
    return said
