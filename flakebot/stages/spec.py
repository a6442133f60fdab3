"""The spec stage of the craft pipeline: a need in plain words -> a ToolSpec (flakebot/toolspec.py, the data type and
its checks), from `--spec FILE` or from the model.

The model answers with submit_spec (name, summary, examples) or reject_need, or use_existing when a
catalogued tool already meets the need; each tool is declared by the function of its name (flakebot.toolschema).
For `flakebot improve` it answers with submit_improvement: the new examples beside the tool's kept ones
(toolspec.improved_spec).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from flakebot.errors import SpecError, UsageError
from flakebot.modeltext import quoted
from flakebot.pipeline.engine import StageContext
from flakebot.pipeline.request import Improvement
from flakebot.render import render
from flakebot.services.lifecycle import Exchange
from flakebot.stages.outputs import SpecOut
from flakebot.toolschema import declare
from flakebot.toolspec import Example, ToolSpec, improved_spec, improvement_from_file, load_spec_file

T = TypeVar("T")


def spec_stage(ctx: StageContext) -> SpecOut:
    if ctx.request.improve:
        return _improvement(ctx, ctx.request.improve)
    spec_file = ctx.request.spec_file
    if ctx.request.service:
        spec, source = _service_spec(ctx)
    elif spec_file:
        spec = load_spec_file(Path(spec_file))
        source = f"file {spec_file}"
    else:
        from flakebot.pipeline.models import stage_model

        existing = [] if ctx.request.fresh else _catalogued(ctx)
        with stage_model(ctx) as model:
            answer = spec_from_model(model, ctx.request.need, render("prompts/spec.j2"), existing=existing)
        if isinstance(answer, Reuse):
            ctx.progress(f"reusing catalogued {answer.name}: {quoted(answer.reason)}")
            return SpecOut(name=answer.name, reuse=answer.name, reason=answer.reason, end_run=True)
        spec, source = answer, "model"
    spec = _named(ctx, spec)
    if spec.service:
        lives = spec.service["examples"]
        ctx.progress(
            f"{spec.name} (service): summary {quoted(spec.summary)}, {len(lives['first'])} requests, "
            f"{len(lives['after_restart'])} after a restart, from {source}"
        )
    else:
        ctx.progress(f"{spec.name}: summary {quoted(spec.summary)}, {len(spec.examples)} examples, from {source}")
    return SpecOut.of(spec, source)


def _service_spec(ctx: StageContext) -> tuple[ToolSpec, str]:
    """craft --service: the spec (name, summary, the service's declaration and lifecycle examples) from --spec FILE
    (a "service" part beside name and summary) or from the model's submit_service_spec."""
    from flakebot.services.crafting import load_service_spec

    spec_file = ctx.request.spec_file
    if spec_file:
        return load_service_spec(Path(spec_file)), f"file {spec_file}"
    from flakebot.pipeline.models import stage_model

    with stage_model(ctx) as model:
        return service_spec_from_model(model, ctx.request.need, render("prompts/service_spec.j2")), "model"


def _improvement(ctx: StageContext, improve: Improvement) -> SpecOut:
    """improve: the tool's current examples kept, new ones for the request (from --spec FILE or the model)."""
    kept = ToolSpec.from_dict(improve.kept_spec, source=f"{improve.tool}@{improve.from_version}")
    spec_file = ctx.request.spec_file
    if spec_file:
        spec, source = improvement_from_file(kept, Path(spec_file)), f"file {spec_file}"
    else:
        from flakebot.pipeline.models import stage_model

        with stage_model(ctx) as model:
            spec = improvement_from_model(model, kept, improve.request, render("prompts/improve.j2"))
        source = "model"
    added = len(spec.examples) - spec.inherited_examples
    ctx.progress(
        f"{spec.name} {improve.version}: summary {quoted(spec.summary)}, {spec.inherited_examples} examples kept from "
        f"{improve.from_version}, {added} new, from {source}"
    )
    return SpecOut.of(spec, source)


def _named(ctx: StageContext, spec: ToolSpec) -> ToolSpec:
    """The tool's name: --name when given (checked before the run); else the spec's, or its first free
    variant when the catalog holds that name for another need: a tool never silently replaces another."""
    from flakebot.deliver.catalog import Catalog, show_tool

    if ctx.request.name:
        return dataclasses.replace(spec, name=ctx.request.name)
    catalog = Catalog.open(ctx.settings)
    free = catalog.free_name(spec.name, ctx.request.need)
    taken = catalog.tools()
    kind = "service" if spec.service else "tool"
    if free in taken and show_tool(free, ctx.settings)["manifest"].get("kind", "tool") != kind:
        # the same need crafted as the other kind: never its next version (a service is not a tool's upgrade)
        free = next(name for name in (f"{spec.name}-{n}" for n in range(2, 1000)) if name not in taken)
    if free != spec.name:
        ctx.progress(
            f"the name {spec.name} is taken by a tool crafted for another need; this tool is {free}", notice=True
        )
    return dataclasses.replace(spec, name=free)


def _catalogued(ctx: StageContext) -> list[dict[str, Any]]:
    from flakebot.deliver.catalog import Catalog

    return [
        entry
        for entry in Catalog.open(ctx.settings).tools().values()
        if Path(entry.get("store_path", "/nonexistent")).exists()
    ]


def submit_spec(name: str, summary: str, usage: str, examples: list[Example], search_query: str = "") -> None:
    """Describe the command-line tool that meets the need, with 3 to 6 acceptance examples.

    name: binary name, kebab-case, e.g. csv-dedup
    summary: one line: what the tool does
    usage: the command-line shape, e.g. 'csv-dedup [--key COL] [FILE]'
    search_query: a few keywords to find a Rust crate to start from
    """


def reject_need(reason: str) -> None:
    """Refuse a need that is empty, nonsensical or not a command-line tool, saying why."""


def use_existing(name: str, reason: str) -> None:
    """Reuse a tool flakebot already crafted when it meets the need exactly."""


SUBMIT_SPEC = declare(submit_spec, closed=False, params={"examples": {"minItems": 3, "maxItems": 6}}).schema()
REJECT_NEED = declare(reject_need, closed=False).schema()


def use_existing_tool(existing: list[dict[str, Any]]) -> dict[str, Any]:
    """The tool offered when the catalog already holds tools: reuse one instead of crafting anew."""
    return declare(use_existing, closed=False, params={"name": {"enum": [e["name"] for e in existing]}}).schema()


@dataclass
class Reuse:
    """The model's judgement that a catalogued tool already meets the need."""

    name: str
    reason: str


def spec_from_model(
    model: Any, need: str, system_prompt: str, attempts: int = 3, existing: list[dict[str, Any]] | None = None
) -> ToolSpec | Reuse:
    """Ask the model for a spec (or, given `existing` catalogued tools, which one to reuse); retry with the
    exact problem when its answer is unusable."""
    prompt = f"Need: {need}"
    tools = [SUBMIT_SPEC, REJECT_NEED]
    if existing:
        listing = "\n".join(
            f"- {e['name']}: {e.get('summary', '')} (crafted for: {e.get('need', '')})" for e in existing
        )
        prompt += f"\n\nTools already crafted (call use_existing if one of them meets the need exactly):\n{listing}"
        tools.append(use_existing_tool(existing))
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}, {"role": "user", "content": prompt}]

    def decide(call: Any) -> ToolSpec | Reuse:
        if call.name == "use_existing" and existing and call.arguments.get("name") in {e["name"] for e in existing}:
            return Reuse(str(call.arguments["name"]), str(call.arguments.get("reason", "")))
        if call.name == "reject_need":
            reason = str(call.arguments.get("reason", "")).strip() or "no reason given"
            raise SpecError(
                f"the model declined the need: {quoted(reason)}",
                fix="describe a command-line tool: what goes in, what comes out",
            )
        problem = call.error or _spec_problem(call.arguments)
        if problem is not None:
            raise Unusable(f"error: {problem}. Call submit_spec again, corrected.")
        return ToolSpec.from_dict(call.arguments)

    answer = ask_until_usable(
        model, messages, tools, decide, attempts=attempts, reminder="Answer by calling submit_spec or reject_need."
    )
    if answer is None:
        raise SpecError(
            f"no usable spec after {attempts} attempts", fix="write the spec yourself and pass it with --spec FILE"
        )
    return answer


def submit_service_spec(
    name: str,
    summary: str,
    first: list[Exchange],
    after_restart: list[Exchange],
    protocol: str = "http",
    port_env: str = "PORT",
    health: str = "/health",
    stop_grace_s: float = 10.0,
    start_s: float = 30.0,
    search_query: str = "",
) -> None:
    """Describe the long-running service that meets the need, and the requests that check its whole lifecycle.

    name: binary name, kebab-case, e.g. kv-store
    summary: one line: what the service does
    first: requests sent in order after its first start, each with the EXACT status and body (body_out) expected, and the headers its answer must carry (headers_out: names in any case, values compared exactly, other headers allowed)
    after_restart: requests sent after a SIGTERM and a second start on the same state directory: what must survive
    protocol: http (the only one)
    port_env: the environment variable giving the port to listen on (127.0.0.1)
    health: the HTTP path that answers 2xx when the service is ready, or tcp (a connect)
    stop_grace_s: seconds within which it must exit 0 after SIGTERM
    start_s: seconds within which it must become healthy
    search_query: a few keywords to find a Rust crate to start from
    """


SUBMIT_SERVICE_SPEC = declare(
    submit_service_spec,
    closed=False,
    params={"first": {"minItems": 1, "maxItems": 12}, "after_restart": {"minItems": 1, "maxItems": 12},
            "protocol": {"enum": ["http"]}},
).schema()  # fmt: skip


def service_spec_from_model(model: Any, need: str, system_prompt: str, attempts: int = 3) -> ToolSpec:
    """Ask the model for a service's spec; retry with the exact problem when its answer is unusable."""
    from flakebot.services.crafting import from_answer

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": f"Need (a service): {need}"},
    ]

    def decide(call: Any) -> ToolSpec:
        if call.name == "reject_need":
            reason = str(call.arguments.get("reason", "")).strip() or "no reason given"
            raise SpecError(
                f"the model declined the need: {quoted(reason)}",
                fix="describe a service: what it is asked over HTTP, what it answers, what it keeps",
            )
        again = "Call submit_service_spec again, corrected."
        if call.error:
            raise Unusable(f"error: {call.error}. {again}")
        try:
            service = from_answer(call.arguments)
            return ToolSpec.from_dict(
                {**call.arguments, "usage": "", "examples": [], "service": service}, "submit_service_spec"
            )
        except (SpecError, UsageError) as exc:
            raise Unusable(f"error: {exc.message}. Fix: {exc.fix}. {again}") from None
        except (TypeError, ValueError) as exc:
            raise Unusable(f"error: {exc}. {again}") from None

    answer = ask_until_usable(
        model,
        messages,
        [SUBMIT_SERVICE_SPEC, REJECT_NEED],
        decide,
        attempts=attempts,
        reminder="Answer by calling submit_service_spec or reject_need.",
    )
    if answer is None:
        raise SpecError(
            f"no usable service spec after {attempts} attempts",
            fix="write the spec yourself (name, summary, service) and pass it with --spec FILE",
        )
    return answer


class Unusable(Exception):
    """A tool call the model must make again: the text is what it is told (as the call's tool result)."""


def ask_until_usable(
    model: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    decide: Callable[[Any], T],
    *,
    attempts: int,
    reminder: str,
) -> T | None:
    """Ask `model` until `decide(first tool call)` accepts an answer (it raises Unusable to ask again, or a
    FlakebotError to end); a reply without a tool call gets `reminder`. None after `attempts` unusable replies."""
    for _ in range(attempts):
        reply = model.complete(messages, tools)
        messages.append(reply.to_message())
        call = reply.tool_calls[0] if reply.tool_calls else None
        if call is None:
            messages.append({"role": "user", "content": reminder})
            continue
        try:
            return decide(call)
        except Unusable as exc:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(exc)})
    return None


def _spec_problem(arguments: dict[str, Any]) -> str | None:
    try:
        ToolSpec.from_dict(arguments)
    except SpecError as exc:
        return exc.message
    return None


# ------------------------------------------------------------------ improve: the next version


def submit_improvement(summary: str, usage: str, examples: list[Example]) -> None:
    """Describe the improved tool: its new one-line summary and usage line, and 1 to 6 NEW acceptance examples for
    the requested change. The current examples are kept as they are; do not repeat them.

    summary: one line: what the tool does
    usage: the command-line shape, e.g. 'csv-dedup [--key COL] [FILE]'
    """


SUBMIT_IMPROVEMENT = declare(
    submit_improvement, closed=False, params={"examples": {"minItems": 1, "maxItems": 6}}
).schema()


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
                f"the model declined the improvement: {quoted(reason)}",
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
