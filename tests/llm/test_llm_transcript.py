"""transcript.jsonl records, and secrets never reaching a transcript, run.log or run state."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.errors import FlakebotError, ModelError
from flakebot.llm.providers import resolve_model
from flakebot.llm.stub_server import StubServer
from flakebot.llm.transcript import TRANSCRIPT_FORMAT, Transcript
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.engine import Stage, StageContext
from flakebot.pipeline.request import RunRequest
from flakebot.pipeline.run import list_runs
from flakebot.redact import REDACTED, redact

FAKE_KEY = "gsk_" + "S3cr3tV4lue" * 4


def test_records_are_versioned_lines_in_order(tmp_path: Path) -> None:
    transcript = Transcript(tmp_path / "run" / "transcript.jsonl")
    transcript.record("tool_call", name="read_file", arguments={"path": "src/main.rs"})
    transcript.record("tool_result", name="read_file", output="fn main() {}")
    lines = (tmp_path / "run" / "transcript.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["kind"] for r in records] == ["tool_call", "tool_result"]
    assert all(r["format"] == TRANSCRIPT_FORMAT and isinstance(r["time"], float) for r in records)
    assert records[0]["arguments"] == {"path": "src/main.rs"} and transcript.read() == records


def test_redaction_of_env_keys_headers_and_key_shaped_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GROQ_API_KEY", FAKE_KEY)
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_tokentokentoken")
    monkeypatch.setenv("SOME_SETTING", "not-a-secret-value")
    data = {
        "headers": {"Authorization": "Bearer anything-at-all", "X-Api-Key": "k", "user-agent": "groq/1.7"},
        "text": f"key {FAKE_KEY} and ghp_tokentokentoken and sk-proj-abcdefghijklmnop and gsk_abcdefghijklmnop",
        "log": "curl -H 'Authorization: Bearer abc.def-ghi_jkl' ...",
        "nested": [{"api_key": "whatever"}, "not-a-secret-value"],
    }
    assert redact(data) == {
        "headers": {"Authorization": REDACTED, "X-Api-Key": REDACTED, "user-agent": "groq/1.7"},
        "text": f"key {REDACTED} and {REDACTED} and {REDACTED} and {REDACTED}",
        "log": f"curl -H 'Authorization: Bearer {REDACTED}' ...",
        "nested": [{"api_key": REDACTED}, "not-a-secret-value"],
    }


def talk(ctx: StageContext) -> dict[str, Any]:
    """A stage that pastes the key into a prompt, gets it echoed back, then meets a 401 quoting it."""
    transcript = Transcript(ctx.run.transcript_path)
    with resolve_model(ctx.request.model, ctx.settings, stage=ctx.stage, transcript=transcript) as model:
        reply = model.complete([{"role": "user", "content": f"my key is {os.environ['GROQ_API_KEY']}"}])
        ctx.progress("the model answered", tokens=reply.usage.total_tokens)
        model.complete([{"role": "user", "content": "again"}])
    return {}


STAGES = [Stage("talk", talk)]


def test_a_key_never_reaches_the_transcript_run_log_or_state(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    turns = [
        {"content": f"I see your key {FAKE_KEY}"},
        {
            "status": 401,
            "response": {
                "error": {
                    "message": f"Invalid API Key {FAKE_KEY}",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
        },
    ]
    with StubServer(turns) as server:
        monkeypatch.setenv("GROQ_API_KEY", FAKE_KEY)
        monkeypatch.setenv("GROQ_BASE_URL", server.url)
        with pytest.raises(ModelError, match=r"Invalid API Key \[REDACTED\]"):
            pipeline.start(f"{__name__}:STAGES", workdir, config.load(), RunRequest(need="need", model="groq"))
    [run] = list_runs(workdir)
    assert run.state["status"] == "failed" and server.requests[0]["authorized"]
    written = {
        name: (run.dir / name).read_text() for name in ("transcript.jsonl", "run.log", "events.jsonl", "state.json")
    }
    for name, text in written.items():
        assert FAKE_KEY not in text, f"the key leaked into {name}"
    assert "groq rejected the API key (401): Invalid API Key [REDACTED]" in written["run.log"]
    kinds = [r["kind"] for r in Transcript(run.transcript_path).read()]
    assert kinds == ["model_start", "model_request", "model_reply", "model_request", "model_error"]
    assert (
        "my key is [REDACTED]" in written["transcript.jsonl"]
        and "I see your key [REDACTED]" in written["transcript.jsonl"]
    )
    assert FAKE_KEY not in json.dumps(server.requests[1:])  # the stub records whether a key came, never the key


def test_a_model_error_message_quoting_a_key_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-proj-0123456789abcdef")
    invalid = {
        "status": 401,
        "response": {
            "error": {"message": "Incorrect API key provided: sk-proj-0123456789abcdef.", "code": "invalid_api_key"}
        },
    }
    with StubServer([invalid]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
        with resolve_model("openai", config.load()) as model, pytest.raises(ModelError) as caught:
            model.complete([{"role": "user", "content": "hi"}])
    assert isinstance(caught.value, FlakebotError) and "sk-proj" not in caught.value.one_line()
    assert caught.value.message == "openai rejected the API key (401): Incorrect API key provided: [REDACTED]."
