"""Scripts for the stub server: recorded or hand-written assistant turns, per stage (format in docs/scripts.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakebot.errors import ModelError

SCRIPT_FORMAT = 1
SCRIPT_KEYS = {"format", "sdk", "model", "price", "stages", "turns", "description"}
TURN_KEYS = {"content", "tool_calls", "expect", "fault", "usage", "response", "status", "finish_reason", "note"}
EXPECT_KEYS = {"last_tool_result_contains", "last_user_contains", "last_message_contains", "tools_include"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "cached_tokens"}
# Fault kind -> keys it may carry besides "kind".
FAULTS: dict[str, set[str]] = {
    "429": {"retry_after"},
    "500": {"retry_after"},
    "tool_use_failed": {"failed_generation", "message"},
    "context_overflow": {"message"},
    "reset": set(),
    "malformed_json": set(),
    "slow": {"seconds"},
}
SDKS = ("openai", "groq")
DOCS = "see docs/scripts.md for the script format"


@dataclass
class Script:
    """The turns one stub server replays, and how the scripted model talks to it."""

    turns: list[dict[str, Any]]
    sdk: str = "openai"
    model: str = "scripted"
    price: dict[str, float] = field(default_factory=lambda: {"input": 0.0, "output": 0.0})
    source: str = "<script>"


class ScriptError(ModelError):
    """A script that does not parse or does not fit the format."""


def load_script(path: Path | str, stage: str | None = None) -> Script:
    """Read and validate a script file; with `stage`, serve that stage's turns (else the flat "turns")."""
    return parse_script(read_script(path), str(path), stage)


def check_script(path: Path | str) -> None:
    """Validate every stage and turn of a script file, without choosing a stage."""
    validate(read_script(path), str(path))


def read_script(path: Path | str) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScriptError(
            f"cannot read model script {path}: {exc.strerror}", fix="pass an existing file: --model scripted:FILE"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScriptError(
            f"model script {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            fix=f"correct {path}; {DOCS}",
        ) from None


def parse_script(data: Any, source: str = "<script>", stage: str | None = None) -> Script:
    """Validate script data (every stage, not only the one served) and select the turns for `stage`."""
    validate(data, source)
    price = data.get("price", {"input": 0.0, "output": 0.0})
    return Script(_select(data, stage, source), data.get("sdk", "openai"), data.get("model", "scripted"), price, source)


def validate(data: Any, source: str) -> None:
    """Raise ScriptError naming the first problem anywhere in the script."""
    _check(isinstance(data, dict), source, "", "the top level must be a JSON object")
    _check_keys(data, SCRIPT_KEYS, source, "")
    _check(data.get("format", SCRIPT_FORMAT) == SCRIPT_FORMAT, source, "format", f"must be {SCRIPT_FORMAT}")
    _check("stages" in data or "turns" in data, source, "", 'needs "turns" or "stages"')
    stages = data.get("stages", {})
    _check(isinstance(stages, dict), source, "stages", "must map stage names to lists of turns")
    for name, turns in stages.items():
        _check_turns(turns, source, f"stages.{name}")
    if "turns" in data:
        _check_turns(data["turns"], source, "turns")
    _check(data.get("sdk", "openai") in SDKS, source, "sdk", f"must be one of {', '.join(SDKS)}")
    _check(isinstance(data.get("model", "scripted"), str), source, "model", "must be a string")
    _check(
        _is_price(data.get("price", {"input": 0.0, "output": 0.0})),
        source,
        "price",
        'must be {"input": USD, "output": USD} per 1M tokens',
    )


def _select(data: dict[str, Any], stage: str | None, source: str) -> list[dict[str, Any]]:
    stages = data.get("stages", {})
    if stage is not None and stage in stages:
        return list(stages[stage])
    if "turns" in data:
        return list(data["turns"])
    names = ", ".join(stages) or "none"
    if stage is None:
        problem = f"model script {source} has only per-stage turns ({names}) and no stage was named"
        raise ScriptError(problem, fix='name a stage (--stage NAME for the stub server) or add a flat "turns" list')
    raise ScriptError(
        f"model script {source} has no turns for stage '{stage}' (stages: {names})",
        fix=f'add "stages": {{"{stage}": [...]}} to {source}',
    )


def _check_turns(turns: Any, source: str, where: str) -> None:
    _check(isinstance(turns, list), source, where, "must be a list of turns")
    for i, turn in enumerate(turns):
        check_turn(turn, source, f"{where}[{i}]")


def check_turn(turn: Any, source: str, where: str) -> None:
    """Raise ScriptError naming the first problem with one turn."""
    _check(isinstance(turn, dict), source, where, "must be an object")
    _check_keys(turn, TURN_KEYS, source, where)
    _check(
        any(k in turn for k in ("content", "tool_calls", "fault", "response")),
        source,
        where,
        'needs "content", "tool_calls", "fault" or "response"',
    )
    _check(isinstance(turn.get("content", ""), str | None), source, f"{where}.content", "must be a string")
    for i, call in enumerate(turn.get("tool_calls", [])):
        _check_tool_call(call, source, f"{where}.tool_calls[{i}]")
    if "fault" in turn:
        _check_fault(turn["fault"], source, f"{where}.fault")
    expect = turn.get("expect", {})
    _check(isinstance(expect, dict), source, f"{where}.expect", "must be an object")
    _check_keys(expect, EXPECT_KEYS, source, f"{where}.expect")
    usage = turn.get("usage", {})
    _check(
        isinstance(usage, dict) and all(isinstance(v, int) for v in usage.values()),
        source,
        f"{where}.usage",
        "must map token kinds to integers",
    )
    _check_keys(usage, USAGE_KEYS, source, f"{where}.usage")
    if "response" in turn:
        _check(isinstance(turn["response"], dict), source, f"{where}.response", "must be the JSON body to send")


def _check_tool_call(call: Any, source: str, where: str) -> None:
    _check(
        isinstance(call, dict) and isinstance(call.get("name"), str),
        source,
        where,
        'must be {"name": ..., "arguments": {...}}',
    )
    # A string is sent verbatim, so a script can send arguments that are not valid JSON.
    _check(
        isinstance(call.get("arguments", {}), dict | str),
        source,
        f"{where}.arguments",
        "must be an object (or a raw string)",
    )


def _check_fault(fault: Any, source: str, where: str) -> None:
    _check(
        isinstance(fault, dict) and str(fault.get("kind")) in FAULTS,
        source,
        where,
        f'must be {{"kind": one of {", ".join(FAULTS)}}}',
    )
    _check_keys(fault, FAULTS[str(fault["kind"])] | {"kind"}, source, where)
    if str(fault["kind"]) == "slow":
        _check(isinstance(fault.get("seconds"), int | float), source, f"{where}.seconds", "must be a number")


def _is_price(price: Any) -> bool:
    return (
        isinstance(price, dict)
        and {"input", "output"} <= set(price)
        and all(isinstance(v, int | float) for v in price.values())
    )


def _check_keys(data: dict[str, Any], allowed: set[str], source: str, where: str) -> None:
    unknown = sorted(set(data) - allowed)
    _check(not unknown, source, where, f"unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def _check(ok: bool, source: str, where: str, problem: str) -> None:
    if not ok:
        place = f" at {where}" if where else ""
        raise ScriptError(f"model script {source} is not valid{place}: {problem}", fix=DOCS)
