"""Settings: defaults, then ~/.config/flakebot/flakebot.toml, then ./flakebot.toml,
then FLAKEBOT_* environment variables, then command-line flags (last wins).

Every tunable is one field below with its default and a one-line docstring (`doc`).
Unknown keys fail at start-up, not halfway through a run.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.errors import ConfigError

if TYPE_CHECKING:
    import tomlkit

ENV_PREFIX = "FLAKEBOT_"
# Environment variables with the prefix that are not settings.
NON_SETTING_ENV = {"FLAKEBOT_RAISE_ERRORS"}


def _setting(default: Any, doc: str, choices: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"doc": doc, "choices": choices})


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "flakebot"


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "flakebot"


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flakebot"


@functools.cache
def rustup_home() -> Path:
    """rustup's home: RUSTUP_HOME when set; else the `.rustup` beside the `.cargo/bin` that `cargo` (rustup's proxy)
    is found in on PATH, so a process started with another HOME (hosts that isolate their servers' environment) still
    finds the toolchains; else ~/.rustup. Resolved once per process."""
    if os.environ.get("RUSTUP_HOME"):
        return Path(os.environ["RUSTUP_HOME"])
    for program in ("cargo", "rustup"):
        found = shutil.which(program)
        bin_dir = Path(found).parent if found else None  # not resolved: the proxy links to rustup beside it
        if bin_dir is not None and bin_dir.name == "bin" and (bin_dir.parent.parent / ".rustup").is_dir():
            return bin_dir.parent.parent / ".rustup"
    return Path.home() / ".rustup"


def state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state") / "flakebot"


@dataclass
class Settings:
    """Every setting flakebot reads, with its default."""

    # Not the current directory: an MCP server started elsewhere must find the runs `flakebot runs` lists.
    workdir: str = _setting(
        "",
        "Directory holding runs/; empty means $XDG_STATE_HOME/flakebot (relative paths are from the current directory).",
    )
    catalog_dir: str = _setting("", "Catalog of crafted tools; empty means $XDG_DATA_HOME/flakebot.")
    cache_dir: str = _setting("", "HTTP and index caches; empty means $XDG_CACHE_HOME/flakebot.")
    model: str = _setting(
        "", "Model as provider:name (groq:..., openai:..., ollama:..., scripted:FILE); empty picks from API keys."
    )
    groq_model: str = _setting(
        "openai/gpt-oss-120b",
        "Model used for groq when --model names only the provider (Groq's production tool-use model).",
    )
    openai_model: str = _setting("gpt-4.1-mini", "Model used for openai when --model names only the provider.")
    model_timeout: float = _setting(120.0, "Seconds to wait for one model reply.")
    model_retries: int = _setting(2, "Retries the SDKs make on 429/5xx/connection errors.")
    max_iterations: int = _setting(30, "Edit-loop iterations (model calls) before the loop stops.")
    max_cost: float = _setting(2.0, "USD a run may spend on model calls.")
    max_tokens: int = _setting(2_000_000, "Tokens (prompt + completion) a run may use.")
    max_wall_seconds: float = _setting(1800.0, "Wall-clock seconds the edit loop may take.")
    registry: str = _setting("auto", "Where to search crates: auto, crates-io, local, or a directory source path.")
    local_registry: str = _setting(
        "/usr/share/cargo/registry", "Cargo directory source used offline (Debian's packaged crates)."
    )
    offline: bool = _setting(False, "Never contact crates.io; use the local registry and cargo --offline.")
    cratesio_api_url: str = _setting("https://crates.io", "crates.io API base URL.")
    cratesio_static_url: str = _setting("https://static.crates.io", "Base URL for .crate downloads.")
    cratesio_index_url: str = _setting("https://index.crates.io", "Sparse index base URL.")
    contact: str = _setting("https://github.com/flakebot/flakebot", "Contact put in the User-Agent sent to crates.io.")
    http_cache_ttl: float = _setting(3600.0, "Seconds a cached crates.io answer stays fresh.")
    connect_timeout: float = _setting(3.0, "Seconds to wait when first connecting to crates.io before falling back.")
    cratesio_interval: float = _setting(
        1.0, "Seconds between crates.io API requests, shared by the whole process (their policy: at most 1 per second)."
    )
    cratesio_details: int = _setting(
        3,
        "Top crates.io search results whose version details (binaries, licence, yanked) refine the ranking; 1 request each.",
    )
    git_sources: str = _setting(
        "github.com,gitlab.com,codeberg.org,git.sr.ht,bitbucket.org",
        "Git dependencies host cargo may fetch: https hosts, or scheme://host:port/path prefixes (port and path optional; comma-separated).",
    )
    github_api_url: str = _setting("https://api.github.com", "GitHub REST API base URL (for --fork).")
    git_timeout: float = _setting(300.0, "Seconds one git clone or push may take.")
    fork_timeout: float = _setting(120.0, "Seconds to wait for GitHub to finish copying a new fork's git objects.")
    fork_poll_interval: float = _setting(2.0, "Seconds between checks that a new fork is ready.")
    sandbox: str = _setting(
        "required",
        "Sandbox for model-written code: required (bubblewrap or stop), auto (bubblewrap, else an unisolated process with a warning), or off (unsafe).",
        ("required", "auto", "off"),
    )
    command_timeout: float = _setting(600.0, "Seconds one sandboxed command (cargo test, ...) may run.")
    sandbox_memory_mb: int = _setting(
        4096, "MiB of data memory (RLIMIT_DATA) one sandboxed process may use; rustc needs 1-2 GiB on large crates."
    )
    sandbox_file_mb: int = _setting(2048, "MiB: the largest file a sandboxed process may write (RLIMIT_FSIZE).")
    sandbox_disk_mb: int = _setting(
        10240,
        "MiB a run's workspace and target dir may hold: a sandboxed command is killed when the disk grows past it, the edit loop stops beyond it.",
    )
    dependency_cache: bool = _setting(
        True,
        "Build a crate's locked dependencies once (sandboxed, from its manifest and lock only) and give each edit loop a private copy.",
    )
    dependency_cache_mb: int = _setting(
        8192,
        "MiB the dependency cache may hold: storing an entry evicts the least recently used ones beyond it (an entry used in the last hour stays); 0: no limit.",
    )
    output_cap: int = _setting(200_000, "Bytes of output kept from one sandboxed command.")
    tool_output_limit: int = _setting(
        4_000_000,
        "Bytes of a crafted tool's stdout a call (MCP, run --json) returns whole; past it the whole stdout goes to a "
        "file in the state directory's outputs/ and the call returns its first lines, truncated: true and the path.",
    )
    nixpkgs: str = _setting(
        "auto",
        "nixpkgs for builds: pinned (real nixos-26.05), host (offline stand-in), or auto.",
        ("auto", "pinned", "host"),
    )
    smoke_timeout: float = _setting(20.0, "Seconds the smoke run of a built tool may take.")
    tool_timeout: float = _setting(
        120.0, "Seconds one call of a crafted tool from JSON arguments (MCP, run --args-json) may take."
    )
    nix_build_timeout: float = _setting(1800.0, "Seconds one nix build may take.")
    nix_builders: str = _setting(
        "", "Nix remote builders for pinned builds (passed as --option builders); empty leaves Nix's own setting alone."
    )
    nix_copy_timeout: float = _setting(1800.0, "Seconds one nix copy (flakebot publish, install) may take.")
    catalogs: tuple[dict[str, Any], ...] = _setting(
        (),
        "Shared catalogs (binary caches others publish to), each with the public keys to trust: TOML [[catalogs]] url = ... keys = [...], or 'URL KEY...; URL KEY...'.",
    )

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def describe(cls, key: str) -> str:
        doc: str = _field(key).metadata["doc"]
        return doc

    def get(self, key: str) -> Any:
        _field(key)
        return getattr(self, key)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def path(self, key: str) -> Path:
        """A path setting, with its XDG default filled in and ~ expanded."""
        value = getattr(self, key)
        if not value:
            value = {"catalog_dir": data_home(), "cache_dir": cache_home(), "workdir": state_home()}[key]
        return Path(value).expanduser().resolve()


def _field(key: str) -> dataclasses.Field[Any]:
    for f in dataclasses.fields(Settings):
        if f.name == key:
            return f
    raise ConfigError(
        f"unknown config key '{key}'",
        fix=f"use one of: {', '.join(Settings.keys())}",
    )


def coerce(key: str, value: Any, source: str) -> Any:
    """Turn a raw value from TOML, the environment or a flag into the field's type."""
    f = _field(key)
    kind: type[Any] = type(f.default)
    try:
        if kind is bool:
            value = _to_bool(value)
        elif kind is tuple:
            value = _to_catalogs(value)
        elif kind in (int, float):
            value = kind(value)
        else:
            value = str(value)
    except (TypeError, ValueError):
        wanted = {
            bool: "true or false",
            int: "an integer",
            float: "a number",
            tuple: "a list of {url, keys} tables (a cache URL such as file:///DIR and Nix public keys NAME:BASE64), or 'URL KEY...; URL KEY...'",
        }.get(kind, "a string")
        raise ConfigError(f"{source}: '{key}' must be {wanted}, got {value!r}", fix=f"set {key} to {wanted}") from None
    choices = f.metadata["choices"]
    if choices and value not in choices:
        raise ConfigError(
            f"{source}: '{key}' must be one of {', '.join(choices)}, got {value!r}",
            fix=f"set {key} to one of {', '.join(choices)}",
        )
    return value


def _to_catalogs(value: Any) -> tuple[dict[str, Any], ...]:
    """Shared catalogs from TOML tables ({url, keys}) or the string form 'URL KEY [KEY...]; URL KEY'."""
    if isinstance(value, str):
        value = [dict(url=words[0], keys=words[1:]) for part in value.split(";") if (words := part.split())]
    if not isinstance(value, (list, tuple)):
        raise ValueError(value)
    catalogs = []
    for item in value:
        if not isinstance(item, dict) or set(item) - {"url", "keys"} or "://" not in str(item.get("url", "")):
            raise ValueError(item)  # a cache URL: file:///DIR, https://..., s3://..., ssh-ng://...
        keys = item.get("keys") or []
        keys = keys.split() if isinstance(keys, str) else [str(k) for k in keys]
        if not keys or not all(_public_key(k) for k in keys):
            raise ValueError(item)  # only keys the user names are trusted: a catalog without one is a mistake
        catalogs.append({"url": item["url"].strip().rstrip("/"), "keys": keys})
    return tuple(catalogs)


def _public_key(key: str) -> bool:
    """A Nix public key: NAME:base64 of 32 bytes."""
    import base64
    import binascii

    name, _, data = key.partition(":")
    try:
        return bool(name) and len(base64.b64decode(data, validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


def config_files() -> list[Path]:
    """The config files read, lowest precedence first."""
    return [config_home() / "flakebot.toml", Path.cwd() / "flakebot.toml"]


def read_toml(path: Path) -> tomlkit.TOMLDocument:
    import tomlkit  # imported when a file exists: a tool call reads no config file, and tomlkit is slow to import
    import tomlkit.exceptions

    try:
        return tomlkit.parse(path.read_text())
    except tomlkit.exceptions.ParseError as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc})", fix=f"correct or remove {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", fix=f"check the permissions of {path}") from None


def load(overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Settings from files, then environment, then `overrides` (flags; None values ignored)."""
    values: dict[str, Any] = {}
    for path in config_files():
        if path.is_file():
            for key, raw in read_toml(path).unwrap().items():
                values[key] = coerce(key, raw, str(path))
    for name, raw in (os.environ if environ is None else environ).items():
        if name.startswith(ENV_PREFIX) and name not in NON_SETTING_ENV:
            key = name[len(ENV_PREFIX) :].lower()
            values[key] = coerce(key, raw, f"environment variable {name}")
    for key, raw in (overrides or {}).items():
        if raw is not None:
            values[key] = coerce(key, raw, f"--{key.replace('_', '-')}")
    return Settings(**values)


def set_value(key: str, raw: str, path: Path | None = None) -> Path:
    """Write one setting into a config file, keeping its comments. Returns the file written."""
    import tomlkit

    value = coerce(key, raw, "config set")
    path = path or config_home() / "flakebot.toml"
    doc = read_toml(path) if path.exists() else tomlkit.document()
    doc[key] = list(value) if isinstance(value, tuple) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    from flakebot.fsutil import atomic_write_text

    atomic_write_text(path, tomlkit.dumps(doc))
    return path
