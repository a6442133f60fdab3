"""The run's model for a stage: one transcript and one budget carried across stages and resumes."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flakebot.pipeline.engine import StageContext

logger = logging.getLogger(__name__)


@contextmanager
def stage_model(ctx: StageContext) -> Iterator[Any]:
    """The run's model for this stage: transcript in the run, one budget carried across stages and resumes."""
    from flakebot.llm.budget import Budget
    from flakebot.llm.providers import resolve_model
    from flakebot.llm.transcript import Transcript

    budget = Budget.from_settings(ctx.settings, spent=ctx.run.state.get("usage") or None)
    transcript = Transcript(ctx.run.transcript_path)
    model = resolve_model(ctx.options.get("model"), ctx.settings, stage=ctx.stage, transcript=transcript, budget=budget)
    try:
        yield model
    finally:
        model.close()
        ctx.run.state["usage"] = budget.spent.to_dict()
        ctx.run.save()
