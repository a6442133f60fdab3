"""The spec stage: a need in plain words -> a ToolSpec, and the ToolSpec -> a frozen acceptance test.

The model answers through one of two tools: `submit_spec` (name, summary, usage, 3-6 examples)
or `reject_need` (the need is empty or makes no sense; its explanation ends the craft cleanly).
`--spec FILE` supplies the spec instead (JSON or TOML of the same shape).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flakebot.errors import SpecError, UsageError

logger = logging.getLogger(__name__)

ACCEPTANCE_TEST = "tests/flakebot_acceptance.rs"
NAME_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


@dataclass
class Example:
    """One acceptance example: run the tool with these inputs, expect this output."""

    args: list[str]
    stdout: str
    exit_code: int = 0
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)
    description: str = ""


@dataclass
class ToolSpec:
    """What the tool is: its binary name, what it does, how it is called, and how to check it."""

    name: str
    summary: str
    usage: str
    examples: list[Example]
    search_query: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "spec") -> ToolSpec:
        try:
            examples = [Example(**{k: v for k, v in e.items() if k in Example.__dataclass_fields__}) for e in data["examples"]]
            spec = cls(
                name=str(data["name"]),
                summary=str(data["summary"]),
                usage=str(data.get("usage", "")),
                examples=examples,
                search_query=str(data.get("search_query", "")),
            )
        except (KeyError, TypeError) as exc:
            raise SpecError(f"{source}: missing or malformed field {exc}", fix="give name, summary, usage and 3-6 examples (args, stdout, exit_code)") from None
        problems = spec.problems()
        if problems:
            raise SpecError(f"{source}: {'; '.join(problems)}", fix="correct the spec")
        return spec

    def problems(self) -> list[str]:
        """What makes this spec unusable, if anything."""
        found = []
        if not NAME_RE.match(self.name):
            found.append(f"name '{self.name}' is not kebab-case (like csv-dedup)")
        if not 3 <= len(self.examples) <= 6:
            found.append(f"{len(self.examples)} examples given; 3 to 6 are needed")
        for i, example in enumerate(self.examples, 1):
            if not isinstance(example.args, list) or not all(isinstance(a, str) for a in example.args):
                found.append(f"example {i}: args must be a list of strings")
            if any(Path(name).is_absolute() or ".." in Path(name).parts for name in example.files):
                found.append(f"example {i}: file names must be relative")
        return found


SUBMIT_SPEC = {
    "type": "function",
    "function": {
        "name": "submit_spec",
        "description": "Describe the command-line tool that meets the need, with 3 to 6 acceptance examples.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "binary name, kebab-case, e.g. csv-dedup"},
                "summary": {"type": "string", "description": "one line: what the tool does"},
                "usage": {"type": "string", "description": "the command-line shape, e.g. 'csv-dedup [--key COL] [FILE]'"},
                "search_query": {"type": "string", "description": "a few keywords to find a Rust crate to start from"},
                "examples": {
                    "type": "array",
                    "minItems": 3,
                    "maxItems": 6,
                    "items": {
                        "type": "object",
                        "properties": {
                            "description": {"type": "string"},
                            "args": {"type": "array", "items": {"type": "string"}},
                            "stdin": {"type": "string"},
                            "files": {"type": "object", "additionalProperties": {"type": "string"}, "description": "files created in the working directory"},
                            "stdout": {"type": "string", "description": "exact expected standard output"},
                            "exit_code": {"type": "integer"},
                        },
                        "required": ["args", "stdout", "exit_code"],
                    },
                },
            },
            "required": ["name", "summary", "usage", "examples"],
        },
    },
}
REJECT_NEED = {
    "type": "function",
    "function": {
        "name": "reject_need",
        "description": "Refuse a need that is empty, nonsensical or not a command-line tool, saying why.",
        "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}, "required": ["reason"]},
    },
}


def load_spec_file(path: Path) -> ToolSpec:
    """A spec supplied by a person or agent (JSON or TOML)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read spec file {path}: {exc.strerror}", fix="pass --spec with a readable JSON or TOML file") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"spec file {path} does not parse ({exc})", fix="fix the JSON/TOML syntax") from None
    return ToolSpec.from_dict(data, source=str(path))


def use_existing_tool(existing: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool offered when the catalog already holds tools: reuse one instead of crafting anew."""
    return {
        "type": "function",
        "function": {
            "name": "use_existing",
            "description": "Reuse a tool flakebot already crafted when it meets the need exactly.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [e["name"] for e in existing]}, "reason": {"type": "string"}},
                "required": ["name", "reason"],
            },
        },
    }


@dataclass
class Reuse:
    """The model's judgement that a catalogued tool already meets the need."""

    name: str
    reason: str


def spec_from_model(model: Any, need: str, system_prompt: str, attempts: int = 3, existing: list[dict[str, Any]] | None = None) -> ToolSpec | Reuse:
    """Ask the model for a spec (or, given `existing` catalogued tools, which one to reuse); retry with the
    exact problem when its answer is unusable."""
    prompt = f"Need: {need}"
    tools = [SUBMIT_SPEC, REJECT_NEED]
    if existing:
        listing = "\n".join(f"- {e['name']}: {e.get('summary', '')} (crafted for: {e.get('need', '')})" for e in existing)
        prompt += f"\n\nTools already crafted (call use_existing if one of them meets the need exactly):\n{listing}"
        tools.append(use_existing_tool(existing))
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]
    for _ in range(attempts):
        reply = model.complete(messages, tools)
        messages.append(reply.to_message())
        call = reply.tool_calls[0] if reply.tool_calls else None
        if call is None:
            messages.append({"role": "user", "content": "Answer by calling submit_spec or reject_need."})
            continue
        if call.name == "use_existing" and existing and call.arguments.get("name") in {e["name"] for e in existing}:
            return Reuse(str(call.arguments["name"]), str(call.arguments.get("reason", "")))
        if call.name == "reject_need":
            reason = str(call.arguments.get("reason", "")).strip() or "no reason given"
            raise SpecError(f"the model declined the need: {reason}", fix="describe a command-line tool: what goes in, what comes out")
        problem = call.error or _spec_problem(call.arguments)
        if problem is None:
            return ToolSpec.from_dict(call.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"error: {problem}. Call submit_spec again, corrected."})
    raise SpecError(f"no usable spec after {attempts} attempts", fix="write the spec yourself and pass it with --spec FILE")


def _spec_problem(arguments: dict[str, Any]) -> str | None:
    try:
        ToolSpec.from_dict(arguments)
    except SpecError as exc:
        return exc.message
    return None


# ------------------------------------------------------------------ the acceptance test


def rust_str(text: str) -> str:
    """A Rust string literal for `text`."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
    body = "".join(escapes.get(ch, ch if ch.isprintable() else f"\\u{{{ord(ch):x}}}") for ch in text)
    return f'"{body}"'


def render_acceptance_test(spec: ToolSpec) -> str:
    """The integration test that holds the tool to its examples; frozen once written."""
    from flakebot.templates import render

    examples = [
        {
            "fn": fn,
            "description": e.description,
            "args": ", ".join(rust_str(a) for a in e.args),
            "stdin": rust_str(e.stdin),
            "files": ", ".join(f"({rust_str(k)}, {rust_str(v)})" for k, v in e.files.items()),
            "stdout": rust_str(e.stdout),
            "exit_code": e.exit_code,
        }
        for fn, e in zip(acceptance_test_names(spec), spec.examples, strict=True)
    ]
    return render("acceptance.rs.j2", name=spec.name, summary=spec.summary, examples=examples)


def acceptance_test_names(spec: ToolSpec) -> list[str]:
    """The #[test] function names of the acceptance test, one per example."""
    return [f"example_{i}_{_slug(e.description or ' '.join(e.args) or 'no_args')}" for i, e in enumerate(spec.examples, 1)]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "case"


def write_acceptance_test(spec: ToolSpec, crate_dir: Path) -> dict[str, str]:
    """Write the acceptance test into the crate; returns {relative path: sha256} to freeze."""
    path = crate_dir / ACCEPTANCE_TEST
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_acceptance_test(spec)
    path.write_text(text)
    return {ACCEPTANCE_TEST: hashlib.sha256(text.encode()).hexdigest()}
