"""The stub chat-completions server, talked to by the plain openai and groq SDKs (no flakebot client code)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import groq
import httpx
import openai

from flakebot.llm.stub_server import TOOL_USE_FAILED, StubServer, completion_body
from tests.conftest import FIXTURES, REPO

HELLO = REPO / "tests/fixtures/scripts/hello-tool.json"
TOOL_CALL_BODY = json.loads((FIXTURES / "llm/groq-tool-call-response.json").read_text())


def test_stub_server_process_answers_the_plain_openai_sdk_with_a_scripted_tool_call() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "flakebot.llm.stub_server", "--script", str(HELLO), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        with openai.OpenAI(base_url=url, api_key="anything", max_retries=0, timeout=10) as client:
            first = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "run the tests"}])
            call = first.choices[0].message.tool_calls[0]
            assert (call.function.name, json.loads(call.function.arguments)) == ("run_tests", {"filter": "dedupe"})
            assert first.choices[0].finish_reason == "tool_calls" and first.usage.prompt_tokens == 420
            history = [
                {"role": "user", "content": "run the tests"},
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "test result: ok. 3 passed"},
            ]
            second = client.chat.completions.create(model="any", messages=history)
            assert second.choices[0].message.content == "All tests pass."
        recorded = httpx.get(url.removesuffix("/v1") + "/_stub/requests").json()
        assert [r["path"] for r in recorded["requests"]] == ["/v1/chat/completions"] * 2
        assert recorded["requests"][0]["authorized"] and "anything" not in json.dumps(recorded)
        assert recorded["turns_left"] == 0 and recorded["failures"] == []
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        proc.stdout.close()


def test_stub_server_process_refuses_a_broken_script(tmp_path: Path) -> None:
    script = tmp_path / "broken.json"
    script.write_text('{"turns": [{"content": "hi"},]}')
    result = subprocess.run(
        [sys.executable, "-m", "flakebot.llm.stub_server", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 30
    assert "is not valid JSON" in result.stderr and "line 1" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_groq_sdk_parses_the_real_groq_body_served_verbatim() -> None:
    with (
        StubServer([{"response": TOOL_CALL_BODY}]) as server,
        groq.Groq(base_url=server.url, api_key="k", max_retries=0) as client,
    ):
        reply = client.chat.completions.create(
            model="moonshotai/kimi-k2-instruct-0905", messages=[{"role": "user", "content": "weather?"}]
        )
    assert reply.choices[0].message.tool_calls[0].function.arguments == '{"location":"Florence,Italy"}'
    assert reply.choices[0].message.content is None
    assert server.requests[0]["path"] == "/openai/v1/chat/completions"


def test_stub_tool_use_failed_body_is_groqs_real_body() -> None:
    assert TOOL_USE_FAILED == json.loads((FIXTURES / "llm/groq-tool-use-failed-400.json").read_text())


def test_stub_reply_has_the_shape_of_groqs_tool_call_reply() -> None:
    body = completion_body(
        {"tool_calls": [{"name": "weather", "arguments": {"location": "Florence,Italy"}}]}, {"model": "m"}, 0, "m"
    )
    message, real = body["choices"][0]["message"], TOOL_CALL_BODY["choices"][0]["message"]
    assert set(message) == set(real) == {"role", "tool_calls"}
    assert set(message["tool_calls"][0]) == set(real["tool_calls"][0])
    assert set(body) <= set(TOOL_CALL_BODY) and body["choices"][0]["finish_reason"] == "tool_calls"


def test_expectation_mismatch_is_a_400_naming_the_turn_and_what_differed() -> None:
    turns = [{"content": "ok", "expect": {"last_tool_result_contains": "error[E0425]"}}]
    with StubServer(turns) as server, openai.OpenAI(base_url=server.openai_url, api_key="k", max_retries=2) as client:
        messages = [
            {"role": "user", "content": "fix it"},
            {"role": "tool", "tool_call_id": "c1", "content": "error[E0308]: mismatched types"},
        ]
        try:
            client.chat.completions.create(model="m", messages=messages)
        except openai.BadRequestError as exc:
            assert exc.code == "script_expectation_failed"
            assert "script expectation failed: turn 0" in exc.message and "error[E0308]" in exc.message
        else:
            raise AssertionError("the stub accepted a request its script did not expect")
    assert len(server.requests) == 1  # not retried
    assert server.failures and server.failures[0].startswith("script expectation failed")


def test_closing_the_server_ends_a_slow_reply_and_every_thread() -> None:
    import threading

    before = threading.active_count()
    server = StubServer([{"fault": {"kind": "slow", "seconds": 60}, "content": "never"}]).start()
    client = httpx.Client(timeout=0.2)
    try:
        client.post(server.openai_url + "/chat/completions", json={"model": "m", "messages": []})
    except httpx.ReadTimeout:
        pass
    finally:
        client.close()
    server.close()
    assert threading.active_count() == before
    try:
        httpx.get(server.url + "/v1/models", timeout=1)
    except httpx.ConnectError:
        pass
    else:
        raise AssertionError("the server still answers after close()")
