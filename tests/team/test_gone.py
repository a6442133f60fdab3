"""flakebot.mcp.gone at the ASGI level: which requests are cancelled when their client goes away, and how the cancel
is asked. The end to end case (a 2025-11-25 session's waited craft, through the SDK and PostgreSQL) is
tests/team/test_serve_queue.py::test_a_waited_craft_whose_client_went_away_is_left."""

from __future__ import annotations

import json
from typing import Any

import anyio

from flakebot.mcp.front import _posted_request
from flakebot.mcp.gone import PARSED, GoneRequests

SESSION = [
    (b"mcp-session-id", b"s-1"),
    (b"mcp-protocol-version", b"2025-11-25"),
    (b"content-type", b"application/json"),
]
REQUEST = {"jsonrpc": "2.0", "id": 41, "method": "tools/call", "params": {"name": "craft", "arguments": {}}}


class Answering:
    """An ASGI app that reads its request, answers `parts` of it (the last with more_body False when `finish`), then
    waits for its client (as the SDK's event stream does) and records every request it was given."""

    def __init__(self, finish: bool) -> None:
        self.finish = finish
        self.seen: list[tuple[dict[str, Any], bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        self.seen.append((scope, body))
        if len(self.seen) > 1:  # the cancel: a notification, answered 202
            await send({"type": "http.response.start", "status": 202, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"event: message\n\n", "more_body": not self.finish})
        await receive()  # the client's disconnect


def _served(app: Any, headers: list[tuple[bytes, bytes]], body: dict[str, Any], **handed: Any) -> list[Any]:
    """`body` POSTed through GoneRequests to `app` (`handed`: what the admission put in the scope); the messages
    received before `app` was called."""
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    called: list[bool] = []
    early: list[Any] = []

    async def receive() -> Any:
        message = messages.pop(0) if messages else {"type": "http.disconnect"}
        if not called:
            early.append(message)
        return message

    async def send(message: Any) -> None:
        pass

    async def serving(scope: Any, receive: Any, send: Any) -> None:
        called.append(True)
        await app(scope, receive, send)

    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "user": "alice's principal"}
    anyio.run(GoneRequests(serving), {**scope, **handed}, receive, send)
    return early


def test_a_session_request_whose_client_left_before_its_answer_is_cancelled_in_its_session() -> None:
    app = Answering(finish=False)
    _served(app, SESSION, REQUEST)
    assert len(app.seen) == 2, app.seen
    scope, body = app.seen[1]
    assert json.loads(body) == {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 41, "reason": "the client closed the request's stream"},
    }
    headers = dict(scope["headers"])
    assert headers[b"mcp-session-id"] == b"s-1" and headers[b"mcp-protocol-version"] == b"2025-11-25"
    assert scope["user"] == "alice's principal"  # the principal the authentication found, not a new one


def test_an_answered_request_a_notification_or_a_stateless_request_is_not_cancelled() -> None:
    answered = Answering(finish=True)
    _served(answered, SESSION, REQUEST)
    notified = Answering(finish=False)
    _served(notified, SESSION, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    stateless = Answering(finish=False)
    _served(stateless, [(b"content-type", b"application/json")], REQUEST)
    assert [len(app.seen) for app in (answered, notified, stateless)] == [1, 1, 1]


def test_a_request_naming_a_session_but_a_later_protocol_is_left_to_the_sdk() -> None:
    """The SDK serves a 2026-07-28 request statelessly whatever session id it names (and cancels its handler itself
    when its client goes away): no cancel is sent for it."""
    later = [(b"mcp-session-id", b"s-1"), (b"mcp-protocol-version", b"2026-07-28")]
    app = Answering(finish=False)
    _served(app, later, REQUEST)
    assert len(app.seen) == 1, app.seen


def test_a_body_the_admission_parsed_is_not_read_or_parsed_again() -> None:
    """Behind the front's admission (AdmittedCalls), which read and parsed the POST's body and hands the request on
    in the scope, GoneRequests reads nothing of the body before the SDK does and parses nothing (each body of up to
    4 MB was parsed twice): the request it cancels is the one handed on, and so is a notification it lets pass."""
    app = Answering(finish=False)
    parsed = _posted_request(json.dumps(REQUEST).encode())
    assert _served(app, SESSION, REQUEST, **{PARSED: parsed}) == []
    assert [json.loads(body)["params"]["requestId"] for _, body in app.seen[1:]] == [41]
    assert PARSED not in app.seen[1][0]  # the cancel is a request of its own
    notified = Answering(finish=False)
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert _served(notified, SESSION, initialized, **{PARSED: None}) == []
    assert len(notified.seen) == 1
