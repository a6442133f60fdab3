"""Choosing a model: --model, config, API keys; bad input fails fast with a clear ModelError; `flakebot models`."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from benchmarks.scenarios.gitserve import free_port
from flakebot import config
from flakebot.errors import ModelError
from flakebot.llm.providers import check_model, resolve_model
from flakebot.llm.script import Script
from flakebot.llm.stub_server import StubServer
from tests.conftest import json_result, run_cli

ASK = [{"role": "user", "content": "hi"}]
FAKE_GROQ_KEY = "gsk_" + "f4ke" * 12


def test_no_model_and_no_key_says_exactly_what_to_set() -> None:
    with pytest.raises(ModelError) as caught:
        check_model(None, config.load())
    assert "neither GROQ_API_KEY nor OPENAI_API_KEY is set" in caught.value.message
    assert "export GROQ_API_KEY" in (caught.value.fix or "") and "--model" in (caught.value.fix or "")


def test_keys_in_the_environment_pick_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = config.load()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai-key-123456")
    assert check_model(None, settings) == "openai:gpt-4.1-mini"
    monkeypatch.setenv("GROQ_API_KEY", FAKE_GROQ_KEY)
    assert check_model(None, settings) == "groq:openai/gpt-oss-120b"  # groq first
    assert check_model(None, config.load({"model": "openai:gpt-4o"})) == "openai:gpt-4o"  # config beats the keys
    assert check_model("openai", config.load({"model": "groq"})) == "openai:gpt-4.1-mini"  # --model beats config
    assert check_model("groq", config.load({"groq_model": "openai/gpt-oss-120b"})) == "groq:openai/gpt-oss-120b"


def test_self_hosted_specs_need_no_key() -> None:
    settings = config.load()
    assert check_model("ollama:qwen2.5-coder", settings) == "ollama:qwen2.5-coder"
    assert (
        check_model("openai-compatible:llama3@http://10.0.0.2:8000/v1", settings)
        == "openai-compatible:llama3@http://10.0.0.2:8000/v1"
    )


@pytest.mark.parametrize(
    ("spec", "message", "fix"),
    [
        (
            "anthropic:claude",
            "unknown model provider 'anthropic' in 'anthropic:claude'",
            "groq:, openai:, openai-compatible:, ollama:, scripted:",
        ),
        ("llama3", "unknown model provider 'llama3'", "e.g. groq:openai/gpt-oss-120b"),
        (
            "groq:openai/gpt-oss-120b",
            "GROQ_API_KEY is not set, and groq:openai/gpt-oss-120b needs it",
            "export GROQ_API_KEY=",
        ),
        ("openai:gpt-4o", "OPENAI_API_KEY is not set", "export OPENAI_API_KEY="),
        (
            "openai-compatible:llama3",
            "'openai-compatible:llama3' is not openai-compatible:<model>@<base_url>",
            "openai-compatible:qwen2.5-coder@http://",
        ),
        ("ollama:@http://x", "is not ollama:<model>[@<base_url>]", "ollama:qwen2.5-coder"),
        ("scripted:", "'scripted:' needs a script file", "scripted:FILE"),
        (
            "scripted:/nonexistent/s.json",
            "cannot read model script /nonexistent/s.json: No such file or directory",
            "existing file",
        ),
    ],
)
def test_bad_specs_fail_before_any_work(spec: str, message: str, fix: str) -> None:
    with pytest.raises(ModelError) as caught:
        resolve_model(spec, config.load())
    assert message in caught.value.message and fix in (caught.value.fix or "")


@pytest.mark.parametrize(
    ("script", "problem"),
    [
        ('{"turns": [{"content": "a"},]}', "is not valid JSON: Expecting value at line 1 column 29"),
        ('{"turns": [{"fault": {"kind": "503"}}]}', 'is not valid at turns[0].fault: must be {"kind": one of 429, 500'),
        (
            '{"turns": [{"content": "a", "expect": {"stdout_contains": "x"}}]}',
            "at turns[0].expect: unknown key(s) stdout_contains",
        ),
        (
            '{"stages": {"edit": [{"tool_calls": [{"arguments": {}}]}]}}',
            'at stages.edit[0].tool_calls[0]: must be {"name"',
        ),
        (
            '{"turns": [{"note": "nothing to say"}]}',
            'at turns[0]: needs "content", "tool_calls", "fault" or "response"',
        ),
        ('{"format": 2, "turns": []}', "at format: must be 1"),
        ('{"stages": {"spec": [{"content": "a"}]}, "sdk": "anthropic"}', "at sdk: must be one of openai, groq"),
        ("[]", "the top level must be a JSON object"),
    ],
)
def test_scripts_that_do_not_parse_are_refused_by_check_model(tmp_path: Path, script: str, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(script)
    with pytest.raises(ModelError) as caught:
        check_model(f"scripted:{path}", config.load())
    assert problem in caught.value.message and "docs/scripts.md" in (caught.value.fix or "")


def test_a_stage_the_script_lacks_is_named(tmp_path: Path) -> None:
    path = tmp_path / "staged.json"
    path.write_text(json.dumps({"stages": {"spec": [{"content": "a"}], "edit": [{"content": "b"}]}}))
    settings = config.load()
    assert check_model(f"scripted:{path}", settings) == f"scripted:{path}"  # craft's early check names no stage
    with pytest.raises(ModelError, match=r"has no turns for stage 'choose' \(stages: spec, edit\)"):
        check_model(f"scripted:{path}", settings, stage="choose")
    with pytest.raises(ModelError, match="has only per-stage turns"):
        resolve_model(f"scripted:{path}", settings)


def test_unreachable_base_url_is_a_clear_model_error(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = config.load({"model_retries": 0, "model_timeout": 2})
    with (
        resolve_model(f"openai-compatible:m@http://127.0.0.1:{port}/v1", settings) as model,
        pytest.raises(ModelError) as caught,
    ):
        model.complete(ASK)
    assert caught.value.message.startswith(
        f"cannot reach openai-compatible:m@http://127.0.0.1:{port}/v1 at http://127.0.0.1:{port}/v1/ (ConnectError"
    )
    assert "server is running" in (caught.value.fix or "")


def test_groq_provider_uses_the_groq_sdk_key_and_price_table(monkeypatch: pytest.MonkeyPatch) -> None:
    turns = [{"content": "hello", "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000}}]
    with StubServer(turns) as server:
        monkeypatch.setenv("GROQ_API_KEY", FAKE_GROQ_KEY)
        monkeypatch.setenv("GROQ_BASE_URL", server.url)
        with resolve_model("groq", config.load()) as model:
            reply = model.complete(ASK)
    assert model.name == "groq:openai/gpt-oss-120b"
    assert reply.text == "hello" and reply.usage.cost_usd == pytest.approx(0.15 + 0.75)
    [request] = server.requests
    assert (
        request["path"] == "/openai/v1/chat/completions"
        and request["body"]["model"] == "openai/gpt-oss-120b"
        and request["authorized"]
    )


@pytest.mark.parametrize("spec", ["openai:gpt-4.1-mini", "openai-compatible:gpt-4.1-mini@{url}"])
def test_openai_providers_use_the_openai_sdk(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    with StubServer([{"tool_calls": [{"name": "read_file", "arguments": {"path": "Cargo.toml"}}]}]) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
        with resolve_model(spec.format(url=server.openai_url), config.load()) as model:
            reply = model.complete(ASK)
    assert reply.tool_calls[0].arguments == {"path": "Cargo.toml"}
    assert (
        server.requests[0]["path"] == "/v1/chat/completions" and server.requests[0]["body"]["model"] == "gpt-4.1-mini"
    )
    # priced only where the table knows the provider
    assert (reply.usage.cost_usd is not None) == spec.startswith("openai:")


def test_a_rejected_key_names_the_variable_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    invalid = {
        "status": 401,
        "response": {
            "error": {"message": "Invalid API Key", "type": "invalid_request_error", "code": "invalid_api_key"}
        },
    }
    with StubServer([invalid]) as server:
        monkeypatch.setenv("GROQ_API_KEY", FAKE_GROQ_KEY)
        monkeypatch.setenv("GROQ_BASE_URL", server.url)
        with resolve_model("groq", config.load()) as model, pytest.raises(ModelError) as caught:
            model.complete(ASK)
    assert (
        caught.value.message == "groq rejected the API key (401): Invalid API Key"
        and caught.value.fix == "check GROQ_API_KEY"
    )


def test_models_command_shows_keys_as_present_never_their_values() -> None:
    env = {"GROQ_API_KEY": FAKE_GROQ_KEY, "FLAKEBOT_OFFLINE": "1"}  # offline: the provider is not asked
    result = run_cli("models", "--json", env=env, check=True)
    report = json_result(result)
    assert report["default"] == {"model": "groq:openai/gpt-oss-120b", "source": "GROQ_API_KEY"}
    keys = {p["provider"]: p["key_present"] for p in report["providers"]}
    assert keys == {"groq": True, "openai": False, "openai-compatible": False, "ollama": False, "scripted": False}
    table = run_cli("models", env={**env, "COLUMNS": "200"}, check=True)
    assert "GROQ_API_KEY set" in table.stdout and "OPENAI_API_KEY NOT SET" in table.stdout
    assert "default: groq:openai/gpt-oss-120b (from GROQ_API_KEY)" in table.stdout
    assert FAKE_GROQ_KEY not in result.stdout + result.stderr + table.stdout + table.stderr


@pytest.mark.parametrize("served", ["openai/gpt-oss-120b", "moonshotai/kimi-k2-instruct-0905"])
def test_models_command_asks_the_provider_what_it_serves(served: str) -> None:
    """Through the real groq SDK against a server on 127.0.0.1 that lists one model: a default it does not list warns."""
    with StubServer(Script(turns=[], model=served)) as server:
        env = {"GROQ_API_KEY": FAKE_GROQ_KEY, "GROQ_BASE_URL": server.url, "COLUMNS": "200"}
        report = json_result(run_cli("models", "--json", env=env, check=True))
        table = run_cli("models", env=env, check=True)
    groq = next(p for p in report["providers"] if p["provider"] == "groq")
    assert groq["served"] == [served] and f"groq serves 1 models: {served}" in table.stdout
    listed = served == "openai/gpt-oss-120b"
    assert (report["warnings"] == []) == listed
    assert ("warning: groq:openai/gpt-oss-120b is not among the 1 models groq serves now" in table.stdout) != listed


def test_models_command_says_when_the_provider_cannot_be_asked() -> None:
    env = {"GROQ_API_KEY": FAKE_GROQ_KEY, "GROQ_BASE_URL": f"http://127.0.0.1:{free_port()}"}
    report = json_result(run_cli("models", "--json", env=env, check=True))
    groq = next(p for p in report["providers"] if p["provider"] == "groq")
    assert groq["served"] is None and groq["served_error"].startswith("cannot list groq's models: Connection error")


def test_models_command_without_keys_says_what_to_set() -> None:
    result = run_cli("models", check=True, env={"COLUMNS": "200"})
    assert "default: none. no model chosen" in result.stdout and "export GROQ_API_KEY" in result.stdout


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("nope:x", "unknown model provider 'nope'"),
        (None, "no model chosen"),
        ("scripted:missing.json", "cannot read model script missing.json"),
    ],
)
def test_craft_with_an_unusable_model_stops_before_any_work(workdir: Path, model: str | None, message: str) -> None:
    result = run_cli(
        "craft", *(["--model", model] if model else []), "--fresh", "need a csv deduper", env={"COLUMNS": "300"}
    )
    assert result.returncode == 30, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())


@pytest.mark.parametrize("sdk", ["openai", "groq"])
def test_model_clients_read_the_trust_store_once_and_still_check_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sdk: str
) -> None:
    """Every client of an SDK verifies TLS with the one context its HTTP library makes by default, read once per
    process (flakebot.llm.chat.tls_context: 50-70 ms a client). A model served over TLS with a certificate nobody
    trusts is refused by every client; trusted through SSL_CERT_FILE (as the SDK's own default honours it), answered."""
    import ssl

    from flakebot.llm.chat import Endpoint, make_client
    from tests.team.test_front import self_signed

    cert, key = self_signed(tmp_path)
    server = StubServer([])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server._httpd.socket = context.wrap_socket(server._httpd.socket, server_side=True)
    url = server.url.replace("http://", "https://") + ("/v1" if sdk == "openai" else "")
    endpoint = Endpoint(name=f"{sdk}:m", provider=sdk, model="m", sdk=sdk, api_key="k", base_url=url)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)

    def models(client: object) -> list[str]:
        return [m.id for m in client.models.list().data]  # type: ignore[attr-defined]

    with server:
        first, second = (make_client(endpoint, 10.0, 0) for _ in range(2))
        pools = [client._client._transport._pool for _, client in (first, second)]  # the HTTP library's own
        assert pools[0]._ssl_context is pools[1]._ssl_context
        for module, client in (first, second):
            with pytest.raises(module.APIConnectionError):
                models(client)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        trusting = make_client(endpoint, 10.0, 0)[1]
        assert models(trusting) == [server.script.model]
        with pytest.raises(first[0].APIConnectionError):  # a client made before keeps the trust it was made with
            models(first[1])
        for _, client in (first, second, (None, trusting)):
            client.close()


def test_a_model_over_plain_http_is_reached_without_reading_the_trust_store() -> None:
    """A model server reached over http:// (one on this machine, the offline stub) never uses TLS; its client read the
    CA bundle all the same (50-70 ms, the first model client of every craft). Now its context trusts no certificate:
    made at once, it still answers over HTTP, and it verifies, so an https hop from it would be refused."""
    import ssl

    from flakebot.llm.chat import Endpoint, make_client

    server = StubServer([])
    with server:
        for sdk, url in (("openai", server.openai_url), ("groq", server.url)):
            endpoint = Endpoint(name=f"{sdk}:m", provider=sdk, model="m", sdk=sdk, api_key="k", base_url=url)
            _, client = make_client(endpoint, 10.0, 0)
            context = client._client._transport._pool._ssl_context
            assert context.cert_store_stats()["x509_ca"] == 0 and context.verify_mode == ssl.CERT_REQUIRED
            assert [m.id for m in client.models.list().data] == [server.script.model]
            client.close()
