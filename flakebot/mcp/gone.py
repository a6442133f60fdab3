"""ASGI: a session's request whose client went away before its answer is cancelled, as the client's own
`notifications/cancelled` would cancel it.

A stateless request's handler is cancelled by the SDK when its client closes the connection; a 2025-11-25 session's is
not: the SDK ends the POST's event stream and lets the handler run on, its answer sent to nobody (a waited craft
followed its job to the end, holding one of its token's calls in flight, and a job its caller alone followed ran on for
nobody). No event store is configured, so a closed POST stream can never be resumed: its request is abandoned. The
cancel goes through the SDK's public door, a notification POSTed into the same session with the request's own headers
(its session id, its protocol version, the principal the authentication already found), so the SDK checks the session's
owner as for any request and nothing reaches its private state.

The SDK keeps one request of a session per id (a second of the same id takes the first's place, and leaves with its
answer): a cancel by id then finds nothing, and the first request runs on for nobody. So a request whose id another
open request of the same session and principal holds is refused (MCP: an id is never reused within a session).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio

logger = logging.getLogger(__name__)

SESSION_HEADER = b"mcp-session-id"
# the scope key under which the admission (front.AdmittedCalls) hands on the POST's JSON-RPC request as it parsed it
# (front._posted_request's answer: None when the body holds no request), so that a body of up to 4 MB is parsed once
PARSED = "flakebot.posted_request"
CANCEL_TIMEOUT = 5.0  # seconds the cancel's own POST may take (the SDK answers a notification with 202 at once)
INVALID_REQUEST = -32600  # JSON-RPC's code for a request that is not a valid one


class GoneRequests:
    """Wraps the SDK's Streamable HTTP app: a POST of a session carrying a JSON-RPC request, whose client disconnects
    before the last of its answer was sent, is followed by a `notifications/cancelled` for that request id in the same
    session. A request whose id an open request of its session and principal holds is refused (400, one line). Any
    other request passes unchanged. The request is the one the admission parsed and handed on in the scope (PARSED):
    each body is parsed once."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._open: set[tuple[str, str, tuple[str, Any]]] = set()  # (session, principal, request id) still answering

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from flakebot.mcp.front import _posted_request, _read_body, _replaying

        if scope.get("type") != "http" or scope.get("method") != "POST" or not _in_session(scope):
            await self.app(scope, receive, send)
            return
        if PARSED in scope:  # the admission read and parsed the body: its messages are still to be received
            request, replayed = scope[PARSED], receive
        else:  # not through the admission (its token found no principal there): read and parsed here
            messages, body = await _read_body(receive)
            request, replayed = _posted_request(body), _replaying(messages, receive)
        if request is None:  # a notification or a response: nothing waits on an answer
            await self.app(scope, replayed, send)
            return
        key = (_session_of(scope), _principal_of(scope), _request_key(request[0]))
        if key in self._open:
            await _refuse_reused(send, request[0])
            return
        self._open.add(key)  # no await since the check: two requests of one id cannot both pass
        answered = gone = False

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
            try:
                if gone and not answered:
                    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT):
                        await self._cancel(scope, request[0])
            finally:  # once its cancel went: a new request of that id is not the one cancelled
                self._open.discard(key)

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

        own = {name: value for name, value in scope.items() if name != PARSED}  # the request's parse: not the cancel's
        await self.app({**own, "headers": headers}, receive, send)
        logger.info(
            "session %s: request %s cancelled, its client went away (HTTP %s)",
            _session_of(scope),
            request_id,
            status[0] if status else "-",
        )


def _principal_of(scope: Any) -> str:
    """The principal the authentication found (its token's subject): another's request naming the session is the
    SDK's 404, not this module's refusal (which would tell it which ids the session has open)."""
    token = getattr(scope.get("user"), "access_token", None)
    return str(getattr(token, "subject", None) or getattr(token, "client_id", None) or "")


def _request_key(request_id: Any) -> tuple[str, Any]:
    """A request id as the SDK correlates it: "7", 7 and 7.0 are one id (mcp.shared.dispatcher.coerce_request_id);
    true is not 1."""
    if isinstance(request_id, bool) or request_id is None:
        return ("other", repr(request_id))
    if isinstance(request_id, float) and request_id.is_integer():
        return ("int", int(request_id))
    if isinstance(request_id, str):
        try:
            return ("int", int(request_id))
        except ValueError:
            return ("str", request_id)
    return ("int", request_id) if isinstance(request_id, int) else ("other", repr(request_id))


async def _refuse_reused(send: Any, request_id: Any) -> None:
    message = (
        f"request id {request_id} is in use by another request of this session still being answered. "
        "Fix: give each request of a session an id of its own (MCP: an id is never reused in a session)"
    )
    payload = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": INVALID_REQUEST, "message": message}})
    body = payload.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _in_session(scope: Any) -> bool:
    """Whether the SDK serves the request in a 2025-11-25 session: it names one, and no protocol version past the
    handshake's (the SDK routes a later one to its stateless entry, which cancels a gone request's handler itself)."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    versions = [value for name, value in scope.get("headers") or [] if name == b"mcp-protocol-version"]
    return bool(_session_of(scope)) and (not versions or versions[0].decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS)


def _session_of(scope: Any) -> str:
    for name, value in scope.get("headers") or []:
        if name == SESSION_HEADER:
            return str(value.decode("latin-1"))
    return ""
