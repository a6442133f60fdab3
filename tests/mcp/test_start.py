"""`flakebot mcp`'s start (flakebot.mcp.start), over stdio as a client speaks it: `initialize` answered from the cache
is the SDK's own answer, byte for byte, for every protocol version the SDK negotiates; requests sent before the server
is ready are answered in order; a first line that is no `initialize` goes to the SDK unchanged; and a client that
closes its input right after its requests gets every answer."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from benchmarks.scenarios.many_tools import Tools, store_path
from tests.mcp.test_server import mcp_client

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def initialize(version: str, id_: int | str = 0) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "wire", "version": "1"}}}  # fmt: skip


def session(*messages: dict[str, Any] | str) -> tuple[list[str], str]:
    """`flakebot mcp` given `messages` at once, its input then closed: every line it wrote until it ended, and its
    stderr."""
    text = "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in messages)
    process = subprocess.run(
        [sys.executable, "-m", "flakebot", "mcp"], input=text, capture_output=True, text=True, timeout=120
    )
    assert process.returncode == 0, process.stderr
    return process.stdout.splitlines(), process.stderr


def cache(home: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((home / "cache/flakebot/mcp-initialize.json").read_text())
    return record


@pytest.mark.parametrize("version", [*HANDSHAKE_PROTOCOL_VERSIONS, "2099-01-01"])
def test_initialize_from_the_cache_is_the_sdks_own_answer(flakebot_home: Path, version: str) -> None:
    sdk, _ = session(initialize(version))  # no cache yet: the SDK answers, and its answer is cached
    assert json.loads(sdk[0])["result"]["protocolVersion"] == (
        version if version in HANDSHAKE_PROTOCOL_VERSIONS else HANDSHAKE_PROTOCOL_VERSIONS[-1]
    )
    assert cache(flakebot_home)["answers"] == {version: json.loads(sdk[0])["result"]}
    early, _ = session(initialize(version))
    assert early == sdk  # the same line, byte for byte, and only once

    # The cache is what the second start answered from: a changed entry is what the client gets, the SDK's own
    # answer disagrees, and the cache is refreshed with it.
    record = cache(flakebot_home)
    record["answers"][version]["instructions"] = "from the cache"
    (flakebot_home / "cache/flakebot/mcp-initialize.json").write_text(json.dumps(record))
    stale, stderr = session(initialize(version))
    assert json.loads(stale[0])["result"]["instructions"] == "from the cache" and len(stale) == 1
    assert "differed from the MCP SDK's" in stderr
    assert cache(flakebot_home)["answers"] == {version: json.loads(sdk[0])["result"]}


@pytest.mark.parametrize("cached", [False, True])
def test_requests_sent_before_the_server_is_ready_are_answered_in_order_before_it_ends(
    flakebot_home: Path, cached: bool
) -> None:
    if cached:
        session(initialize("2025-06-18"))
        assert cache(flakebot_home)["answers"]
    requests = [{"jsonrpc": "2.0", "id": id_, "method": "tools/list"} for id_ in (1, 2)]
    lines, _ = session(
        initialize("2025-06-18"), INITIALIZED, *requests, {"jsonrpc": "2.0", "id": "p", "method": "ping"}
    )
    answers = [json.loads(line) for line in lines]
    assert [a["id"] for a in answers[:1]] == [0] and answers[0]["result"]["serverInfo"]["name"] == "flakebot"
    assert sorted(map(str, (a["id"] for a in answers))) == ["0", "1", "2", "p"]  # each once: none dropped at the end
    assert all("craft" in {t["name"] for t in a["result"]["tools"]} for a in answers if a["id"] in (1, 2))


def test_a_first_line_that_is_no_initialize_reaches_the_sdk_unchanged(flakebot_home: Path) -> None:
    session(initialize("2025-06-18"))  # cached: still, only an initialize is answered early
    lines, _ = session("{this is not json", initialize("2025-06-18", "second"), INITIALIZED,
                       {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})  # fmt: skip
    answers = [json.loads(line) for line in lines]
    assert answers[0]["id"] is None and answers[0]["error"]["code"] == -32700
    assert answers[1]["id"] == "second" and answers[1]["result"]["protocolVersion"] == "2025-06-18"
    assert answers[2]["id"] == 3 and answers[2]["result"]["tools"]
    early, _ = session({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, initialize("2025-06-18"))
    assert json.loads(early[0])["id"] == 9 and "error" in json.loads(early[0])  # the SDK's refusal before initialize
    assert json.loads(early[1])["id"] == 0


def test_the_sdk_client_gets_the_same_initialize_result_from_the_cache(flakebot_home: Path) -> None:
    async def start() -> tuple[Any, list[str]]:
        async with mcp_client() as client:
            return client.init, await client.tool_names()

    first, names = asyncio.run(start())
    assert (flakebot_home / "cache/flakebot/mcp-initialize.json").exists()
    cached = cache(flakebot_home)["answers"][first.protocol_version]
    second, again = asyncio.run(start())
    assert second == first and again == names
    assert second.model_dump(mode="json", by_alias=True, exclude_unset=True) == cached
    record = cache(flakebot_home)
    record["answers"][first.protocol_version]["instructions"] = "from the cache"
    (flakebot_home / "cache/flakebot/mcp-initialize.json").write_text(json.dumps(record))
    third, _ = asyncio.run(start())
    assert third.instructions == "from the cache"  # what the second start answered came from the cache


def tools_list(id_: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/list", "params": {}}


@pytest.mark.parametrize("version", ["2025-06-18", HANDSHAKE_PROTOCOL_VERSIONS[-1]])
def test_the_first_tools_list_is_the_sdks_answer_from_the_cache_while_the_catalog_holds_its_tools(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """A tools/list right after `initialize` is answered from the cache the last server left (flakebot.mcp.earlylist)
    with the SDK's own answer, byte for byte and once; a tool added or removed since then is the SDK's answer again;
    and a cache that lies is what the client gets, with a warning when the SDK's answer differs."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin")  # no nix-store: plain GC links
    tools = Tools(flakebot_home, store_path(tmp_path, nix=False))
    tools.grow(3)
    opening = (initialize(version), INITIALIZED, tools_list(1))
    sdk, _ = session(*opening)  # no cache yet: the SDK answers, and the server caches its list
    path = flakebot_home / f"cache/flakebot/mcp-tools-list-{version}.json"
    assert path.exists()
    early, stderr = session(*opening)
    assert early == sdk and len(early) == 2 and "differed" not in stderr
    names = [t["name"] for t in json.loads(early[1])["result"]["tools"]]
    assert names[-3:] == ["t00001", "t00002", "t00003"]

    tools.add("t00004")
    tools.catalog.remove("t00001")
    changed, stderr = session(*opening)
    names = [t["name"] for t in json.loads(changed[1])["result"]["tools"]]
    assert names[-3:] == ["t00002", "t00003", "t00004"] and "differed" not in stderr
    assert session(*opening)[0] == changed  # the new list, cached in turn

    header, answer = path.read_text().splitlines()
    lying = json.loads(answer)
    next(t for t in lying["tools"] if t["name"] == "t00002")["description"] = "from the cache"
    path.write_text(header + "\n" + json.dumps(lying) + "\n")
    stale, stderr = session(*opening)
    listed = {t["name"]: t for t in json.loads(stale[1])["result"]["tools"]}
    assert listed["t00002"]["description"] == "from the cache" and len(stale) == 2
    assert "early tool list differed from the MCP SDK's answer" in stderr
    assert not path.exists() or "from the cache" not in path.read_text()  # dropped (or rewritten by the SDK's list)
    assert session(*opening)[0] == session(*opening)[0] == changed


def test_a_list_already_cached_is_not_remembered_again_until_the_cache_is_forgotten(flakebot_home: Path) -> None:
    """The team front lists for many agents: once this process found or wrote a version's cache at some stamps, a
    list of the same tools writes nothing; other stamps, or a cache forgotten (an early answer the SDK disagreed
    with), are written again."""
    from flakebot.mcp import earlylist

    version, stamps = "2025-11-25", {"tool-a": "k:1"}
    path = earlylist.cache_path(version)
    assert path is not None and not earlylist.remembered(version, stamps)
    earlylist.remember(version, {"tools": []}, [], stamps)
    assert path.exists() and earlylist.remembered(version, stamps)
    assert not earlylist.remembered(version, {"tool-a": "k:2"})
    earlylist.forget(version)
    assert not path.exists() and not earlylist.remembered(version, stamps)
    earlylist.remember(version, {"tools": []}, [], stamps)
    assert path.exists() and earlylist.remembered(version, stamps)
