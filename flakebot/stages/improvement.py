"""`flakebot improve TOOL "also support X"`: the spec of a tool's next version.

The new version keeps every acceptance example of the version it starts from (users rely on them) and adds
the new ones the spec model (or `--spec FILE`) gives for the request. A new example with the same input as
a kept one but another expected output would change what the tool already promised: it is refused, and the
model is told which example it contradicts.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

from flakebot.errors import SpecError, UsageError
from flakebot.stages.spec import REJECT_NEED, SUBMIT_SPEC, Unusable, ask_until_usable
from flakebot.toolspec import Example, ToolSpec


def _submit_improvement() -> dict[str, Any]:
    """submit_spec without the name (the tool keeps it), asking for the new examples only."""
    tool: dict[str, Any] = copy.deepcopy(SUBMIT_SPEC)
    function: dict[str, Any] = tool["function"]
    function["name"] = "submit_improvement"
    function["description"] = (
        "Describe the improved tool: its new one-line summary and usage line, and 1 to 6 NEW acceptance examples "
        "for the requested change. The current examples are kept as they are; do not repeat them."
    )
    parameters = function["parameters"]
    del parameters["properties"]["name"]
    del parameters["properties"]["search_query"]
    parameters["properties"]["examples"]["minItems"] = 1
    parameters["required"] = ["summary", "usage", "examples"]
    return tool


SUBMIT_IMPROVEMENT = _submit_improvement()


def improved_spec(kept: ToolSpec, answer: dict[str, Any], source: str = "improvement") -> ToolSpec:
    """The next version's spec: `kept`'s examples first (unchanged), then the answer's new ones."""
    try:
        added = [
            Example(**{k: v for k, v in e.items() if k in Example.__dataclass_fields__}) for e in answer["examples"]
        ]
    except (KeyError, TypeError) as exc:
        raise SpecError(
            f"{source}: missing or malformed field {exc}", fix="give summary, usage and 1-6 new examples"
        ) from None
    spec = ToolSpec.from_dict(
        {
            "name": kept.name,
            "summary": str(answer.get("summary") or kept.summary),
            "usage": str(answer.get("usage") or kept.usage),
            "search_query": kept.search_query,
            "examples": [vars(e) for e in [*kept.examples, *added]],
            "inherited_examples": len(kept.examples),
        },
        source,
    )
    contradiction = _contradiction(kept.examples, added)
    if contradiction:
        raise SpecError(
            f"{source}: {contradiction}", fix="keep the current examples as they are; add only new behaviour"
        )
    return spec


def _contradiction(kept: list[Example], added: list[Example]) -> str:
    """A new example with a kept example's exact input but another expected result, if any."""
    for n, example in enumerate(added, 1):
        for m, old in enumerate(kept, 1):
            same_input = (old.args, old.stdin, old.files) == (example.args, example.stdin, example.files)
            if same_input and (old.stdout, old.exit_code) != (example.stdout, example.exit_code):
                return (
                    f"new example {n} has the input of kept example {m} but expects another result; the current "
                    "version's examples cannot change"
                )
    return ""


def improvement_from_file(kept: ToolSpec, path: Path) -> ToolSpec:
    """`improve --spec FILE`: JSON or TOML with summary, usage and the new examples (a name, if given, must be the tool's)."""
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except OSError as exc:
        raise UsageError(
            f"cannot read spec file {path}: {exc.strerror}", fix="pass --spec with a readable file"
        ) from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"spec file {path} does not parse ({exc})", fix="fix the JSON/TOML syntax") from None
    if data.get("name", kept.name) != kept.name:
        raise UsageError(
            f"spec file {path} names the tool {data['name']}, but this improves {kept.name}",
            fix="leave the name out of an improvement's spec (the tool keeps its name)",
        )
    return improved_spec(kept, data, source=str(path))


def improvement_from_model(model: Any, kept: ToolSpec, request: str, system_prompt: str, attempts: int = 3) -> ToolSpec:
    """Ask the spec model for the improvement's summary, usage and new examples; retry with the exact problem."""
    current = {"summary": kept.summary, "usage": kept.usage, "examples": [vars(e) for e in kept.examples]}
    prompt = (
        f"Tool: {kept.name}\nCurrent version (its examples are kept as they are):\n{json.dumps(current, indent=1)}\n\n"
        f"Requested change: {request}"
    )
    tools = [SUBMIT_IMPROVEMENT, REJECT_NEED]
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]

    def decide(call: Any) -> ToolSpec:
        if call.name == "reject_need":
            reason = str(call.arguments.get("reason", "")).strip() or "no reason given"
            raise SpecError(
                f"the model declined the improvement: {reason}",
                fix="describe the change in terms of the tool's command line: a new option, input or output",
            )
        again = "Call submit_improvement again, corrected."
        if call.error:
            raise Unusable(f"error: {call.error}. {again}")
        try:
            return improved_spec(kept, call.arguments)
        except SpecError as exc:
            raise Unusable(f"error: {exc.message}. {again}") from None

    answer = ask_until_usable(
        model,
        messages,
        tools,
        decide,
        attempts=attempts,
        reminder="Answer by calling submit_improvement or reject_need.",
    )
    if answer is None:
        raise SpecError(
            f"no usable improvement spec after {attempts} attempts",
            fix="write the new examples yourself and pass them with --spec FILE",
        )
    return answer
