"""The front's background sweeps (flakebot.mcp.front): what keeps them, and the front, going."""

from __future__ import annotations

import anyio


def test_a_sweep_of_the_front_that_raises_is_started_again_not_the_fronts_end() -> None:
    """The front's background sweeps (ending revoked tokens' sessions, leaving their queued jobs) run in the task group
    every request's server lives in: one raising an error nobody foresaw took the whole front down (every request 500
    until a restart). Now the sweep is logged and started again."""
    from flakebot.mcp import front

    runs: list[int] = []

    async def sweep(limit: int) -> None:
        runs.append(len(runs))
        if len(runs) < limit:
            raise RuntimeError("a store nobody foresaw")

    async def main() -> None:
        with anyio.fail_after(10):
            await front._kept_running("a sweep", sweep, 2)

    anyio.run(main)
    assert runs == [0, 1]
