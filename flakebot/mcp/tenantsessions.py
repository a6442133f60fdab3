"""Which open sessions of the team front are which tenant's: whom to tell that a tenant's tool list changed.

A tenant's catalog is shared by every token of that tenant, so a tool crafted or removed by one agent changes the
tool list of each of its tenant's sessions on this front, and of no other tenant's. Each request of a 2025-11-25
session (one with an Mcp-Session-Id) remembers its session here under its caller's tenant; a session counts as live
while the SDK's session manager still holds it (`live`), and is forgotten once it does not. A session that made no
request after `initialize` has listed nothing yet, so nothing it holds can be stale. A stateless (2026-07-28) request
has no session to tell later. A session is told only while the token it was opened with still verifies (`valid`): a
revoked token's session is ended by the front's sweep within a second, but a JWT's is left to its expiry and its
stream may stay open past it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Any

logger = logging.getLogger(__name__)

SEND_SECONDS = 5.0  # a notification not taken by a session's stream within this is dropped for that session
KEPT = 10_000
Valid = Callable[[], bool]  # sessions remembered before the ones the manager no longer holds are dropped


class TenantSessions:
    """Each open session's tenant, and its ServerSession (notifications ride its standalone stream)."""

    def __init__(self) -> None:
        self._sessions: dict[
            str, tuple[str, Any, Valid]
        ] = {}  # session id -> (tenant, a ServerSession, its token's check)
        self.live: Callable[[], Collection[str]] | None = None  # the session ids the SDK's manager holds now

    def remember(self, session_id: str, tenant: str, session: Any, valid: Valid) -> None:
        """A request of session `session_id`, made by a token of `tenant` (a session answers only its principal);
        `valid`: whether that token still verifies."""
        if session_id not in self._sessions and len(self._sessions) >= KEPT:
            self._forget_ended()
        self._sessions[session_id] = (tenant, session, valid)

    def of(self, tenant: str, besides: str | None) -> list[tuple[Any, Valid]]:
        """The live sessions of `tenant` other than `besides` (the caller's own, told by its own request), each with
        its token's check."""
        self._forget_ended()
        return [(session, valid) for sid, (owner, session, valid) in self._sessions.items()
                if owner == tenant and sid != besides]  # fmt: skip

    def _forget_ended(self) -> None:
        if self.live is None:
            return
        live = set(self.live())
        for session_id in [sid for sid in self._sessions if sid not in live]:
            del self._sessions[session_id]


async def tell(sessions: list[tuple[Any, Valid]]) -> None:
    """tools/list_changed to each of `sessions` whose token still verifies; one gone meanwhile is logged, one that
    takes longer than SEND_SECONDS is left (a client not reading its stream holds no other tenant's session back), the
    others hear."""
    import anyio

    for session, valid in sessions:
        if not await anyio.to_thread.run_sync(valid):  # a static store is read, a JWT's expiry checked
            continue
        try:
            with anyio.move_on_after(SEND_SECONDS):
                await session.send_tool_list_changed()
        except Exception as exc:  # noqa: BLE001 - a client gone; the catalog change stands
            logger.info("could not send tools/list_changed to a session: %s", exc)
