"""The run's model for a stage: one transcript and one budget carried across stages and resumes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from flakebot.llm.base import Model
from flakebot.llm.budget import Budget
from flakebot.llm.transcript import Transcript
from flakebot.pipeline.engine import StageContext

logger = logging.getLogger(__name__)


def run_budget(ctx: StageContext) -> Budget:
    """The run's budget: the settings' limits, with what earlier stages (and attempts) already spent."""
    return Budget.from_settings(ctx.settings, spent=ctx.run.state.get("usage") or None)


@contextmanager
def stage_model(ctx: StageContext, budget: Budget | None = None) -> Iterator[Model]:
    """The run's model for this stage: transcript in the run, charging `budget` (default: run_budget(ctx)),
    whose spending is saved in the run's state when the stage is done with the model."""
    from flakebot.llm.providers import resolve_model

    budget = budget or run_budget(ctx)
    transcript = Transcript(ctx.run.transcript_path)
    model = resolve_model(ctx.request.model, ctx.settings, stage=ctx.stage, transcript=transcript, budget=budget)
    try:
        yield model
    finally:
        model.close()
        ctx.run.state["usage"] = budget.spent.to_dict()
        ctx.run.save(durable=False)  # the stage's own end (finished or failed) saves it durably
