"""The Model flakebot uses, over the real groq and openai SDKs talking HTTP to the stub server: faults and recovery."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.errors import ModelError
from flakebot.llm.chat import ChatModel
from flakebot.llm.providers import check_model, resolve_model
from flakebot.llm.transcript import Transcript
from tests.conftest import FIXTURES, REPO

SDKS = ["openai", "groq"]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
    }
]
ASK = [{"role": "user", "content": "go"}]


def scripted(
    tmp_path: Path, turns: list[dict[str, Any]], *, timeout: float = 2.0, retries: int = 1, **script: Any
) -> ChatModel:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"format": 1, "turns": turns, **script}))
    settings = config.load({"model_timeout": timeout, "model_retries": retries})
    return resolve_model(f"scripted:{path}", settings, transcript=Transcript(tmp_path / "transcript.jsonl"))


def retries_recorded(tmp_path: Path) -> list[str]:
    return [r["reason"] for r in Transcript(tmp_path / "transcript.jsonl").read() if r["kind"] == "model_retry"]


@pytest.mark.parametrize("sdk", SDKS)
def test_real_groq_tool_call_body_parses_into_a_reply(tmp_path: Path, sdk: str) -> None:
    body = json.loads((FIXTURES / "llm/groq-tool-call-response.json").read_text())
    with scripted(tmp_path, [{"response": body}], sdk=sdk) as model:
        reply = model.complete(ASK, TOOLS)
    assert (
        reply.text == "" and reply.finish_reason == "tool_calls" and reply.model == "moonshotai/kimi-k2-instruct-0905"
    )
    [call] = reply.tool_calls
    assert (call.id, call.name, call.arguments, call.error) == (
        "functions.weather:0",
        "weather",
        {"location": "Florence,Italy"},
        None,
    )
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (93, 21, 114)
    assert reply.latency > 0
    assert reply.to_message()["tool_calls"][0]["function"]["arguments"] == '{"location":"Florence,Italy"}'


@pytest.mark.parametrize("sdk", SDKS)
def test_429_waits_for_retry_after_then_gets_the_next_turn(tmp_path: Path, sdk: str) -> None:
    with scripted(
        tmp_path, [{"fault": {"kind": "429", "retry_after": 1}}, {"content": "after the wait"}], sdk=sdk
    ) as model:
        reply = model.complete(ASK)
        times = [r["time"] for r in model.server.requests]
    assert reply.text == "after the wait"
    assert len(times) == 2 and times[1] - times[0] >= 1.0  # the SDK honoured Retry-After: 1


@pytest.mark.parametrize("sdk", SDKS)
def test_429_until_retries_run_out_is_a_clear_model_error(tmp_path: Path, sdk: str) -> None:
    rate_limited = {"fault": {"kind": "429", "retry_after": 0.1}}
    with (
        scripted(tmp_path, [rate_limited, rate_limited, {"content": "never reached"}], sdk=sdk) as model,
        pytest.raises(ModelError) as caught,
    ):
        model.complete(ASK)
    assert "rate limited (429, 2 attempt(s))" in caught.value.message and "resume" in (caught.value.fix or "")


@pytest.mark.parametrize("sdk", SDKS)
@pytest.mark.parametrize("kind", ["500", "reset"])
def test_server_errors_and_resets_are_retried_by_the_sdk(tmp_path: Path, sdk: str, kind: str) -> None:
    with scripted(tmp_path, [{"fault": {"kind": kind}}, {"content": f"after {kind}"}], sdk=sdk) as model:
        assert model.complete(ASK).text == f"after {kind}"
        assert [r["turn"] for r in model.server.requests] == [0, 1]


@pytest.mark.parametrize("sdk", SDKS)
def test_a_timeout_is_retried_and_the_retry_gets_the_next_turn(tmp_path: Path, sdk: str) -> None:
    turns = [{"fault": {"kind": "slow", "seconds": 3}, "content": "too late"}, {"content": "in time"}]
    with scripted(tmp_path, turns, timeout=0.3, sdk=sdk) as model:
        assert model.complete(ASK).text == "in time"


def test_a_slow_reply_within_the_timeout_arrives(tmp_path: Path) -> None:
    with scripted(tmp_path, [{"fault": {"kind": "slow", "seconds": 0.2}, "content": "slow but fine"}]) as model:
        reply = model.complete(ASK)
    assert reply.text == "slow but fine" and reply.latency >= 0.2


def test_timeouts_until_retries_run_out_are_a_clear_model_error(tmp_path: Path) -> None:
    slow = {"fault": {"kind": "slow", "seconds": 30}, "content": "too late"}
    with scripted(tmp_path, [slow, slow], timeout=0.3, retries=1) as model, pytest.raises(ModelError) as caught:
        model.complete(ASK)
    assert (
        caught.value.message
        == "scripted:" + str(tmp_path / "script.json") + " did not answer within 0.3s (2 attempt(s))"
    )
    assert "model_timeout" in (caught.value.fix or "")


@pytest.mark.parametrize("sdk", SDKS)
def test_malformed_json_is_retried_by_flakebot(tmp_path: Path, sdk: str) -> None:
    with scripted(tmp_path, [{"fault": {"kind": "malformed_json"}}, {"content": "well formed"}], sdk=sdk) as model:
        assert model.complete(ASK).text == "well formed"
    assert retries_recorded(tmp_path) == ["malformed_response"]


def test_malformed_json_every_time_is_a_clear_model_error(tmp_path: Path) -> None:
    bad = {"fault": {"kind": "malformed_json"}}
    with (
        scripted(tmp_path, [bad, bad, bad], retries=1) as model,
        pytest.raises(ModelError, match="not a valid chat completion 2 times"),
    ):
        model.complete(ASK)


@pytest.mark.parametrize("sdk", SDKS)
def test_tool_use_failed_sends_the_model_its_text_and_the_error_then_retries(tmp_path: Path, sdk: str) -> None:
    failed = '<function=read_file>{"path": src/main.rs}</function>'
    turns = [
        {"fault": {"kind": "tool_use_failed", "failed_generation": failed}},
        {
            "tool_calls": [{"name": "read_file", "arguments": {"path": "src/main.rs"}}],
            "expect": {"last_user_contains": "Failed to call a function"},
        },
    ]
    messages = list(ASK)
    with scripted(tmp_path, turns, sdk=sdk) as model:
        reply = model.complete(messages, TOOLS)
        retry = model.server.requests[1]["body"]["messages"]
    assert reply.tool_calls[0].arguments == {"path": "src/main.rs"} and model.format_errors == 0
    assert retry[:-2] == ASK and retry[-2] == {"role": "assistant", "content": failed}
    assert messages == ASK  # the correction is for that call only; the caller's history is untouched


def test_three_tool_use_failures_in_a_row_stop_with_a_model_error(tmp_path: Path) -> None:
    failed = {"fault": {"kind": "tool_use_failed"}}
    with (
        scripted(tmp_path, [failed, failed, failed, {"content": "never reached"}]) as model,
        pytest.raises(ModelError) as caught,
    ):
        model.complete(ASK, TOOLS)
    assert (
        "3 malformed tool calls in a row" in caught.value.message
        and "Failed to call a function" in caught.value.message
    )
    assert model.server.turns_left == 1


def test_invalid_json_arguments_are_reported_on_the_tool_call_and_counted(tmp_path: Path) -> None:
    broken = {"tool_calls": [{"name": "read_file", "arguments": '{"path": src/main.rs'}]}
    clean = {"tool_calls": [{"name": "read_file", "arguments": {"path": "a"}}]}
    with scripted(tmp_path, [broken, broken, clean, broken, broken, broken]) as model:
        first = model.complete(ASK, TOOLS).tool_calls[0]
        assert first.arguments == {} and first.raw_arguments == '{"path": src/main.rs'
        assert first.error is not None and first.error.startswith(
            "arguments are not valid JSON: Expecting value at line 1 column 10"
        )
        model.complete(ASK, TOOLS)
        assert model.format_errors == 2
        # a clean reply resets the count
        assert model.complete(ASK, TOOLS).tool_calls[0].error is None and model.format_errors == 0
        model.complete(ASK, TOOLS)
        model.complete(ASK, TOOLS)
        with pytest.raises(ModelError, match="3 malformed tool calls in a row"):
            model.complete(ASK, TOOLS)


def test_arguments_that_are_json_but_not_an_object_are_an_error(tmp_path: Path) -> None:
    with scripted(tmp_path, [{"tool_calls": [{"name": "read_file", "arguments": "[1, 2]"}]}]) as model:
        assert model.complete(ASK, TOOLS).tool_calls[0].error == "arguments must be a JSON object, got list ('[1, 2]')"


def long_history(outputs: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "fix the build"},
    ]
    for i in range(outputs):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"output {i} " * 500},
        ]
    return messages + [{"role": "user", "content": "go on"}]


@pytest.mark.parametrize("sdk", SDKS)
def test_context_overflow_elides_the_oldest_tool_outputs_and_retries(tmp_path: Path, sdk: str) -> None:
    messages = long_history(4)
    turns = [
        {"fault": {"kind": "context_overflow"}},
        {"content": "fits now", "expect": {"last_tool_result_contains": "output 3"}},
    ]
    with scripted(tmp_path, turns, sdk=sdk) as model:
        reply = model.complete(messages)
        sent = [m["content"] for m in model.server.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert reply.text == "fits now" and reply.shrunk == 2
    assert [c.startswith("[elided by flakebot") for c in sent] == [True, True, False, False]
    assert [m["content"] for m in messages if m["role"] == "tool"] == sent  # shrunk in place: the next call fits too
    assert retries_recorded(tmp_path) == ["context_overflow"]


OPENAI_OVERFLOW = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9120 tokens. Please reduce the length of the messages."
GROQ_413 = "Request too large for model `llama-3.3-70b-versatile` on tokens per minute (TPM): Limit 12000, Requested 13431, please reduce your message size."


@pytest.mark.parametrize(
    ("status", "message", "code"), [(400, OPENAI_OVERFLOW, None), (413, GROQ_413, "rate_limit_exceeded")]
)
def test_providers_context_messages_are_recognised(tmp_path: Path, status: int, message: str, code: str | None) -> None:
    overflow = {
        "status": status,
        "response": {"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": code}},
    }
    with scripted(tmp_path, [overflow, {"content": "ok"}]) as model:
        assert model.complete(long_history(1)).shrunk == 1


def test_overflow_with_nothing_left_to_elide_is_a_clear_model_error(tmp_path: Path) -> None:
    overflow = {"fault": {"kind": "context_overflow"}}
    with (
        scripted(tmp_path, [overflow] * 5) as model,
        pytest.raises(ModelError, match="does not fit .* context window even with old tool outputs elided"),
    ):
        model.complete(long_history(2))


def test_expectation_mismatch_fails_loudly(tmp_path: Path) -> None:
    turns = [{"content": "fixed", "expect": {"last_tool_result_contains": "error[E0425]"}}]
    messages = [*ASK, {"role": "tool", "tool_call_id": "c", "content": "test result: FAILED. error[E0308]"}]
    with scripted(tmp_path, turns) as model, pytest.raises(ModelError) as caught:
        model.complete(messages)
    assert caught.value.message.startswith("script expectation failed: turn 0 of ")
    assert (
        "expected 'error[E0425]' in the last tool message, got 'test result: FAILED. error[E0308]'"
        in caught.value.message
    )
    assert caught.value.exit_code == 30
    assert Transcript(tmp_path / "transcript.jsonl").read()[-1]["kind"] == "model_error"


def test_running_out_of_turns_is_a_clear_model_error(tmp_path: Path) -> None:
    with scripted(tmp_path, [{"content": "only one"}]) as model:
        model.complete(ASK)
        with pytest.raises(ModelError, match=r"script ran out of turns: request #2 came after all 1 turns of "):
            model.complete(ASK)


def test_usage_counts_cached_tokens_and_costs_them_at_the_cached_price(tmp_path: Path) -> None:
    price = {"input": 1.0, "output": 2.0, "cached_input": 0.5}
    with scripted(
        tmp_path,
        [{"content": "x", "usage": {"prompt_tokens": 1000, "completion_tokens": 500, "cached_tokens": 400}}],
        price=price,
    ) as model:
        usage = model.complete(ASK).usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (1000, 500, 400)
    assert usage.cost_usd == pytest.approx((600 * 1.0 + 400 * 0.5 + 500 * 2.0) / 1e6)


def test_stage_selects_that_stages_turns(tmp_path: Path) -> None:
    path = tmp_path / "staged.json"
    path.write_text(
        json.dumps(
            {
                "stages": {"spec": [{"content": "the spec"}], "edit": [{"content": "the edit"}]},
                "turns": [{"content": "any other"}],
            }
        )
    )
    settings = config.load()
    for stage, text in (("edit", "the edit"), ("spec", "the spec"), ("choose", "any other"), (None, "any other")):
        with resolve_model(f"scripted:{path}", settings, stage=stage) as model:
            assert model.complete(ASK).text == text


def test_close_leaves_no_threads_and_stops_the_server(tmp_path: Path) -> None:
    before = threading.active_count()
    model = scripted(tmp_path, [{"content": "hi"}])
    model.complete(ASK)
    url = model.server.url
    model.close()
    model.close()  # twice is fine
    assert threading.active_count() == before
    import httpx

    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/v1/models", timeout=1)


def test_a_closed_model_refuses_to_complete(tmp_path: Path) -> None:
    model = scripted(tmp_path, [{"content": "hi"}])
    model.close()
    with pytest.raises(ModelError, match="used after close"):
        model.complete(ASK)


def test_the_shipped_fault_script_replays_as_documented(tmp_path: Path) -> None:
    settings = config.load({"model_timeout": 0.5, "model_retries": 2})
    with resolve_model(f"scripted:{REPO / 'tests/fixtures/scripts/faults.json'}", settings) as model:
        texts = [model.complete(ASK).text for _ in range(5)]
        call = model.complete(ASK, TOOLS).tool_calls[0]
        last = model.complete(long_history(2))
        assert model.server.turns_left == 0
    assert texts == [
        f"answered after {what}"
        for what in ("the rate limit", "a server error", "a connection reset", "a timeout", "a malformed body")
    ]
    assert (
        call.arguments == {"path": "src/main.rs"}
        and last.text == "answered after the history was shrunk"
        and last.shrunk == 1
    )


@pytest.mark.parametrize("name", ["hello-tool.json", "edit-fix-e0425.json", "faults.json"])
def test_shipped_scripts_pass_check_model(name: str) -> None:
    path = REPO / "tests/fixtures/scripts" / name
    assert check_model(f"scripted:{path}", config.load()) == f"scripted:{path}"


def test_the_stages_of_a_run_share_one_sdk_client_for_a_hosted_model(tmp_path: Path) -> None:
    """Each stage asks for its model; a hosted model's SDK client (its HTTP pool, its TLS context) is made once."""
    from flakebot.llm.chat import Endpoint
    from flakebot.llm.stub_server import StubServer

    with StubServer([{"content": "spec"}, {"content": "edit"}]) as server:
        endpoint = Endpoint(
            name="ollama:m", provider="ollama", model="m", sdk="openai", api_key="x", base_url=server.openai_url
        )
        spec = ChatModel(endpoint, timeout=2.0, retries=0, stage="spec")
        assert spec.complete(ASK).text == "spec"
        spec.close()
        edit = ChatModel(endpoint, timeout=2.0, retries=0, stage="edit")
        assert edit._client is spec._client  # the same client: not closed with the spec stage's model
        assert edit.complete(ASK).text == "edit"
        edit.close()


SDK_IN_A_FRESH_PROCESS = """
import sys
from flakebot.llm.chat import ChatModel, Endpoint
from flakebot.llm.stub_server import StubServer

sdk = sys.argv[1]
with StubServer([{"content": "answered"}]) as server:
    url = server.url if sdk == "groq" else server.openai_url
    endpoint = Endpoint(name="x:m", provider="x", model="m", sdk=sdk, api_key="k", base_url=url)
    model = ChatModel(endpoint, timeout=2.0, retries=0, stage="spec")
    print(model.complete([{"role": "user", "content": "go"}]).text)
    model.close()
print(sorted(name for name in ("httpx._main", "click", "rich", "pygments") if name in sys.modules))
import httpx._main  # noqa: E402  # once the SDK is imported, httpx's command-line client imports as before
print(httpx._main.main is not None)
"""


@pytest.mark.parametrize("sdk", SDKS)
def test_a_model_client_leaves_httpx_s_command_line_client_unimported(sdk: str) -> None:
    """The SDK's import leaves out httpx's command-line client (click, rich, pygments: ~50 ms of a craft's first
    model client), which flakebot never runs; the client answers as before, and the module can be imported after."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", SDK_IN_A_FRESH_PROCESS, sdk], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["answered", "[]", "True"]
