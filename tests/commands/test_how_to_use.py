"""A craft's result says what it made (a tool or a service) and the door to use it by (flakebot.deliver.howto), through
the real CLI (--json) and the real MCP server from the Python SDK: a service is started with service_up or
`flakebot up` and reached with service_request, never called as a tool of its own name."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog
from tests.conftest import json_result, run_cli
from tests.fakes.mcp_call import mcp_call

NO_MODEL = ["--model", "scripted:/nonexistent.json", "--registry", "local", "--offline"]  # a cached answer needs none


def catalogue(tmp_path: Path, name: str, need: str, kind: str) -> None:
    """`name` in the catalog for `need`, as a craft leaves a tool or a service (no build: nothing runs it here; its
    store path a directory, as the catalog answers a need only while that exists)."""
    flake, store = tmp_path / f"flake-{name}", tmp_path / f"store-{name}"
    flake.mkdir()
    store.mkdir()
    manifest = {"name": name, "kind": kind, "summary": f"a {kind}", "usage": name, "nix_run": f"nix run .#{name}"}
    Catalog.open(config.load()).add(
        name, need=need, flake_dir=flake, manifest=manifest, usage_md=f"# {name}\n", store_path=str(store),
        run_id="r1", origin={},
    )  # fmt: skip


@pytest.mark.parametrize("wait", [True, False], ids=["followed", "detached"])
def test_a_crafted_service_says_it_is_a_service_started_with_service_up(tmp_path: Path, wait: bool) -> None:
    catalogue(tmp_path, "kv-store", "need a key-value store over HTTP", "service")
    start = {"mcp_tool": "service_up", "arguments": {"service": "kv-store"}, "cli": "flakebot up kv-store"}
    reach = {"mcp_tool": "service_request", "arguments": {"service": "kv-store"}}

    shown = json_result(run_cli("craft", "--service", "need a key-value store over HTTP", *NO_MODEL, "--json"))
    assert (shown["status"], shown["kind"], shown["start"], shown["reach"]) == ("cached", "service", start, reach)
    assert "call" not in shown  # nothing tells a caller to run it as a tool

    need = {"need": "need a key-value store over HTTP", "service": True, "registry": "local", "wait": wait}
    answer = mcp_call("craft", {**need, "model": "scripted:/nonexistent.json"})
    assert (answer["ok"], answer["status"], answer["kind"], answer["reach"]) == (True, "cached", "service", reach)
    assert answer["start"] == {**start, "nix_run": "nix run .#kv-store"} and "call" not in answer


def test_a_crafted_tool_says_it_is_a_tool_called_by_its_name(tmp_path: Path) -> None:
    catalogue(tmp_path, "shout", "upper-case my input", "tool")
    call = {"mcp_tool": "shout", "cli": "flakebot run shout -- ARGS"}

    shown = json_result(run_cli("craft", "upper-case my input", *NO_MODEL, "--json"))
    assert (shown["status"], shown["kind"], shown["call"]) == ("cached", "tool", call)
    assert "start" not in shown and "reach" not in shown

    answer = mcp_call("craft", {"need": "upper-case my input", "model": "scripted:/nonexistent.json", "wait": True})
    assert (answer["status"], answer["kind"], answer["call"]) == (
        "cached",
        "tool",
        {**call, "nix_run": "nix run .#shout"},
    )
