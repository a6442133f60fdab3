"""The price table (flakebot/data/prices.json, USD per 1M tokens) and the cost of one reply."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from flakebot.llm.base import Usage

Price = dict[str, float]  # {"input": ..., "output": ..., "cached_input": ...} per 1M tokens


@cache
def table() -> dict[str, Any]:
    """The shipped price table."""
    prices: dict[str, Any] = json.loads(resources.files("flakebot").joinpath("data/prices.json").read_text())
    return prices


def price_for(provider: str, model: str) -> Price | None:
    """The price of provider:model; dated variants ("gpt-4.1-mini-2025-04-14") use their base model's price."""
    models = table()["providers"].get(provider, {})
    if model in models:
        return dict(models[model])
    prefixes = [name for name in models if name != "*" and model.startswith(name + "-")]
    if prefixes:
        return dict(models[max(prefixes, key=len)])
    return dict(models["*"]) if "*" in models else None


def cost(price: Price | None, usage: Usage) -> float | None:
    """USD for `usage` at `price`; None when the price is unknown."""
    if price is None:
        return None
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    total = (
        (usage.prompt_tokens - cached) * price["input"]
        + cached * price.get("cached_input", price["input"])
        + usage.completion_tokens * price["output"]
    )
    return total / 1_000_000
