"""The spec stage of the craft pipeline: from `--spec FILE` or from the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flakebot.pipeline import StageContext
from flakebot.spec import Reuse, ToolSpec, load_spec_file, spec_from_model
from flakebot.templates import render


def spec_stage(ctx: StageContext) -> dict[str, Any]:
    spec_file = ctx.options.get("spec_file")
    if spec_file:
        spec = load_spec_file(Path(spec_file))
        source = f"file {spec_file}"
    else:
        from flakebot.craft import stage_model

        existing = [] if ctx.options.get("fresh") else _catalogued(ctx)
        with stage_model(ctx) as model:
            answer = spec_from_model(model, ctx.run.state["need"], render("prompts/spec.j2"), existing=existing)
        if isinstance(answer, Reuse):
            ctx.progress(f"reusing catalogued {answer.name}: {answer.reason}")
            return {"reuse": answer.name, "reason": answer.reason, "name": answer.name, "end_run": True}
        spec, source = answer, "model"
    ctx.progress(f"{spec.name}: {spec.summary} ({len(spec.examples)} examples, from {source})")
    return {**spec.to_dict(), "source": source}


def _catalogued(ctx: StageContext) -> list[dict[str, Any]]:
    from flakebot.deliver.catalog import Catalog

    return [entry for entry in Catalog.open(ctx.settings).tools().values() if Path(entry.get("store_path", "/nonexistent")).exists()]


def spec_of(ctx: StageContext) -> ToolSpec:
    """The run's ToolSpec, as the spec stage stored it."""
    return ToolSpec.from_dict(ctx.output("spec"))
