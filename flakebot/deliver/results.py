"""The results of flakebot's long MCP tools, compact: what an agent acts on first, the rest a `show` away.

A craft's whole result (its manifest and USAGE.md) is about 12 KB, and some hosts cut a long tool result in the
middle before the model sees it (Codex does), so the JSON no longer parses. The first level of a result is what an
agent needs next: ok, status, name, version, run id, what it is (kind: a tool or a service) and the door to use it
by (a tool: its MCP tool and CLI line; a service: service_up or `flakebot up`, then service_request), its summary
and usage (the tool's own words, marked as such), and where the rest is. Every result fits RESULT_BUDGET bytes of
JSON.
"""

from __future__ import annotations

import json
from typing import Any

from flakebot.deliver.howto import how_to_use
from flakebot.modeltext import DATA_NOTE, one_line

__all__ = ["RESULT_BUDGET", "compact_result", "compact_status"]

RESULT_BUDGET = 2048  # bytes of JSON; below any host's cut (Codex keeps the first and last few KB)
CRAFTED = ("crafted", "cached", "installed")


def compact_result(result: dict[str, Any]) -> dict[str, Any]:
    """A long tool's result (craft, improve, resume: a CraftResult; package: a PackageOut) in its compact form."""
    if "manifest" in result:
        return _fitted(_craft(result))
    if "store_path" in result:
        return _fitted(_package(result))
    return _fitted(_scalars(result))


def compact_status(report: dict[str, Any]) -> dict[str, Any]:
    """`status` of a run: its stage timeline, and its result compact once it succeeded."""
    stages = [{k: s.get(k) for k in ("name", "status", "seconds")} for s in report.get("stages", [])]
    answer = {**report, "need": one_line(report.get("need", ""), 200), "stages": stages}
    if isinstance(report.get("error"), dict):  # its details (log tails) are a `show` away
        answer["error"] = {
            k: v for k, v in report["error"].items() if k in ("type", "message", "fix", "stage", "exit_code")
        }
    if isinstance(report.get("result"), dict):
        answer["result"] = compact_result(report["result"])
    return answer


def _craft(result: dict[str, Any]) -> dict[str, Any]:
    manifest = result.get("manifest") or {}
    name = str(result.get("name") or manifest.get("name") or "")
    answer: dict[str, Any] = {
        "status": result.get("status"),
        "name": name,
        "version": result.get("version") or manifest.get("version") or "",
        "run_id": result.get("run_id", ""),
    }
    if result.get("status") in CRAFTED and name:
        answer |= how_to_use(name, manifest.get("kind"), one_line(manifest.get("nix_run", ""), 400))
        answer["summary"] = one_line(manifest.get("summary", ""), 200)
        answer["usage"] = one_line(manifest.get("usage", ""), 200)
        answer["words"] = f"summary and usage: {DATA_NOTE}"
        answer["details"] = f"call show with name {name!r} for the whole manifest (examples, parameters) and USAGE.md"
    elif result.get("run_id"):
        answer["details"] = f"call show with name {result['run_id']!r} for the run's stages and outputs"
    if result.get("service"):  # a running service of this name keeps its recorded program (services/identity.py)
        answer["service"] = one_line(str(result["service"]), 400)
    usage = result.get("usage") or {}
    answer.update(seconds=result.get("seconds"), tokens=usage.get("total_tokens"), cost_usd=usage.get("cost_usd"))
    return {k: v for k, v in answer.items() if v not in (None, "")}


def _package(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("run_id", "pname", "version", "main_program", "store_path", "bin_path", "flake_ref", "nixpkgs_mode",
            "licenses", "portable", "build_seconds")  # fmt: skip
    answer = {k: result.get(k) for k in keys if result.get(k) not in (None, "")}
    argv = result.get("nix_run_argv") or []
    if argv:
        answer["nix_run"] = one_line(" ".join(map(str, argv)) + " -- ARGS", 400)
    smoke = result.get("smoke") or {}
    if smoke.get("level"):  # how far the built tool was seen to work (docs/smoke-levels.md)
        answer["smoke"] = {"level": smoke["level"], "meaning": one_line(smoke.get("meaning", ""), 200)}
    entry = result.get("catalog") or {}
    if entry.get("name"):  # package --catalog: the crate is an agent tool now
        answer |= how_to_use(entry["name"], "tool")
        answer["catalog"] = {"name": entry["name"], "version": entry.get("version", "")}
    if result.get("run_id"):
        answer["details"] = f"call show with name {result['run_id']!r} for the whole result (smoke run, licenses)"
    return answer


def _scalars(result: dict[str, Any]) -> dict[str, Any]:
    """Anything else: its short scalar fields, and where the rest is."""
    answer = {
        k: v for k, v in result.items() if (isinstance(v, (str, int, float, bool)) or _names(v)) and len(str(v)) <= 300
    }
    if result.get("run_id"):
        answer["details"] = f"call show with name {result['run_id']!r} for the run's stages and outputs"
    return answer


def _names(value: object) -> bool:
    """A short list of names (a service's needs, the dependents a start moved): kept as the scalars are."""
    return isinstance(value, list) and len(value) <= 16 and all(isinstance(v, str) and len(v) <= 64 for v in value)


def _fitted(answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` cut to fit RESULT_BUDGET (with room for the caller's `ok`): long texts shortened, then dropped."""
    for limit in (120, 60):
        if len(json.dumps(answer)) <= RESULT_BUDGET - 16:
            return answer
        answer = {k: one_line(v, limit) if isinstance(v, str) else v for k, v in answer.items()}
    keep = ("status", "name", "version", "run_id", "kind", "call", "start", "reach", "details")
    return {k: v for k, v in answer.items() if k in keep}
