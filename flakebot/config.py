"""Settings: defaults, then ~/.config/flakebot/flakebot.toml (the user's file), then FLAKEBOT_* environment
variables, then command-line flags (last wins). Every tunable is one field below with its default, a one-line
docstring (`doc`) and its trust class; unknown keys fail at start-up, not halfway through a run.

Provenance. A flakebot.toml in the working directory is something a cloned repository, a model or a tool could have
written, so it is read only for LIMIT settings, and only to lower them (after the user's file; the environment and
flags still win): a project may make a run stricter, never looser. Every other setting is TRUSTED: it decides what
runs (sandbox), what is trusted (catalogs and their keys, git sources, registries), where requests and tokens go
(every *_url, models and providers, nix builders and options) and where flakebot keeps its state (the directory
settings); such a key in a working directory's file stops the command with one line saying where it belongs. A
new setting is TRUSTED unless its field says otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot.errors import ConfigError
from flakebot.homes import cache_home as cache_home  # re-exported: every caller's config.*_home()
from flakebot.homes import config_home as config_home
from flakebot.homes import data_home as data_home
from flakebot.homes import rustup_home as rustup_home

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import tomlkit

    from flakebot import safefs

ENV_PREFIX = "FLAKEBOT_"
# Environment variables with the prefix that are not settings.
NON_SETTING_ENV = {"FLAKEBOT_RAISE_ERRORS", "FLAKEBOT_DATABASE_URL"}  # the latter: flakebot.team.dburl


TENANTS = "tenants"  # <catalog_dir>/tenants/<tenant>/: each tenant's own catalog (flakebot.deliver.catalog)
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")  # a token's tenant (team.tokens.NAME): one plain name, no path
TENANT_FILE = "flakebot.toml"  # <catalog_dir>/tenants/<tenant>/flakebot.toml: that tenant's own settings
# Where a worker may publish a tenant's crafts: binary caches, whose narinfos it signs with the tenant's key
# (flakebot.deliver.publish.BINARY_CACHE_SCHEMES; a chroot or ssh store would hold them unsigned, and no index).
PUBLISH_SCHEMES = ("file", "http", "https", "s3")
# The settings a tenant's own file holds (team mode), each with what it means. Nothing else is read from it.
TENANT_SETTINGS = {
    "catalogs": "The tenant's own shared catalogs and the keys to trust for them (read with the organisation's "
    "catalogs by this tenant's calls and jobs only): [[catalogs]] url = ... keys = [...], or 'URL KEY...; URL KEY...'.",
    "publish_to": "The binary cache a worker publishes each tool it crafts for this tenant to, signed with the "
    "tenant's key the worker holds (<catalog_dir>/tenants/T/keys/); empty: workers publish nothing.",
}

# Trust classes of settings (see the module docstring).
TRUSTED = "trusted"  # only from the user's file, the environment or a flag
LIMIT = "limit"  # also from a working directory's flakebot.toml, to lower it only


def _setting(
    default: Any,
    doc: str,
    choices: tuple[str, ...] = (),
    trust: str = TRUSTED,
    zero_ok: bool = False,
    parse: Callable[[Any], Any] | None = None,
) -> Any:
    """A setting; a number must be finite and above 0 wherever it comes from (`zero_ok`: 0 is meaningful too);
    `parse` turns a tuple setting's raw value (TOML, environment, flag) into its tuple."""
    metadata = {"doc": doc, "choices": choices, "trust": trust, "zero_ok": zero_ok, "parse": parse}
    return field(default=default, metadata=metadata)


def _limit(default: float, doc: str, zero_ok: bool = False) -> Any:
    """A bound a working directory's flakebot.toml may lower (to a value above 0), never raise."""
    return _setting(default, doc, trust=LIMIT, zero_ok=zero_ok)


def _to_paths(value: Any) -> tuple[str, ...]:
    """Directories from a TOML list or one string of them separated by os.pathsep (as PATH is)."""
    if isinstance(value, str):
        value = [part for part in value.split(os.pathsep) if part]
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(value)
    return tuple(value)


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
    tenant: str = _setting(
        "",
        "Team mode: the tenant whose catalog (catalog_dir/tenants/NAME) this process writes, reading catalog_dir's "
        "tools beneath it; empty: catalog_dir alone. flakebot serve and workers set it per call and per job.",
    )
    cache_dir: str = _setting("", "HTTP and index caches; empty means $XDG_CACHE_HOME/flakebot.")
    model: str = _setting(
        "", "Model as provider:name (groq:..., openai:..., ollama:..., scripted:FILE); empty picks from API keys."
    )
    groq_model: str = _setting(
        "openai/gpt-oss-120b",
        "Model used for groq when --model names only the provider (Groq's production tool-use model).",
    )
    openai_model: str = _setting("gpt-4.1-mini", "Model used for openai when --model names only the provider.")
    model_timeout: float = _limit(120.0, "Seconds to wait for one model reply.")
    model_retries: int = _limit(2, "Retries the SDKs make on 429/5xx/connection errors.", zero_ok=True)
    max_iterations: int = _limit(30, "Edit-loop iterations (model calls) before the loop stops.")
    max_cost: float = _limit(2.0, "USD a run may spend on model calls (0: only models with no price).", zero_ok=True)
    max_tokens: int = _limit(2_000_000, "Tokens (prompt + completion) a run may use.")
    max_wall_seconds: float = _limit(1800.0, "Wall-clock seconds the edit loop may take.")
    registry: str = _setting("auto", "Where to search crates: auto, crates-io, local, or a directory source path.")
    local_registry: str = _setting(
        "/usr/share/cargo/registry", "Cargo directory source used offline (Debian's packaged crates)."
    )
    offline: bool = _setting(False, "Never contact crates.io; use the local registry and cargo --offline.")
    cratesio_api_url: str = _setting("https://crates.io", "crates.io API base URL.")
    cratesio_static_url: str = _setting("https://static.crates.io", "Base URL for .crate downloads.")
    cratesio_index_url: str = _setting("https://index.crates.io", "Sparse index base URL.")
    contact: str = _setting("https://github.com/flakebot/flakebot", "Contact put in the User-Agent sent to crates.io.")
    http_cache_ttl: float = _limit(3600.0, "Seconds a cached crates.io answer stays fresh.")
    connect_timeout: float = _limit(3.0, "Seconds to wait when first connecting to crates.io before falling back.")
    cratesio_interval: float = _setting(
        1.0,
        "Seconds between crates.io API requests, shared by the whole process (their policy: at most 1 per second).",
        zero_ok=True,
    )
    cratesio_details: int = _limit(
        3,
        "Top crates.io search results whose version details (binaries, licence, yanked) refine the ranking; 1 request each.",
        zero_ok=True,
    )
    git_sources: str = _setting(
        "github.com,gitlab.com,codeberg.org,git.sr.ht,bitbucket.org",
        "Git dependencies host cargo may fetch: https hosts, or scheme://host:port/path prefixes (port and path optional; comma-separated).",
    )
    github_api_url: str = _setting("https://api.github.com", "GitHub REST API base URL (for --fork).")
    git_timeout: float = _limit(300.0, "Seconds one git clone or push may take.")
    fork_timeout: float = _limit(120.0, "Seconds to wait for GitHub to finish copying a new fork's git objects.")
    fork_poll_interval: float = _setting(2.0, "Seconds between checks that a new fork is ready.")
    sandbox: str = _setting(
        "required",
        "Sandbox for model-written code: required (bubblewrap or stop), auto (bubblewrap, else an unisolated process with a warning), or off (unsafe).",
        ("required", "auto", "off"),
    )
    command_timeout: float = _limit(600.0, "Seconds one sandboxed command (cargo test, ...) may run.")
    sandbox_memory_mb: int = _limit(
        4096, "MiB of data memory (RLIMIT_DATA) one sandboxed process may use; rustc needs 1-2 GiB on large crates."
    )
    sandbox_file_mb: int = _limit(2048, "MiB: the largest file a sandboxed process may write (RLIMIT_FSIZE).")
    sandbox_disk_mb: int = _limit(
        10240,
        "MiB a run's workspace and target dir may hold: a sandboxed command is killed when the disk grows past it, the edit loop stops beyond it.",
    )
    dependency_cache: bool = _setting(
        True,
        "Build a crate's locked dependencies once, from its manifest and lock only, and give each edit loop a private copy: "
        "offline, the flake's own dependency derivation (the package stage reuses it); else a sandboxed debug build.",
    )
    dependency_cache_mb: int = _setting(
        8192,
        "MiB the dependency cache may hold: storing an entry evicts the least recently used ones beyond it (an entry used in the last hour stays); 0: no limit.",
        zero_ok=True,
    )
    output_cap: int = _limit(200_000, "Bytes of output kept from one sandboxed command.")
    tool_output_limit: int = _limit(
        4_000_000,
        "Bytes of a crafted tool's stdout a call (MCP, run --json) returns whole; past it the whole stdout goes to a "
        "file in the state directory's outputs/ and the call returns its first lines, truncated: true and the path.",
    )
    outputs_mb: int = _limit(
        1024,
        "MiB the state directory's outputs/ may hold (1..); a call that spills removes the oldest files beyond it.",
    )
    output_file_mb: int = _limit(256, "MiB of one call's spilled stdout (1..); past it the tool is killed.")
    max_jobs: int = _limit(
        4, "Long MCP calls (craft, improve, package, resume) running at once on this machine (1..256)."
    )
    max_session_jobs: int = _limit(
        2, "Long calls one MCP session may have running at once (1..256); past either: refused."
    )
    task_result_wait: float = _limit(
        50.0, "Seconds tasks/result waits for a task to end (1..3600) before it answers with the task's status."
    )
    nixpkgs: str = _setting(
        "auto",
        "nixpkgs for builds: pinned (real nixos-26.05), host (offline stand-in), or auto.",
        ("auto", "pinned", "host"),
    )
    smoke_timeout: float = _limit(20.0, "Seconds the smoke run of a built tool may take.")
    tool_timeout: float = _limit(
        120.0, "Seconds one call of a crafted tool from JSON arguments (MCP, run --args-json) may take."
    )
    nix_build_timeout: float = _limit(1800.0, "Seconds one nix build may take.")
    nix_builders: str = _setting(
        "",
        "Nix remote builders (passed as --option builders, with builders-use-substitutes for stand-in builds); "
        "empty leaves Nix's own setting alone for pinned builds and builds stand-in builds here. Stand-in (host) "
        "builds go only to builders listing this machine's toolchain feature (docs/team-builders.md).",
    )
    nix_copy_timeout: float = _limit(1800.0, "Seconds one nix copy (flakebot publish, install) may take.")
    catalog_read_timeout: float = _limit(
        30.0,
        "Seconds reading one shared catalog's index over http(s) may take, whole (list --remote, craft, install): "
        "a server that sends it a byte at a time is given up on then.",
    )
    fetch_retry_seconds: float = _setting(
        10.0,
        "Team mode: seconds a front waits before trying again to install a finished job's tool its catalog lacks from "
        "the tenant's shared catalogs, after a try failed; doubled after each failure, up to 10 minutes (or this).",
    )
    shared_index_lifetime: float = _setting(
        30 * 86400.0,
        "Seconds a shared catalog's index that flakebot publish signs stays valid; readers refuse it once expired (publish again to renew it).",
    )
    grant_roots: tuple[str, ...] = _setting(
        (".",),
        "Directories a caller (run --writable, MCP writable) may let a tool write beneath; '.' (and any relative path) "
        "is from where the command or MCP server started. A root that is, holds or lies in a configuration directory "
        "(/, /etc, /usr, /nix, a home as a whole, ~/.config and other dot directories, flakebot's own) is refused; "
        "--grant-root DIR adds one (run, mcp).",
        parse=_to_paths,
    )
    catalogs: tuple[dict[str, Any], ...] = _setting(
        (),
        "Shared catalogs (binary caches others publish to), each with the public keys to trust: TOML [[catalogs]] url = ... keys = [...], or 'URL KEY...; URL KEY...'. "
        "Team mode: every tenant's; a tenant's own go in its file (FLAKEBOT_TENANT=T flakebot config set catalogs ...).",
    )

    def shared_catalogs(self) -> tuple[dict[str, Any], ...]:
        """The shared catalogs this process reads: the organisation's (`catalogs`), then, with a `tenant`, that
        tenant's own (its file's `catalogs`). Each is verified with its own keys only, so no tenant's key vouches
        for the organisation's catalogs nor another tenant's: a tenant reads no other tenant's list."""
        if not self.tenant:
            return self.catalogs
        own = tenant_values(self, self.tenant).get("catalogs", ())
        return (*self.catalogs, *own)

    def tenant_setting(self, key: str) -> Any:
        """A setting of this process's tenant's own file (TENANT_SETTINGS), its default ("" or ()) when unset or
        with no tenant."""
        default = () if key == "catalogs" else ""
        return tenant_values(self, self.tenant).get(key, default) if self.tenant else default

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def describe(cls, key: str) -> str:
        doc: str = _field(key).metadata["doc"]
        return doc

    @classmethod
    def trust_class(cls, key: str) -> str:
        """TRUSTED or LIMIT: which sources may set `key`."""
        trust: str = _field(key).metadata["trust"]
        return trust

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

    def own_dirs(self) -> list[Path]:
        """Every directory flakebot keeps its own files in: the catalog, the caches, the workdir (runs and their
        state, services and their launch files, the dependency cache) and the configuration. A tool let write any of
        them could rewrite what flakebot runs or trusts next, so no caller may hand one to a tool."""
        dirs = [self.path("catalog_dir"), self.path("cache_dir"), self.path("workdir"), cache_home(), config_home()]
        return list(dict.fromkeys(d.expanduser().resolve() for d in dirs))


def tenant_dir(settings: Settings, tenant: str) -> Path:
    """Where `tenant`'s own catalog and settings live: beneath catalog_dir, under a name that is one plain name
    (ConfigError otherwise: a tenant never names a path)."""
    if not TENANT_NAME.fullmatch(tenant):
        raise ConfigError(
            f"tenant {tenant!r} is not a tenant name",
            fix="use lower-case letters, digits, '.', '_' and '-' (at most 64, starting with a letter or digit)",
        )
    return settings.path("catalog_dir") / TENANTS / tenant


def tenant_file(settings: Settings, tenant: str) -> Path:
    """The tenant's own settings file. It is in flakebot's data directory, written by the admin's `config set` with
    the tenant setting; no token, tool, model or cache owner writes there (catalogs and keys are trusted from it)."""
    return tenant_dir(settings, tenant) / TENANT_FILE


def tenant_values(settings: Settings, tenant: str) -> dict[str, Any]:
    """The settings the tenant's own file sets, checked as the user's file is (ConfigError on a bad one)."""
    import tomllib  # the standard library's reader: a tool call reads this file, and tomlkit is slow to import

    path = tenant_file(settings, tenant)
    data = _tenant_bytes(settings, tenant, path)
    if data is None:
        return {}
    try:
        raw = tomllib.loads(data.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML ({exc})", fix=f"correct or remove {path}") from None
    return {key: _tenant_coerce(key, value, str(path)) for key, value in raw.items()}


def _tenant_bytes(settings: Settings, tenant: str, path: Path) -> bytes | None:
    """The tenant's file (None when there is none), only as the catalog's owner wrote it: it names the catalogs and
    keys the tenant trusts, so a link on the way or at the name (safefs), another owner, or a group- or
    world-writable file, or such a directory on its way from catalog_dir, is refused in one line, never read."""
    from flakebot import safefs
    from flakebot.errors import UnsafePath

    root = settings.path("catalog_dir")
    fix = (
        f"make {path} a regular file of the catalog's owner that only it may write, under no other name (chown, "
        f"then chmod go-w {path}; a hard link: copy it in place)"
    )
    try:
        with safefs.Tree(root) as tree:
            # no file (FileNotFoundError): nothing of the tenant's trusted, so no way to it to check
            tree.lstat(f"{TENANTS}/{tenant}/{TENANT_FILE}")
            owner = _tenant_way(tree, tenant, path)
            with tree.open_read(f"{TENANTS}/{tenant}/{TENANT_FILE}") as file:
                info = os.fstat(file.fileno())
                # a second name (a hard link) is a way in this directory's rights do not govern
                if info.st_uid != owner or info.st_mode & 0o022 or info.st_nlink != 1:
                    raise ConfigError(
                        f"{path} could be written by another user than the catalog's owner (owner uid "
                        f"{info.st_uid}, mode {info.st_mode & 0o777:o}, {info.st_nlink} names): refused, it names the "
                        f"catalogs tenant {tenant} trusts",
                        fix=fix,
                    )
                return file.read()
    except FileNotFoundError:
        return None
    except UnsafePath:
        raise ConfigError(f"{path} is a link, or reached through one, or not a file: refused", fix=fix) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", fix=f"check the permissions of {path}") from None


def _tenant_way(tree: safefs.Tree, tenant: str, path: Path) -> int:
    """The catalog owner's uid, once each directory on the way to the tenant's file (catalog_dir, tenants/,
    tenants/T, opened in `tree`, a safefs.Tree of catalog_dir) is checked from the top: another user who could rename
    or replace one could put another file at the name (a directory nobody else may write keeps the one below it in
    place). ConfigError in one line naming the directory otherwise."""
    owner = os.stat(tree.root).st_uid
    for _, where, seen in _way_to_tenant(tree, tenant, path):
        if seen.st_uid != owner or seen.st_mode & 0o022:
            raise ConfigError(
                f"{where} could be written by another user than the catalog's owner (owner uid "
                f"{seen.st_uid}, mode {seen.st_mode & 0o777:o}): refused, {path} in it names the catalogs "
                f"tenant {tenant} trusts",
                fix=f"make {where} the catalog owner's, writable only by it (chown, then chmod go-w {where})",
            )
    return owner


def _way_to_tenant(tree: safefs.Tree, tenant: str, path: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """Each directory on the way to the tenant's file, from the top (catalog_dir, tenants/, tenants/T): its path in
    `tree` (a safefs.Tree of catalog_dir), its path, and its status, not through a link; each is looked at only
    once the one above it was dealt with."""
    root = tree.root
    for rel, where in (("", root), (TENANTS, root / TENANTS), (f"{TENANTS}/{tenant}", path.parent)):
        yield rel, where, tree.lstat(rel) if rel else os.stat(root)


def _tenant_coerce(key: str, value: Any, source: str) -> Any:
    if key not in TENANT_SETTINGS:
        raise ConfigError(
            f"{source}: '{key}' is not a tenant's setting",
            fix=f"a tenant's file holds only {', '.join(TENANT_SETTINGS)}; set '{key}' without the tenant setting",
        )
    if key == "catalogs":
        return coerce("catalogs", value, source)
    text = value.strip() if isinstance(value, str) else repr(value)  # a TOML list or number: no URL, never coerced
    scheme, sep, rest = text.partition("://")
    cache = bool(sep and scheme in PUBLISH_SCHEMES and rest and (scheme != "file" or rest.startswith("/")))
    if text and not cache or "secret-key=" in text or not isinstance(value, str):
        raise ConfigError(  # a key in a URL would be a key in a file a tenant's readers may see: keys stay in keys/
            f"{source}: 'publish_to' must be a binary cache URL (file:///DIR, https://..., s3://...) without a "
            f"secret-key, got {text!r}",
            fix="FLAKEBOT_TENANT=T flakebot config set publish_to file:///srv/cache-T",
        )
    return text


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
            value = (f.metadata["parse"] or _to_catalogs)(value)
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
        if f.metadata["parse"] is _to_paths:
            wanted = f"a list of directories, or directories separated by '{os.pathsep}'"
        raise ConfigError(f"{source}: '{key}' must be {wanted}, got {value!r}", fix=f"set {key} to {wanted}") from None
    if kind in (int, float) and not _in_bounds(value, f.metadata.get("zero_ok", False)):
        least = "0 or more" if f.metadata.get("zero_ok") else "above 0"
        raise ConfigError(
            f"{source}: '{key}' must be a finite number {least}, got {value!r}", fix=f"set {key} to a number {least}"
        )
    choices = f.metadata["choices"]
    if choices and value not in choices:
        raise ConfigError(
            f"{source}: '{key}' must be one of {', '.join(choices)}, got {value!r}",
            fix=f"set {key} to one of {', '.join(choices)}",
        )
    return value


def _in_bounds(value: float, zero_ok: bool) -> bool:
    return math.isfinite(value) and (value >= 0 if zero_ok else value > 0)


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


def user_file() -> Path:
    """The user's own config file: the only file trusted settings are read from, and what `config set` writes."""
    return config_home() / "flakebot.toml"


def local_file() -> Path | None:
    """The working directory's flakebot.toml, read for lowering limits only; None when it is the user's file."""
    path = Path.cwd() / "flakebot.toml"
    return None if path.resolve() == user_file().resolve() else path


def config_files() -> list[Path]:
    """The config files read, lowest precedence first."""
    return [user_file(), *filter(None, [local_file()])]


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
    return load_with_sources(overrides, environ)[0]


def load_with_sources(
    overrides: dict[str, Any] | None = None, environ: dict[str, str] | None = None
) -> tuple[Settings, dict[str, str]]:
    """The settings and, for each key set anywhere, where its value came from (`config show`): the user file, the
    working directory's file, an environment variable or a flag; keys missing are defaults."""
    values = _user_values()
    sources = {key: f"user file {user_file()}" for key in values}
    local = local_file()
    if local is not None and local.is_file():
        for key, raw in read_toml(local).unwrap().items():
            values[key], sources[key] = _lowered(key, raw, local, values), f"working dir {local}"
    for name, raw in (os.environ if environ is None else environ).items():
        if name.startswith(ENV_PREFIX) and name not in NON_SETTING_ENV:
            key = name[len(ENV_PREFIX) :].lower()
            values[key], sources[key] = coerce(key, raw, f"environment variable {name}"), f"env {name}"
    for key, raw in (overrides or {}).items():
        if raw is not None:
            flag = f"--{key.replace('_', '-')}"
            values[key], sources[key] = coerce(key, raw, flag), f"flag {flag}"
    return Settings(**values), sources


def _user_values() -> dict[str, Any]:
    """The settings the user's own file sets."""
    if not user_file().is_file():
        return {}
    return {key: coerce(key, raw, str(user_file())) for key, raw in read_toml(user_file()).unwrap().items()}


def _lowered(key: str, raw: Any, path: Path, values: dict[str, Any]) -> Any:
    """`key` from a working directory's file: a LIMIT no higher than it is already (and above 0); a TRUSTED key or a
    raised limit stops here with one line saying where the setting belongs."""
    value = coerce(key, raw, str(path))
    where = f"set it in {user_file()} (flakebot config set {key} VALUE) or {ENV_PREFIX}{key.upper()}, and remove it from {path}"
    if Settings.trust_class(key) != LIMIT:
        raise ConfigError(
            f"{path}: '{key}' decides what flakebot trusts, and a working directory's flakebot.toml (a repository's, "
            "or one a tool wrote) may only lower limits",
            fix=where,
        )
    current = values.get(key, _field(key).default)
    if not 0 < value <= current:
        raise ConfigError(
            f"{path}: '{key}' = {value!r}: a working directory's flakebot.toml may only lower limits (above 0), and "
            f"{key} is {current!r}",
            fix=where,
        )
    return value


def set_value(key: str, raw: str, *, local: bool = False) -> Path:
    """Write one setting into the user's file (the working directory's with `local`: a LIMIT only), keeping its
    comments. Returns the file written."""
    import tomlkit

    tenant = load().tenant
    if tenant:
        return _set_tenant_value(tenant, key, raw, local)
    if key == "publish_to":
        raise ConfigError(
            "'publish_to' is a tenant's setting (where workers publish its crafts)",
            fix=f"FLAKEBOT_TENANT=T flakebot config set publish_to {raw}",
        )
    value = coerce(key, raw, "config set")
    path = (local_file() if local else None) or user_file()
    if local and Settings.trust_class(key) != LIMIT:
        raise ConfigError(
            f"'{key}' decides what flakebot trusts: it is never read from a working directory's flakebot.toml",
            fix=f"flakebot config set {key} {raw} (writes {user_file()})",
        )
    if path != user_file():
        _lowered(key, raw, path, _user_values())  # refused now, not on the next command
    doc = read_toml(path) if path.exists() else tomlkit.document()
    doc[key] = list(value) if isinstance(value, tuple) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    from flakebot.fsutil import atomic_write_text

    atomic_write_text(path, tomlkit.dumps(doc))
    return path


def _set_tenant_value(tenant: str, key: str, raw: str, local: bool) -> Path:
    """`config set` with the tenant setting: one of TENANT_SETTINGS into the tenant's own file; any other key is
    refused (it would apply to every tenant, not this one)."""
    import tomlkit

    if key not in TENANT_SETTINGS or local:
        raise ConfigError(
            f"'{key}' is not a tenant's setting{' (and a tenant has no --local file)' if local else ''}: with "
            f"the tenant setting ({tenant}), config set writes only {', '.join(TENANT_SETTINGS)}",
            fix=f"unset FLAKEBOT_TENANT to set '{key}' for the whole organisation",
        )
    settings = load()
    path = tenant_file(settings, tenant)
    value = _tenant_coerce(key, raw, "config set")
    _make_tenant_way(settings, tenant, path)
    written = _tenant_bytes(settings, tenant, path)
    doc = tomlkit.parse(written.decode()) if written is not None else tomlkit.document()
    doc[key] = list(value) if isinstance(value, tuple) else value
    from flakebot.fsutil import atomic_write_text

    atomic_write_text(path, tomlkit.dumps(doc))
    return path


def _make_tenant_way(settings: Settings, tenant: str, path: Path) -> None:
    """The way to the tenant's file (catalog_dir, tenants/, tenants/T) made, or kept, as its reader wants it before
    the admin writes the file: flakebot's own directories, this user's, writable by it alone whatever its umask (002
    made them group-writable, and the file in them would never be read: _tenant_way). One another user owns is
    left as it is and refused, so a file that would be refused is not written (ConfigError in one line)."""
    from flakebot import safefs
    from flakebot.errors import UnsafePath

    root = settings.path("catalog_dir")
    root.mkdir(parents=True, exist_ok=True)
    try:
        with safefs.Tree(root) as tree:
            tree.mkdir(f"{TENANTS}/{tenant}", mode=0o755)
            for rel, where, seen in _way_to_tenant(tree, tenant, path):
                if seen.st_uid == os.geteuid() and seen.st_mode & 0o022:
                    logger.info("%s made writable by its owner only (tenant %s's settings are in it)", where, tenant)
                    tree.chmod(rel, stat.S_IMODE(seen.st_mode) & ~0o022)
            _tenant_way(tree, tenant, path)
    except UnsafePath:
        raise ConfigError(
            f"{path.parent} is a link, or reached through one: refused, {path} in it names the catalogs tenant "
            f"{tenant} trusts",
            fix=f"make {root / TENANTS} and {path.parent} plain directories of the catalog's owner",
        ) from None
