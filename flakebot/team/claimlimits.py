"""A JWT principal's limits: from a claim its identity provider signs, held to the caps of the front.

The claim (`flakebot_limits` by default, `flakebot serve --jwt-limits-claim NAME` for another) is an object naming
limits as `token add` does: `{"calls_per_minute": 30, "concurrent_crafts": 1}`, each optional. The IdP is trusted
for who a caller is, not for what it may take: each limit is held to the front's cap (`--jwt-max-calls-per-minute`,
`--jwt-max-concurrent-crafts`; by default the static tokens' defaults, so a claim can lower a limit but raises none
until the admin raises the cap). A limit the claim leaves out is the default, held to the cap too.

A claim that says something other than that (not an object, a limit flakebot does not know, a value that is no whole
number within `token add`'s bounds) refuses the token, in one line naming the claim: a typo must neither be read as
the defaults nor be widened to the cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flakebot.errors import UsageError
from flakebot.team.tokens import (
    DEFAULT_CALLS_PER_MINUTE,
    DEFAULT_CONCURRENT_CRAFTS,
    MAX_CALLS_PER_MINUTE,
    MAX_CONCURRENT_CRAFTS,
)

DEFAULT_LIMITS_CLAIM = "flakebot_limits"
BOUNDS = {"calls_per_minute": MAX_CALLS_PER_MINUTE, "concurrent_crafts": MAX_CONCURRENT_CRAFTS}


class ClaimRefused(ValueError):
    """A token whose limits claim cannot be read: its one line names the claim and what is wrong."""


@dataclass(frozen=True)
class Caps:
    """The most a JWT's claim may give, per limit (the front's, from `flakebot serve`)."""

    calls_per_minute: int = DEFAULT_CALLS_PER_MINUTE
    concurrent_crafts: int = DEFAULT_CONCURRENT_CRAFTS

    def held(self, limits: dict[str, int]) -> dict[str, int]:
        """`limits` (the defaults where one is left out) each held to its cap."""
        defaults = {"calls_per_minute": DEFAULT_CALLS_PER_MINUTE, "concurrent_crafts": DEFAULT_CONCURRENT_CRAFTS}
        return {name: min(limits.get(name, default), getattr(self, name)) for name, default in defaults.items()}


def caps(calls_per_minute: int | None, concurrent_crafts: int | None) -> Caps:
    """The --jwt-max-* options as Caps (a left-out one: the default), else one UsageError line."""
    given = {"calls_per_minute": calls_per_minute, "concurrent_crafts": concurrent_crafts}
    for name, value in given.items():
        option = "--jwt-max-" + name.replace("_", "-")
        if value is not None and not 1 <= value <= BOUNDS[name]:
            raise UsageError(
                f"{option} must be between 1 and {BOUNDS[name]:,}, got {value}", fix=f"pass {option} within them"
            )
    return Caps(**{name: value for name, value in given.items() if value is not None})


def limits(claims: dict[str, Any], claim: str, held_to: Caps) -> dict[str, int]:
    """The limits of a verified token's `claims`, held to `held_to`; ClaimRefused when its limits claim is bad."""
    value = claims.get(claim)
    if value is None:
        return held_to.held({})
    if not isinstance(value, dict):
        raise ClaimRefused(f"its {claim} claim is a {type(value).__name__}, not an object of limits")
    asked: dict[str, int] = {}
    for name, number in value.items():
        if name not in BOUNDS:
            raise ClaimRefused(f"its {claim} claim names {str(name)[:40]!r}, no limit ({', '.join(BOUNDS)})")
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= BOUNDS[name]:
            raise ClaimRefused(
                f"its {claim} claim's {name} must be a whole number from 1 to {BOUNDS[name]:,}, got {str(number)[:40]!r}"
            )
        asked[name] = number
    return held_to.held(asked)
