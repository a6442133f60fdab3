"""`list` says what each catalog entry is (kind: tool or service), and a service's name called as a tool is refused
at once, naming the door that starts it: through the real MCP SDK's client on `flakebot mcp` and the real CLI (its
fast path and typer's). The entries are catalogued directly (no build): what is tested is what the doors make of
them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog
from tests.conftest import json_result, run_cli
from tests.mcp.test_server import mcp_client


@pytest.fixture
def catalogued(flakebot_home: Path) -> dict[str, str]:
    """A tool (alpha) and a service (kv) in the catalog."""
    flake = flakebot_home / "flake"
    flake.mkdir()
    (flake / "flake.nix").write_text("{ }\n")
    catalog = Catalog.open(config.load())
    kinds = {"alpha": "tool", "kv": "service"}
    for name, kind in kinds.items():
        manifest = {"name": name, "summary": f"{name} things", "nix_run_argv": ["nix", "run", "x"]}
        if kind == "service":
            manifest |= {"kind": "service", "service": {"port": 8080}}
        catalog.add(name, need=f"{name} things", flake_dir=flake, manifest=manifest, usage_md="", store_path="/x",
                    run_id="r", origin={})  # fmt: skip
    return kinds


def test_an_agent_sees_each_entrys_kind_and_calling_a_service_by_name_is_refused_at_once(
    catalogued: dict[str, str],
) -> None:
    async def session() -> dict[str, Any]:
        async with mcp_client() as client:
            seen: dict[str, Any] = {"names": await client.tool_names(), "list": await client.call("list", {})}
            started = time.monotonic()
            seen["called"] = await client.call("kv", {})
            seen["run"] = await client.call("run", {"tool": "kv", "args": []})
            seen["seconds"] = time.monotonic() - started
            return seen

    seen = asyncio.run(session())
    assert "alpha" in seen["names"] and "kv" not in seen["names"]  # a service is not listed as a tool
    listed, failed = seen["list"]
    assert not failed and {t["name"]: t["kind"] for t in listed["tools"]} == catalogued
    assert set(listed["tools"][0]) == {"name", "kind", "version", "summary", "need", "run_id"}
    for answer, is_error in (seen["called"], seen["run"]):
        assert is_error and answer["ok"] is False, answer
        assert "kv is a service, not a tool" in answer["error"] and "service_up" in answer["fix"], answer
    assert seen["seconds"] < 10  # refused, not run in the foreground until a timeout


def test_the_cli_lists_kinds_and_refuses_to_run_a_service_naming_up(catalogued: dict[str, str]) -> None:
    listed = json_result(run_cli("list", "--json"))["tools"]
    assert {t["name"]: t["kind"] for t in listed} == catalogued
    table = run_cli("list", env={"COLUMNS": "200"}, check=True).stdout
    header = next(line for line in table.splitlines() if "tool" in line and "version" in line)
    assert "kind" in header
    assert any("kv" in line and "service" in line for line in table.splitlines())
    for argv in (("run", "kv"), ("run", "kv", "extra"), ("run", "kv", "--json")):  # the fast path, typer's, captured
        started = time.monotonic()
        refused = run_cli(*argv, input="")
        assert refused.returncode != 0 and time.monotonic() - started < 30, argv
        assert "kv is a service, not a tool" in refused.stderr and "flakebot up kv" in refused.stderr, refused.stderr


def test_rm_says_what_it_removed(catalogued: dict[str, str]) -> None:
    one = run_cli("rm", "alpha@0.1.0", check=True)
    assert one.stdout.startswith("removed alpha 0.1.0 (store path /x"), one.stdout
    whole = json_result(run_cli("rm", "kv", "--json"))
    assert whole == {"removed": {"name": "kv", "version": "0.1.0", "store_path": "/x"}}
    assert json.loads(json.dumps(json_result(run_cli("list", "--json")))) == {"tools": []}
