"""The choose stage: pick the crate a tool starts from, and whether to fork it or depend on it.

The model sees the ranked candidates (description, binaries, library, licence, popularity, the
ranking's `why`) and calls `choose_crate` or `no_candidate` (declared by the functions of those names). `--crate NAME` skips the model.
"""

from __future__ import annotations

import logging
from typing import Any

from flakebot.errors import SearchError, SpecError
from flakebot.modeltext import quoted
from flakebot.pipeline.engine import StageContext
from flakebot.render import render
from flakebot.stages.outputs import ChoiceOut, SearchOut, SpecOut
from flakebot.toolschema import declare

logger = logging.getLogger(__name__)

TOP = 5
MODES = ("fork", "new")


def choose_crate(name: str, mode: str, reason: str) -> None:
    """Pick the crate the tool starts from.

    name: a crate name from the list
    reason: one sentence: why this start
    """


def no_candidate(reason: str) -> None:
    """None of the crates is a sensible start."""


CHOOSE_CRATE = declare(choose_crate, closed=False, params={"mode": {"enum": list(MODES)}}).schema()
NO_CANDIDATE = declare(no_candidate, closed=False).schema()


def choose_stage(ctx: StageContext) -> ChoiceOut:
    candidates = ctx.get(SearchOut).candidates
    wanted = ctx.request.crate
    choice: dict[str, Any]
    if ctx.request.start:  # craft --from: the caller chose; the crate is edited in place of a fork
        choice = {
            "crate": ctx.request.start,
            "mode": "fork",
            "reason": f"--from {ctx.request.from_location}",
            "by": "option",
        }
    elif wanted:
        choice = _by_option(ctx, wanted, candidates)
    elif not candidates:
        raise SearchError(
            "search found no crate to start from",
            fix="describe the need differently, or name a crate with --crate NAME",
        )
    else:
        from flakebot.pipeline.models import stage_model

        with stage_model(ctx) as model:
            choice = choose_with_model(model, ctx.get(SpecOut).to_dict(), candidates[:TOP])
    reason = choice["reason"] if choice.get("by") == "option" else quoted(choice["reason"])  # the model's, or ours
    ctx.progress(f"{choice['crate']['name'] or 'the given crate'} ({choice['mode']}): {reason}")
    return ChoiceOut.from_dict(choice)


def _by_option(ctx: StageContext, wanted: str, candidates: list[dict[str, Any]]) -> dict[str, Any]:
    crate = next((c for c in candidates if c["name"] == wanted), None)
    if crate is None:
        from flakebot.crates.registries import open_registry

        crate = open_registry(ctx.settings, ctx.request.registry).get(wanted).to_dict()
    mode = ctx.request.mode or ("fork" if crate.get("bin_names") else "new")
    return {"crate": crate, "mode": mode, "reason": f"--crate {wanted} given", "by": "option"}


def choose_with_model(
    model: Any, spec: dict[str, Any], candidates: list[dict[str, Any]], attempts: int = 3
) -> dict[str, Any]:
    """Ask the model to pick; retry with the exact problem when it names no listed crate."""
    by_name = {c["name"]: c for c in candidates}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": render("prompts/choose.j2", spec=spec, candidates=candidates)}
    ]
    for _ in range(attempts):
        reply = model.complete(messages, [CHOOSE_CRATE, NO_CANDIDATE])
        messages.append(reply.to_message())
        call = reply.tool_calls[0] if reply.tool_calls else None
        if call is not None and call.name == "no_candidate":
            reason = str(call.arguments.get("reason", "")).strip() or "no reason given"
            raise SearchError(
                f"no usable crate to start from: {quoted(reason)}",
                fix="name a crate with --crate NAME, or describe the need differently",
            )
        problem = _problem(call, by_name)
        if problem is None and call is not None:
            args = call.arguments
            logger.info("chose %s (%s): %s", args["name"], args["mode"], args.get("reason", ""))
            return {
                "crate": by_name[args["name"]],
                "mode": args["mode"],
                "reason": str(args.get("reason", "")),
                "by": "model",
            }
        messages.append(_correction(call, problem or "call choose_crate or no_candidate"))
    raise SpecError(f"the model did not choose a crate in {attempts} attempts", fix="name a crate with --crate NAME")


def _problem(call: Any, by_name: dict[str, Any]) -> str | None:
    if call is None or call.name != "choose_crate":
        return "answer by calling choose_crate or no_candidate"
    if call.error:
        error: str = call.error
        return error
    if call.arguments.get("name") not in by_name:
        return f"'{call.arguments.get('name')}' is not in the list; choose one of {', '.join(by_name)}"
    if call.arguments.get("mode") not in MODES:
        return f"mode must be one of {', '.join(MODES)}"
    return None


def _correction(call: Any, problem: str) -> dict[str, Any]:
    if call is None:
        return {"role": "user", "content": problem}
    return {"role": "tool", "tool_call_id": call.id, "content": f"error: {problem}"}
