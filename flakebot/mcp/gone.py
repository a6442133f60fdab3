"""ASGI: a session's request whose client went away before its answer is cancelled, as the client's own
`notifications/cancelled` would cancel it.

A stateless request's handler is cancelled by the SDK when its client closes the connection; a 2025-11-25 session's is
not: the SDK ends the POST's event stream and lets the handler run on, its answer sent to nobody (a waited craft
followed its job to the end, holding one of its token's calls in flight, and a job its caller alone followed ran on for
nobody). No event store is configured, so a closed POST stream can never be resumed: its request is abandoned. The
cancel goes through the SDK's public door, a notification POSTed into the same session with the request's own headers
(its session id, its protocol version, the principal the authentication already found), so the SDK checks the session's
owner as for any request and nothing reaches its private state.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio

logger = logging.getLogger(__name__)

SESSION_HEADER = b"mcp-session-id"
CANCEL_TIMEOUT = 5.0  # seconds the cancel's own POST may take (the SDK answers a notification with 202 at once)


class GoneRequests:
    """Wraps the SDK's Streamable HTTP app: a POST of a session carrying a JSON-RPC request, whose client disconnects
    before the last of its answer was sent, is followed by a `notifications/cancelled` for that request id in the same
    session. Any other request passes unchanged."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from flakebot.mcp.front import _posted_request, _read_body, _replaying

        if scope.get("type") != "http" or scope.get("method") != "POST" or not _session_of(scope):
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        request = _posted_request(body)
        if request is None:  # a notification or a response: nothing waits on an answer
            await self.app(scope, _replaying(messages, receive), send)
            return
        answered = gone = False
        replayed = _replaying(messages, receive)

        async def receiving() -> Any:
            nonlocal gone
            message = await replayed()
            if message.get("type") == "http.disconnect" and not answered:
                gone = True
            return message

        async def sending(message: Any) -> None:
            nonlocal answered
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                answered = True
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            if gone and not answered:
                with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT):
                    await self._cancel(scope, request[0])

    async def _cancel(self, scope: Any, request_id: Any) -> None:
        """POST `notifications/cancelled` for `request_id` into the session `scope` belongs to, as its client would."""
        notification = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": request_id, "reason": "the client closed the request's stream"},
        }
        body = json.dumps(notification).encode()
        kept = [
            (k, v) for k, v in scope.get("headers") or [] if k not in (b"content-type", b"content-length", b"accept")
        ]
        headers = [
            *kept,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"accept", b"application/json, text/event-stream"),
        ]
        sent = False

        async def receive() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await anyio.sleep_forever()  # the SDK answers a notification without reading on

        status: list[int] = []

        async def send(message: Any) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message.get("status", 0)))

        await self.app({**scope, "headers": headers}, receive, send)
        logger.info(
            "session %s: request %s cancelled, its client went away (HTTP %s)",
            _session_of(scope),
            request_id,
            status[0] if status else "-",
        )


def _session_of(scope: Any) -> str:
    for name, value in scope.get("headers") or []:
        if name == SESSION_HEADER:
            return str(value.decode("latin-1"))
    return ""
