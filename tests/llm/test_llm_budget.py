"""Token and cost budgets, the price table, and carrying what was spent across a resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakebot import config
from flakebot.errors import BudgetExceeded
from flakebot.llm.base import Usage
from flakebot.llm.budget import Budget
from flakebot.llm.prices import cost, price_for, table
from flakebot.llm.providers import resolve_model

ASK = [{"role": "user", "content": "hi"}]


def script(tmp_path: Path, calls: int, usage: dict[str, int], price: dict[str, float] | None = None) -> str:
    path = tmp_path / "script.json"
    path.write_text(
        json.dumps(
            {
                "turns": [{"content": f"reply {i}", "usage": usage} for i in range(calls)],
                **({"price": price} if price else {}),
            }
        )
    )
    return f"scripted:{path}"


def test_token_budget_stops_the_call_that_goes_over_and_every_later_one(tmp_path: Path) -> None:
    spec = script(tmp_path, 5, {"prompt_tokens": 80, "completion_tokens": 20})
    with resolve_model(spec, config.load({"max_tokens": 250})) as model:
        model.complete(ASK)
        model.complete(ASK)
        with pytest.raises(BudgetExceeded) as caught:
            model.complete(ASK)
        assert caught.value.message == "token budget spent: 300 of 250 tokens used" and caught.value.exit_code == 31
        assert "--max-tokens" in (caught.value.fix or "")
        with pytest.raises(BudgetExceeded):
            model.complete(ASK)
        assert len(model.server.requests) == 3  # the check before the 4th call sent nothing


def test_cost_budget_uses_the_price_and_stops_clearly(tmp_path: Path) -> None:
    spec = script(
        tmp_path, 5, {"prompt_tokens": 100, "completion_tokens": 50}, price={"input": 1000.0, "output": 2000.0}
    )
    budget = Budget(max_tokens=None, max_cost=0.45)
    with resolve_model(spec, config.load(), budget=budget) as model:
        assert model.complete(ASK).usage.cost_usd == pytest.approx(0.2)
        model.complete(ASK)
        with pytest.raises(BudgetExceeded, match=r"cost budget spent: \$0\.6000 of \$0\.4500 used"):
            model.complete(ASK)
    assert budget.spent.total_tokens == 450 and budget.spent.cost_usd == pytest.approx(0.6)


def test_spent_totals_survive_a_resume(tmp_path: Path) -> None:
    spec = script(tmp_path, 3, {"prompt_tokens": 60, "completion_tokens": 40})
    settings = config.load({"max_tokens": 200})
    first = Budget.from_settings(settings)
    with resolve_model(spec, settings, budget=first) as model:
        model.complete(ASK)
        model.complete(ASK)
    saved = json.loads(json.dumps(first.to_dict()))  # as run state keeps it
    resumed = Budget.from_settings(settings, spent=saved["spent"])
    assert resumed.spent == Usage(120, 80, 0, 0.0)
    with (
        resolve_model(spec, settings, budget=resumed) as model,
        pytest.raises(BudgetExceeded, match="200 of 200 tokens"),
    ):
        model.complete(ASK)
    assert model.server.requests == []


def test_without_a_budget_the_settings_limits_apply(tmp_path: Path) -> None:
    spec = script(tmp_path, 2, {"prompt_tokens": 10, "completion_tokens": 1})
    with resolve_model(spec, config.load({"max_tokens": 5})) as model, pytest.raises(BudgetExceeded):
        model.complete(ASK)


def test_price_table_covers_the_default_models_and_dated_variants() -> None:
    settings = config.load()
    for provider, model in (
        ("groq", settings.groq_model),
        ("groq", "openai/gpt-oss-120b"),
        ("openai", settings.openai_model),
    ):
        price = price_for(provider, model)
        assert price is not None and price["input"] > 0 and price["output"] > 0
    assert price_for("openai", "gpt-4.1-mini-2025-04-14") == price_for("openai", "gpt-4.1-mini")
    assert price_for("openai", "gpt-4.1-2025-04-14") == price_for("openai", "gpt-4.1")  # longest prefix wins, not gpt-4
    assert price_for("groq", "some-new-model") is None and price_for("openai-compatible", "x") is None
    assert price_for("ollama", "anything") == {"input": 0.0, "output": 0.0}
    for models in table()["providers"].values():
        assert all({"input", "output"} <= set(p) for p in models.values())


def test_cost_of_unknown_price_is_unknown_not_zero() -> None:
    usage = Usage(prompt_tokens=2_000_000, completion_tokens=1_000_000, cached_tokens=1_000_000)
    assert cost(None, usage) is None
    assert cost({"input": 2.0, "output": 8.0, "cached_input": 0.5}, usage) == pytest.approx(2.0 + 0.5 + 8.0)
    assert cost({"input": 2.0, "output": 8.0}, usage) == pytest.approx(4.0 + 8.0)  # no cached price: the input price
