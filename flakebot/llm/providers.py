"""Model choice: a "provider:model" string from --model, the config or the API keys present -> a Model.

    groq:<model>                          Groq's API (GROQ_API_KEY; GROQ_BASE_URL overrides the URL)
    openai:<model>                        OpenAI's API (OPENAI_API_KEY; OPENAI_BASE_URL overrides the URL)
    openai-compatible:<model>@<base_url>  vLLM, llama.cpp, LM Studio...; OPENAI_COMPATIBLE_API_KEY if it wants a key
    ollama:<model>[@<base_url>]           Ollama's OpenAI endpoint, http://localhost:11434/v1 by default
    scripted:<file>                       replays a script (docs/scripts.md) through a stub server on 127.0.0.1

A bare provider name ("groq", "openai") takes the model from the groq_model / openai_model settings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import ModelError
from flakebot.llm.budget import Budget
from flakebot.llm.chat import ChatModel, Endpoint
from flakebot.llm.prices import price_for
from flakebot.llm.script import check_script, load_script
from flakebot.llm.served import served_models
from flakebot.llm.stub_server import StubServer
from flakebot.llm.transcript import Transcript

OLLAMA_URL = "http://localhost:11434/v1"
COMPATIBLE_KEY_ENV = "OPENAI_COMPATIBLE_API_KEY"


@dataclass(frozen=True)
class Provider:
    """One entry of the provider table: how "NAME:REST" becomes an Endpoint (`endpoint(provider, rest, spec,
    settings)`), and what `flakebot models` says of it. A new provider is one entry here and its endpoint function."""

    name: str
    sdk: str
    usage: str
    endpoint: Callable[[Provider, str, str, Settings], Endpoint]
    key_env: str | None = None  # required key; None: the provider needs none
    base_url_env: str | None = None
    optional_key_env: str | None = None  # a key sent when set (a self-hosted server that wants one)
    default_url: str | None = None
    model_setting: str | None = None  # the setting naming the model when only the provider is given
    example: str = ""


def _hosted(provider: Provider, rest: str, spec: str, settings: Settings) -> Endpoint:
    assert provider.key_env is not None and provider.model_setting is not None
    model = rest or settings.get(provider.model_setting)
    key = os.environ.get(provider.key_env, "").strip()
    if not key:
        raise ModelError(
            f"{provider.key_env} is not set, and {provider.name}:{model} needs it",
            fix=f"export {provider.key_env}=... ({KEY_HELP[provider.key_env]}) or choose another model with --model",
        )
    base_url = os.environ.get(provider.base_url_env or "") or None
    name = f"{provider.name}:{model}"
    return Endpoint(
        name, provider.name, model, provider.sdk, key, base_url, provider.key_env, price_for(provider.name, model)
    )


def _self_hosted(provider: Provider, rest: str, spec: str, settings: Settings) -> Endpoint:
    model, at, url = rest.rpartition("@") if "@" in rest else (rest, "", "")
    url = url if at else provider.default_url or ""
    if not model or not url.startswith(("http://", "https://")):
        raise ModelError(f"'{spec}' is not {provider.usage}", fix=f"write it like {provider.example}")
    key = os.environ.get(COMPATIBLE_KEY_ENV) or "not-needed"
    return Endpoint(
        f"{provider.name}:{rest}", provider.name, model, "openai", key, url, COMPATIBLE_KEY_ENV,
        price_for(provider.name, model),
    )  # fmt: skip


def _scripted(provider: Provider, rest: str, spec: str, settings: Settings) -> Endpoint:
    if not rest:
        raise ModelError("'scripted:' needs a script file", fix="pass --model scripted:FILE (format: docs/scripts.md)")
    return Endpoint(f"scripted:{rest}", "scripted", "scripted", "openai", "scripted-no-key")


PROVIDERS = {
    p.name: p
    for p in (
        Provider("groq", "groq", "groq:<model>", _hosted, "GROQ_API_KEY", "GROQ_BASE_URL", model_setting="groq_model"),
        Provider(
            "openai",
            "openai",
            "openai:<model>",
            _hosted,
            "OPENAI_API_KEY",
            "OPENAI_BASE_URL",
            model_setting="openai_model",
        ),  # fmt: skip
        Provider(
            "openai-compatible",
            "openai",
            "openai-compatible:<model>@<base_url>",
            _self_hosted,
            optional_key_env=COMPATIBLE_KEY_ENV,
            example="openai-compatible:qwen2.5-coder@http://localhost:8000/v1",
        ),  # fmt: skip
        Provider(
            "ollama",
            "openai",
            "ollama:<model>[@<base_url>]",
            _self_hosted,
            optional_key_env=COMPATIBLE_KEY_ENV,
            default_url=OLLAMA_URL,
            example="ollama:qwen2.5-coder",
        ),  # fmt: skip
        Provider("scripted", "openai", "scripted:<file.json>", _scripted),
    )
}
# Which key picks the provider when no model is chosen, in order.
KEY_PROVIDERS = (("GROQ_API_KEY", "groq"), ("OPENAI_API_KEY", "openai"))
KEY_HELP = {"GROQ_API_KEY": "https://console.groq.com/keys", "OPENAI_API_KEY": "https://platform.openai.com/api-keys"}


def choose(spec: str | None, settings: Settings) -> tuple[str, str]:
    """The model spec to use and where it came from: --model, then the config, then the API keys present."""
    if spec:
        return spec.strip(), "--model"
    if settings.model:
        return settings.model.strip(), "config 'model'"
    for env, provider in KEY_PROVIDERS:
        if os.environ.get(env):
            return provider, env
    raise ModelError(
        "no model chosen: no --model, no 'model' in the config, and neither GROQ_API_KEY nor OPENAI_API_KEY is set",
        fix="export GROQ_API_KEY=... (https://console.groq.com/keys), or pass --model ollama:<model> (local) or --model scripted:FILE (a model script)",
    )


def endpoint_for(spec: str, settings: Settings) -> Endpoint:
    """Parse a spec and check its key, without touching the network."""
    name, _, rest = spec.partition(":")
    provider = PROVIDERS.get(name)
    if provider is None:
        known = ", ".join(f"{known}:" for known in PROVIDERS)
        raise ModelError(
            f"unknown model provider '{name}' in '{spec}'",
            fix=f"use one of {known} (e.g. groq:{settings.groq_model})",
        )
    return provider.endpoint(provider, rest.strip(), spec, settings)


def check_model(spec: str | None, settings: Settings, *, stage: str | None = None) -> str:
    """Validate the model choice without network (provider known, key present, script parses); its "provider:model" name.

    With `stage`, a script must also have turns for that stage; without, every stage of it is checked.
    """
    endpoint = endpoint_for(choose(spec, settings)[0], settings)
    if endpoint.provider == "scripted" and stage is None:
        check_script(_script_path(endpoint))
    elif endpoint.provider == "scripted":
        load_script(_script_path(endpoint), stage)
    return endpoint.name


def resolve_model(
    spec: str | None,
    settings: Settings,
    *,
    stage: str | None = None,
    transcript: Transcript | None = None,
    budget: Budget | None = None,
) -> ChatModel:
    """The Model for `spec` (None: config, then API keys). Without `budget`, the settings' limits apply to this model alone.

    A scripted model serves `stage`'s turns from a stub server it owns; close() (or the with-block) stops it.
    """
    endpoint = endpoint_for(choose(spec, settings)[0], settings)
    server = None
    if endpoint.provider == "scripted":
        script = load_script(_script_path(endpoint), stage)
        server = StubServer(script).start()
        base_url = server.openai_url if script.sdk == "openai" else server.url
        endpoint = replace(endpoint, model=script.model, sdk=script.sdk, base_url=base_url, price=script.price)
    try:
        return ChatModel(
            endpoint,
            timeout=settings.model_timeout,
            retries=settings.model_retries,
            stage=stage,
            transcript=transcript,
            budget=budget if budget is not None else Budget.from_settings(settings),
            server=server,
        )
    except BaseException:
        if server is not None:
            server.close()
        raise


def _script_path(endpoint: Endpoint) -> Path:
    return Path(endpoint.name.partition(":")[2]).expanduser()


def describe(settings: Settings, *, ask: bool = True) -> dict[str, Any]:
    """Providers, the default model and whether each key is present (never a key's value), for `flakebot models`.

    With `ask` (and a key), each hosted provider is asked which models it serves; a default it does not serve is
    a warning in the report.
    """
    try:
        spec, source = choose(None, settings)
        default: dict[str, Any] = {"model": endpoint_for(spec, settings).name, "source": source}
    except ModelError as exc:
        default = {"model": None, "error": exc.one_line()}
    providers = []
    warnings = []
    for p in PROVIDERS.values():
        key_env = p.key_env or p.optional_key_env
        entry: dict[str, Any] = {
            "provider": p.name,
            "usage": p.usage,
            "sdk": p.sdk,
            "key_env": key_env,
            "key_required": p.key_env is not None,
        }
        entry["key_present"] = bool(key_env and os.environ.get(key_env))
        entry["default_model"] = settings.get(p.model_setting) if p.model_setting else None
        entry["base_url"] = os.environ.get(p.base_url_env or "") or p.default_url
        if ask and p.key_env is not None and entry["key_present"]:
            served, error = served_models(endpoint_for(p.name, settings), settings.connect_timeout)
            entry["served"], entry["served_error"] = (served or None), (error or None)
            if served and entry["default_model"] not in served:
                warnings.append(
                    f"{p.name}:{entry['default_model']} is not among the {len(served)} models {p.name} serves now; "
                    f"pick one of them with --model {p.name}:NAME or the {p.name}_model setting"
                )
        providers.append(entry)
    return {"default": default, "providers": providers, "warnings": warnings}
