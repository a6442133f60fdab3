"""A chat-completions server on 127.0.0.1 that replays a script of assistant turns, with faults on demand.

The real openai and groq SDKs talk to it (POST /v1/chat/completions and /openai/v1/chat/completions;
any path ending in /chat/completions is served), so tests and the offline demo run the SDK code users run.
Each request takes the next turn of the script: a reply (text and/or tool calls), a raw response body,
or a fault (429 + Retry-After, 500, 400 tool_use_failed, 400 context_length_exceeded, a connection reset
mid-body, malformed JSON, a slow reply). A fault answers one request; the client's retry gets the next turn.
A turn's "expect" checks the request it answers; a mismatch, or a request after the last turn, is answered
with a 400 whose message starts "script expectation failed:" / "script ran out of turns:". Format: docs/scripts.md.

    python -m flakebot.llm.stub_server --script FILE [--stage NAME] [--port 0]

prints its base URL (for the openai SDK; the groq SDK takes the same URL without /v1) on the first line
of stdout and serves until killed. GET /_stub/requests lists the requests it received (keys never recorded).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from flakebot.errors import ModelError
from flakebot.llm.script import Script, load_script
from flakebot.loopback import LoopbackServer

logger = logging.getLogger(__name__)

# The body Groq sends when a model's tool call does not parse (../shared/fixtures/llm/groq-tool-use-failed-400.json).
TOOL_USE_FAILED = {
    "error": {
        "message": "Failed to call a function. Please adjust your prompt. See 'failed_generation' for more details.",
        "type": "invalid_request_error",
        "code": "tool_use_failed",
        "failed_generation": '<function=brave_search>{"query": "weather"}</function>',
    }
}
CONTEXT_OVERFLOW = "Please reduce the length of the messages or completion."


def error_body(message: str, code: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class StubServer:
    """Serves one script's turns in order on 127.0.0.1 from a background thread (or the caller's, via serve_forever)."""

    def __init__(self, script: Script | list[dict[str, Any]], host: str = "127.0.0.1", port: int = 0) -> None:
        self.script = script if isinstance(script, Script) else Script(list(script))
        self.requests: list[dict[str, Any]] = []
        self.failures: list[str] = []  # expectation failures and exhaustion, as answered
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd = _HTTPServer(_Handler, host, port)
        self._httpd.stub = self

    @property
    def url(self) -> str:
        """Root URL: the groq SDK's base_url."""
        return self._httpd.url

    @property
    def openai_url(self) -> str:
        """The openai SDK's base_url (and any OpenAI-compatible client's)."""
        return self.url + "/v1"

    @property
    def turns_left(self) -> int:
        return len(self.script.turns) - self._next

    def start(self) -> StubServer:
        """Serve from a background thread until close()."""
        self._httpd.start(name=f"stub-server-{self.url}")
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def close(self) -> None:
        """Stop serving, cut short slow replies, and join every thread; safe to call twice."""
        self._stop.set()
        self._httpd.close()

    def __enter__(self) -> StubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take_turn(self, request: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str | None]:
        """The next turn for `request`, and the reason to refuse it (expectation failed, no turn left)."""
        with self._lock:
            index = self._next
            if index >= len(self.script.turns):
                problem = f"script ran out of turns: request #{len(self.requests) + 1} came after all {len(self.script.turns)} turns of {self.script.source}"
                self.failures.append(problem)
                return index, None, problem
            self._next += 1
            turn = self.script.turns[index]
        mismatch = expectation_problem(turn.get("expect", {}), request)
        if mismatch is None:
            return index, turn, None
        problem = f"script expectation failed: turn {index} of {self.script.source}: {mismatch}"
        self.failures.append(problem)
        return index, turn, problem

    def wait(self, seconds: float) -> bool:
        """Sleep for a slow reply; True when the server is closing instead."""
        return self._stop.wait(seconds)


class _HTTPServer(LoopbackServer):
    # Non-daemon handler threads, joined by server_close(): nothing outlives close().
    daemon_threads = False
    block_on_close = True
    stub: StubServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (timeout) leaves a broken pipe behind: expected, not worth a traceback on stderr.
        logger.debug("stub server: error answering %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "flakebot-stub/1"
    timeout = 30  # a client that stops sending mid-request does not hold a thread forever
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("stub server: " + format, *args)

    def do_GET(self) -> None:
        stub = self.server.stub
        if self.path.rstrip("/").endswith("/models"):
            self.send_json(
                200,
                {"object": "list", "data": [{"id": stub.script.model, "object": "model", "owned_by": "flakebot-stub"}]},
            )
        elif self.path == "/_stub/requests":
            self.send_json(200, {"requests": stub.requests, "failures": stub.failures, "turns_left": stub.turns_left})
        else:
            self.send_json(404, error_body(f"no route {self.path}", "not_found"))

    def do_POST(self) -> None:
        try:
            request = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        except ValueError:
            self.send_json(400, error_body("request body is not JSON", "invalid_json"), retry=False)
            return
        if not self.path.endswith("/chat/completions"):
            self.send_json(404, error_body(f"no route {self.path}", "not_found"), retry=False)
            return
        if request.get("stream"):
            self.send_json(
                400, error_body("the stub server does not stream; send stream=false", "stream_unsupported"), retry=False
            )
            return
        stub = self.server.stub
        index, turn, problem = stub.take_turn(request)
        stub.requests.append(self._record(request, index if turn else None))
        if problem or turn is None:
            code = "script_expectation_failed" if turn else "script_exhausted"
            self.send_json(400, error_body(problem or "", code), retry=False)
            return
        answer(self, turn, request, index)

    def _record(self, request: dict[str, Any], turn: int | None) -> dict[str, Any]:
        # Never the Authorization header: only whether one came.
        return {
            "time": time.time(),
            "path": self.path,
            "turn": turn,
            "authorized": "authorization" in self.headers,
            "body": request,
        }

    def send_json(
        self, status: int, body: Any, headers: dict[str, str] | None = None, retry: bool | None = None
    ) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("connection", "close")
        if retry is not None:
            self.send_header("x-should-retry", "true" if retry else "false")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True


def answer(handler: _Handler, turn: dict[str, Any], request: dict[str, Any], index: int) -> None:
    """Answer one request with `turn`: its fault, its raw response, or a completion."""
    fault = turn.get("fault") or {}
    kind = str(fault.get("kind", ""))
    if kind == "slow" and handler.server.stub.wait(float(fault["seconds"])):
        return
    if kind in FAULT_ANSWERS:
        FAULT_ANSWERS[kind](handler, fault)
    elif "response" in turn:
        handler.send_json(int(turn.get("status", 200)), turn["response"])
    else:
        handler.send_json(200, completion_body(turn, request, index, handler.server.stub.script.model))


def _rate_limited(handler: _Handler, fault: dict[str, Any]) -> None:
    wait = fault.get("retry_after", 1)
    body = error_body(f"Rate limit reached (stub). Please try again in {wait}s.", "rate_limit_exceeded", "tokens")
    handler.send_json(429, body, {"retry-after": str(wait)})


def _server_error(handler: _Handler, fault: dict[str, Any]) -> None:
    headers = {"retry-after": str(fault["retry_after"])} if "retry_after" in fault else {}
    handler.send_json(500, error_body("Internal server error (stub)", None, "internal_server_error"), headers)


def _tool_use_failed(handler: _Handler, fault: dict[str, Any]) -> None:
    body = json.loads(json.dumps(TOOL_USE_FAILED))
    for key in ("failed_generation", "message"):
        if key in fault:
            body["error"][key] = fault[key]
    handler.send_json(400, body)


def _context_overflow(handler: _Handler, fault: dict[str, Any]) -> None:
    handler.send_json(400, error_body(fault.get("message", CONTEXT_OVERFLOW), "context_length_exceeded"))


def _reset(handler: _Handler, fault: dict[str, Any]) -> None:
    """Promise a body, send half of it, then abort the connection (RST)."""
    data = json.dumps(completion_body({"content": "this reply is cut off " * 20}, {}, 0, "stub")).encode()
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data[: len(data) // 2])
    handler.wfile.flush()
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    handler.close_connection = True


def _malformed(handler: _Handler, fault: dict[str, Any]) -> None:
    data = b'{"id": "chatcmpl-stub", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assist'
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.send_header("connection", "close")
    handler.end_headers()
    handler.wfile.write(data)
    handler.close_connection = True


FAULT_ANSWERS = {
    "429": _rate_limited,
    "500": _server_error,
    "tool_use_failed": _tool_use_failed,
    "context_overflow": _context_overflow,
    "reset": _reset,
    "malformed_json": _malformed,
}


def completion_body(turn: dict[str, Any], request: dict[str, Any], index: int, model: str) -> dict[str, Any]:
    """A chat.completion body for a text/tool-call turn, shaped like Groq's (no "content" key beside tool calls)."""
    message: dict[str, Any] = {"role": "assistant"}
    if turn.get("content") is not None or not turn.get("tool_calls"):
        message["content"] = turn.get("content") or ""
    calls = [_tool_call(call, index, i) for i, call in enumerate(turn.get("tool_calls", []))]
    if calls:
        message["tool_calls"] = calls
    finish = turn.get("finish_reason") or ("tool_calls" if calls else "stop")
    return {
        "id": f"chatcmpl-stub-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model") or model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _usage(turn, request, message),
        "system_fingerprint": "fp_flakebot_stub",
    }


def _tool_call(call: dict[str, Any], turn: int, i: int) -> dict[str, Any]:
    arguments = call.get("arguments", {})
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call.get("id") or f"call_{turn}_{i}",
        "type": "function",
        "function": {"name": call["name"], "arguments": raw},
    }


def _usage(turn: dict[str, Any], request: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """The turn's usage, or a deterministic estimate (4 characters a token)."""
    given = turn.get("usage", {})
    prompt = given.get("prompt_tokens", max(1, len(json.dumps(request.get("messages", []))) // 4))
    completion = given.get("completion_tokens", max(1, len(json.dumps(message)) // 4))
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if "cached_tokens" in given:
        usage["prompt_tokens_details"] = {"cached_tokens": given["cached_tokens"]}
    return usage


def expectation_problem(expect: dict[str, Any], request: dict[str, Any]) -> str | None:
    """What in `request` does not match the turn's `expect`, or None."""
    messages = request.get("messages") or []
    for key, wanted in expect.items():
        if key == "tools_include":
            names = {(t.get("function") or {}).get("name") for t in request.get("tools") or []}
            missing = sorted(set(wanted) - names)
            if missing:
                return f"tools_include: the request offers no tool named {', '.join(missing)} (offered: {', '.join(sorted(map(str, names))) or 'none'})"
            continue
        role = {"last_tool_result_contains": "tool", "last_user_contains": "user", "last_message_contains": None}[key]
        text = _last_content(messages, role)
        label = f"{role} message" if role else "message"
        if text is None:
            return f"{key}: expected a {label} containing {wanted!r}, but the request has none"
        if wanted not in text:
            return f"{key}: expected {wanted!r} in the last {label}, got {_clip(text)!r}"
    return None


def _last_content(messages: list[dict[str, Any]], role: str | None) -> str | None:
    for message in reversed(messages):
        if role is None or message.get("role") == role:
            content = message.get("content")
            if isinstance(content, list):  # content parts
                return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            return str(content or "")
    return None


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit // 2] + " ... " + text[-limit // 2 :]


def main(argv: list[str] | None = None) -> int:
    """Serve a script until killed; print the base URL first."""
    parser = argparse.ArgumentParser(
        prog="python -m flakebot.llm.stub_server",
        description="Serve a flakebot model script over the chat-completions API.",
    )
    parser.add_argument("--script", required=True, type=Path, help="the script (JSON, see docs/scripts.md)")
    parser.add_argument("--stage", help="serve this stage's turns")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    try:
        server = StubServer(load_script(args.script, args.stage), args.host, args.port)
    except ModelError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # not a loopback address
        print(f"error: {exc}. Fix: use --host 127.0.0.1", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    print(server.openai_url, flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
