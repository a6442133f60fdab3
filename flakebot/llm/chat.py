"""A Model over the groq or openai SDK: one chat-completions call with flakebot's resilience on top.

The SDK retries 408/409/429/5xx, timeouts and connection resets (`model_retries` times, honouring
Retry-After). On top, complete() handles:
- Groq's 400 tool_use_failed: the model's text (`failed_generation`) and the exact error go back to the
  model as an assistant + user message pair, and the call is retried;
- tool-call arguments that are not valid JSON: returned as ToolCall.error (the caller answers the tool
  call with that error, so the model sees its mistake);
  both count as format errors; the third in a row (across calls, reset by a clean reply) raises ModelError;
- context overflow: `messages` is shrunk in place (oldest tool outputs first) and the call retried;
- a reply body that is not valid JSON: retried up to `model_retries` times;
- everything else: one ModelError naming the model, the cause and the fix.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from flakebot.errors import ModelError
from flakebot.events import waiting_on
from flakebot.llm.base import Reply, ToolCall, Usage
from flakebot.llm.budget import Budget
from flakebot.llm.history import is_overflow, shrink
from flakebot.llm.prices import Price, cost
from flakebot.llm.stub_server import StubServer
from flakebot.llm.transcript import Transcript
from flakebot.longlived import imports_kept
from flakebot.redact import redact_text
from flakebot.tlscontext import tls_context

if TYPE_CHECKING:
    import ssl

logger = logging.getLogger(__name__)

MAX_FORMAT_ERRORS = 3
CORRECTION = (
    "Your last reply was not a valid tool call. The provider's parser said: {error}\n"
    "Call the tool again: its arguments must be one JSON object matching the tool's parameters schema."
)


@dataclass
class Endpoint:
    """Where and how to reach one model."""

    name: str  # as chosen: "groq:openai/gpt-oss-120b", "scripted:demo.json"
    provider: str
    model: str  # sent in the request
    sdk: str  # "groq" or "openai"
    api_key: str
    base_url: str | None = None  # None: the SDK's default (or its *_BASE_URL variable)
    key_env: str | None = None
    price: Price | None = None


class _FormatError(Exception):
    def __init__(self, message: str, failed_generation: str) -> None:
        super().__init__(message)
        self.message = message
        self.failed_generation = failed_generation


class _Overflow(Exception):
    pass


class _BadBody(Exception):
    pass


class ChatModel:
    """A Model (see base.py) talking chat completions through the groq or openai SDK."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        timeout: float,
        retries: int,
        stage: str | None = None,
        transcript: Transcript | None = None,
        budget: Budget | None = None,
        server: StubServer | None = None,
    ) -> None:
        self.name = endpoint.name
        self.endpoint = endpoint
        self.timeout = timeout
        self.retries = retries
        self.stage = stage
        self.transcript = transcript
        self.budget = budget
        self.server = server  # the scripted model's stub server, closed with the model
        self.format_errors = 0  # in a row, across calls
        # a scripted model's stub server lives as long as this model, and its client with it; any other model's
        # client is shared by the run's stages
        self._owns_client = server is not None
        # the SDK (tens of thousands of pydantic objects) and the chat resources it imports on first use: the
        # process's from now on
        with imports_kept():
            self._sdk, self._client = (make_client if server is not None else shared_client)(endpoint, timeout, retries)
            self._client.chat.completions  # noqa: B018
        self._recorded: tuple[int, int] = (0, 0)  # (id, length) of the history last written to the transcript
        self._closed = False
        atexit.register(self.close)
        self._record("model_start", sdk=endpoint.sdk, base_url=self.base_url, timeout=timeout, retries=retries)

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *, temperature: float = 0.0
    ) -> Reply:
        """One assistant turn for `messages` (shrunk in place if the context overflows)."""
        if self._closed:
            raise ModelError(f"{self.name} was used after close()", fix="make a new model with resolve_model()")
        try:
            return self._complete(messages, tools, temperature)
        except ModelError as exc:
            self._record("model_error", error=exc.to_dict())
            raise

    def _complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, temperature: float
    ) -> Reply:
        extra: list[dict[str, Any]] = []  # corrections after tool_use_failed, for this call only
        bad_bodies = shrunk = 0
        while True:
            if self.budget is not None:
                self.budget.check()
            self._record_request(messages, extra, tools, temperature)
            try:
                reply = self._call(messages + extra, tools, temperature)
            except _FormatError as exc:
                extra += self._correction(exc)
            except _Overflow as exc:
                shrunk += self._shrink(messages, str(exc))
            except _BadBody as exc:
                bad_bodies += 1
                self._retry_bad_body(bad_bodies, str(exc))
            else:
                reply.shrunk = shrunk
                self._accept(reply)
                return reply

    def _call(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, temperature: float) -> Reply:
        sdk = self._sdk
        kwargs: dict[str, Any] = {"model": self.endpoint.model, "messages": messages, "temperature": temperature}
        if tools:
            kwargs["tools"] = tools
        start = time.monotonic()
        try:
            with waiting_on(f"the model's reply ({self.endpoint.model})"):
                response = self._client.chat.completions.create(**kwargs)
        except sdk.APIStatusError as exc:
            raise self._status_error(exc) from None
        except sdk.APIConnectionError as exc:  # includes APITimeoutError
            raise self._transport_error(exc) from None
        except (ValueError, sdk.APIResponseValidationError) as exc:  # JSONDecodeError of a malformed body
            raise _BadBody(f"{type(exc).__name__}: {exc}") from None
        try:
            return parse_completion(response.model_dump(), time.monotonic() - start)
        except ValueError as exc:
            raise _BadBody(str(exc)) from None

    def _accept(self, reply: Reply) -> None:
        reply.usage.cost_usd = cost(self.endpoint.price, reply.usage)
        self._record("model_reply", reply=reply.to_dict())
        tokens = f"{reply.usage.prompt_tokens}+{reply.usage.completion_tokens}"
        logger.debug(
            "%s replied in %.2fs: %s tokens, %d tool call(s)", self.name, reply.latency, tokens, len(reply.tool_calls)
        )
        if self.budget is not None:
            self.budget.charge(reply.usage)
        broken = [call.error for call in reply.tool_calls if call.error]
        if broken:
            self._format_error(str(broken[0]))
        else:
            self.format_errors = 0

    def _correction(self, exc: _FormatError) -> list[dict[str, Any]]:
        self._format_error(exc.message)
        self._record(
            "model_retry", reason="tool_use_failed", error=exc.message, failed_generation=exc.failed_generation
        )
        logger.info("%s sent a tool call the provider could not parse; asking again", self.name)
        return [
            {"role": "assistant", "content": exc.failed_generation or "(empty reply)"},
            {"role": "user", "content": CORRECTION.format(error=exc.message)},
        ]

    def _format_error(self, error: str) -> None:
        self.format_errors += 1
        if self.format_errors >= MAX_FORMAT_ERRORS:
            raise ModelError(
                f"{self.name} sent {self.format_errors} malformed tool calls in a row (last: {_clip(redact_text(error))})",
                fix="choose a model that is better at tool calling (e.g. groq:openai/gpt-oss-120b) with --model",
                format_errors=self.format_errors,
            )

    def _shrink(self, messages: list[dict[str, Any]], error: str) -> int:
        changed = shrink(messages)
        self._record("model_retry", reason="context_overflow", error=error, shrunk=changed)
        if not changed:
            raise ModelError(
                f"the conversation does not fit {self.name}'s context window even with old tool outputs elided ({_clip(error)})",
                fix="choose a model with a larger context window, or lower output_cap so tool outputs are shorter",
            )
        logger.info("%s: context window exceeded; elided %d old message(s) and retrying", self.name, changed)
        return changed

    def _retry_bad_body(self, attempts: int, error: str) -> None:
        self._record("model_retry", reason="malformed_response", error=error, attempt=attempts)
        if attempts > self.retries:
            raise ModelError(
                f"{self.name} sent a reply that is not a valid chat completion {attempts} times ({_clip(error)})",
                fix="check that the base URL is an OpenAI-compatible chat-completions endpoint",
            )
        logger.info("%s sent a malformed reply (%s); retrying", self.name, error)

    def _status_error(self, exc: Any) -> Exception:
        body = exc.body.get("error", exc.body) if isinstance(exc.body, dict) else {}
        body = body if isinstance(body, dict) else {}
        code = body.get("code")
        message = redact_text(str(body.get("message") or exc.message))
        if code == "tool_use_failed":
            return _FormatError(message, redact_text(str(body.get("failed_generation") or "")))
        if exc.status_code in (400, 413, 422) and is_overflow(code, message):
            return _Overflow(message)
        return status_error(self, exc.status_code, code, message)

    def _transport_error(self, exc: Any) -> ModelError:
        attempts = self.retries + 1
        if isinstance(exc, self._sdk.APITimeoutError):
            return ModelError(
                f"{self.name} did not answer within {self.timeout:g}s ({attempts} attempt(s))",
                fix="raise model_timeout ('flakebot config set model_timeout 300') or try again later",
            )
        cause = exc.__cause__
        reason = f"{type(cause).__name__}: {cause}" if cause else exc.message
        return ModelError(
            f"cannot reach {self.name} at {self.base_url} ({redact_text(reason)}; {attempts} attempt(s))",
            fix="check that the server is running and the base URL is right",
        )

    def _record_request(
        self,
        messages: list[dict[str, Any]],
        extra: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        temperature: float,
    ) -> None:
        # Only the messages added since the last request: a transcript stays linear in the conversation's length.
        last_id, last_len = self._recorded
        offset = last_len if id(messages) == last_id and len(messages) >= last_len else 0
        self._recorded = (id(messages), len(messages))
        names = [(t.get("function") or {}).get("name") for t in tools or []]
        self._record(
            "model_request",
            offset=offset,
            messages=messages[offset:],
            extra=extra,
            tools=names,
            temperature=temperature,
        )

    def _record(self, kind: str, **data: Any) -> None:
        if self.transcript is not None:
            self.transcript.record(kind, model=self.name, stage=self.stage, **data)

    def close(self) -> None:
        """Close the SDK client and, for a scripted model, its stub server."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._owns_client:
            self._client.close()
        if self.server is not None:
            self.server.close()

    def __enter__(self) -> ChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def status_error(model: ChatModel, status: int, code: Any, message: str) -> ModelError:
    """The ModelError for an HTTP error status the SDK gave up on."""
    if code in ("script_expectation_failed", "script_exhausted"):
        return ModelError(message, fix="correct the model script (format: docs/scripts.md)", status=status)
    tried = f"{model.retries + 1} attempt(s)"
    if status in (401, 403):
        problem, fix = (
            f"{model.endpoint.provider} rejected the API key ({status})",
            f"check {model.endpoint.key_env or 'the API key'}",
        )
    elif status == 404:
        problem, fix = (
            f"{model.name} was not found at {model.base_url} (404)",
            "check the model name and base URL ('flakebot models')",
        )
    elif status == 429:
        problem, fix = (
            f"{model.name} is rate limited (429, {tried})",
            "wait a minute and resume the run, or raise model_retries",
        )
    elif status >= 500:
        problem, fix = (
            f"{model.name} failed with {status} ({tried})",
            "try again later; 'flakebot resume RUN' continues a run",
        )
    else:
        problem, fix = f"{model.name} refused the request ({status})", "see the run's transcript.jsonl for the request"
    return ModelError(f"{problem}: {_clip(message)}", fix=fix, status=status)


def parse_completion(data: dict[str, Any], latency: float = 0.0) -> Reply:
    """A Reply from a chat.completion body (a dict); ValueError when it has no choice."""
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise ValueError("the reply has no choices")
    message = choices[0].get("message") or {}
    return Reply(
        text=message.get("content") or "",
        tool_calls=[parse_tool_call(call) for call in message.get("tool_calls") or []],
        finish_reason=choices[0].get("finish_reason") or "",
        usage=parse_usage(data.get("usage") or {}),
        latency=latency,
        model=str(data.get("model") or ""),
    )


def parse_tool_call(call: dict[str, Any]) -> ToolCall:
    function = call.get("function") or {}
    raw = function.get("arguments")
    raw = json.dumps(raw) if isinstance(raw, dict) else str(raw or "")
    arguments, error = parse_arguments(raw)
    name = str(function.get("name") or "")
    if not name:
        error = error or "the tool call names no function"
    return ToolCall(id=str(call.get("id") or ""), name=name, arguments=arguments, raw_arguments=raw, error=error)


def parse_arguments(raw: str) -> tuple[dict[str, Any], str | None]:
    """Tool-call arguments parsed; on failure {} and the exact parse error, to send back to the model."""
    if not raw.strip():
        return {}, None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return (
            {},
            f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (got {_clip(raw, 120)!r})",
        )
    if not isinstance(value, dict):
        return {}, f"arguments must be a JSON object, got {type(value).__name__} ({_clip(raw, 120)!r})"
    return value, None


def parse_usage(usage: dict[str, Any]) -> Usage:
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or usage.get("cached_tokens") or 0),
    )


def make_client(endpoint: Endpoint, timeout: float, retries: int) -> tuple[ModuleType, Any]:
    """The SDK module (for its exception classes) and a client; SDKs are imported only when used. The client's HTTP
    pool is the SDK's default one (its DefaultHttpxClient), verifying TLS with tls_context()."""
    sdk: ModuleType
    make: Callable[..., Any]
    with _httpx_cli_left_out():
        if endpoint.sdk == "groq":
            import groq

            sdk, make = groq, groq.Groq
        else:
            import openai

            sdk, make = openai, openai.OpenAI
    pool = sdk.DefaultHttpxClient(timeout=timeout, verify=_trust(endpoint, sdk))
    client = make(
        api_key=endpoint.api_key, base_url=endpoint.base_url, timeout=timeout, max_retries=retries, http_client=pool
    )
    return sdk, client


@contextmanager
def _httpx_cli_left_out() -> Iterator[None]:
    """httpx's package imports its command-line client (httpx._main: click, rich and pygments, ~50 ms of a craft's
    first model client) only to offer `httpx.main`, which flakebot never calls: while an SDK is imported that module
    is missing, so httpx defines its stand-in main (as without httpx[cli]); after it, it can be imported again."""
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        yield
        return
    sys.modules["httpx._main"] = None  # type: ignore[assignment]  # None: the import system's "not there"
    try:
        yield
    finally:
        if "httpx._main" in sys.modules and sys.modules["httpx._main"] is None:
            del sys.modules["httpx._main"]


def http_library(sdk: ModuleType) -> ModuleType:
    """The HTTP library an SDK's clients are built on: httpx, or httpx2 for newer openai releases."""
    base = next(k for k in sdk.DefaultHttpxClient.__mro__ if k.__name__ == "Client" and k.__module__ != sdk.__name__)
    return sys.modules[base.__module__.partition(".")[0]]


def _trust(endpoint: Endpoint, sdk: ModuleType) -> ssl.SSLContext:
    """The TLS context of an endpoint's client: its HTTP library's default trust (tls_context), but for an endpoint
    reached over plain HTTP (a model server on this machine, the offline stub), whose connections never use TLS: a
    context that verifies and trusts no certificate, made in microseconds (the CA bundle took 50-70 ms, the first
    client's of every process), so that an https hop from it would fail closed."""
    import ssl
    from urllib.parse import urlsplit

    if urlsplit(endpoint.base_url or "").scheme == "http":
        return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    return tls_context(http_library(sdk).create_ssl_context)


_SHARED: dict[tuple[str, str | None, str, float, int], tuple[ModuleType, Any]] = {}
_SHARED_LOCK = threading.Lock()


def shared_client(endpoint: Endpoint, timeout: float, retries: int) -> tuple[ModuleType, Any]:
    """make_client's answer, made once per process for the same provider, key and limits: a craft's stages each ask
    for their model, and each new SDK client costs 40-80 ms (its HTTP pool, its TLS context). The clients hold no
    conversation; they are closed at exit."""
    key = (endpoint.sdk, endpoint.base_url, endpoint.api_key, timeout, retries)
    with _SHARED_LOCK:
        if key not in _SHARED:
            if not _SHARED:
                atexit.register(_close_shared)
            _SHARED[key] = make_client(endpoint, timeout, retries)
        return _SHARED[key]


def _close_shared() -> None:
    with _SHARED_LOCK:
        clients = [client for _sdk, client in _SHARED.values()]
        _SHARED.clear()
    for client in clients:
        client.close()


def _clip(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
