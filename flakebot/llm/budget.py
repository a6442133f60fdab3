"""Token and cost budgets for a run: checked before every model call, charged after every reply."""

from __future__ import annotations

import logging
from typing import Any

from flakebot.config import Settings
from flakebot.errors import BudgetExceeded
from flakebot.llm.base import Usage

logger = logging.getLogger(__name__)


class Budget:
    """What a run may spend (None: no limit) and what it has spent; `spent` is persisted by the caller."""

    def __init__(
        self, max_tokens: int | None = None, max_cost: float | None = None, spent: Usage | None = None
    ) -> None:
        self.max_tokens = max_tokens
        self.max_cost = max_cost
        self.spent = spent if spent is not None else Usage()
        self._warned_unknown_price = False

    @classmethod
    def from_settings(cls, settings: Settings, spent: Usage | dict[str, Any] | None = None) -> Budget:
        """The budget --max-tokens / --max-cost ask for, continuing from `spent` (a Usage or its to_dict())."""
        if isinstance(spent, dict):
            spent = Usage.from_dict(spent)
        return cls(settings.max_tokens, settings.max_cost, spent)

    def check(self) -> None:
        """Raise BudgetExceeded when nothing is left for another call."""
        if self.max_tokens is not None and self.spent.total_tokens >= self.max_tokens:
            raise self._tokens_error()
        if self.max_cost is not None and (self.spent.cost_usd or 0.0) >= self.max_cost:
            raise self._cost_error()

    def charge(self, usage: Usage) -> None:
        """Add one reply's usage; raise BudgetExceeded when the total went over a limit."""
        self.spent.add(usage)
        if usage.cost_usd is None and self.max_cost is not None and not self._warned_unknown_price:
            self._warned_unknown_price = True
            logger.warning(
                "the model's price is unknown: the cost budget of $%.2f counts only priced calls", self.max_cost
            )
        if self.max_tokens is not None and self.spent.total_tokens > self.max_tokens:
            raise self._tokens_error()
        if self.max_cost is not None and (self.spent.cost_usd or 0.0) > self.max_cost:
            raise self._cost_error()

    def to_dict(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "max_cost": self.max_cost, "spent": self.spent.to_dict()}

    def _tokens_error(self) -> BudgetExceeded:
        return BudgetExceeded(
            f"token budget spent: {self.spent.total_tokens:,} of {self.max_tokens:,} tokens used",
            fix="raise --max-tokens (or max_tokens in flakebot.toml) and resume the run",
            spent_tokens=self.spent.total_tokens,
            max_tokens=self.max_tokens,
        )

    def _cost_error(self) -> BudgetExceeded:
        return BudgetExceeded(
            f"cost budget spent: ${self.spent.cost_usd or 0.0:.4f} of ${self.max_cost:.4f} used",
            fix="raise --max-cost (or max_cost in flakebot.toml) and resume the run",
            spent_cost=self.spent.cost_usd,
            max_cost=self.max_cost,
        )
