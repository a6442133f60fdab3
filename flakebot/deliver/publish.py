"""Sharing a catalogued tool beyond this machine: `nix copy` of its closure to a binary cache or another store.

publish(tool, to, settings) -> dict   copy, sign (binary caches), record the publication in the catalog

Binary caches (file://, http(s)://, s3://) get narinfos signed with flakebot's own key, generated once
with `nix key generate-secret` and kept in <catalog_dir>/keys/; consumers trust its public key. Other
stores (a chroot store path, local?root=, ssh://, ssh-ng://, daemon) check signatures against their own
trusted-public-keys on the way in, which a key flakebot generated is not in: the copy passes
--no-check-sigs for paths this machine built itself.

A binary cache also gets the tool's catalog entry, as a signed store path of its own (flakebot.deliver.shared),
and in a file:// cache its files and an index other machines find it by (`flakebot install`, `craft`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import re
import shlex
import socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from flakebot import launcher
from flakebot.config import Settings
from flakebot.deliver import shared
from flakebot.deliver.catalog import Catalog
from flakebot.errors import CatalogError, NixError, UsageError
from flakebot.fsutil import atomic_write_text
from flakebot.nix import command
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

BINARY_CACHE_SCHEMES = ("file", "http", "https", "s3")
STORE_SCHEMES = ("ssh", "ssh-ng", "unix")
STORE_NAMES = ("local", "daemon", "auto")
URL_EXAMPLES = "file:///srv/cache, https://cache.example.org, s3://bucket, ssh-ng://host, /path/to/chroot-store"
UNREACHABLE = (
    "unable to download",
    "cannot connect",
    "Couldn't connect",
    "Could not resolve",
    "Connection refused",
    "No such file or directory",
)


@dataclass(frozen=True)
class Destination:
    """Where a publication goes: the URL as given, and whether it is a binary cache (signed narinfos)."""

    url: str
    binary_cache: bool


@dataclass(frozen=True)
class SigningKey:
    """flakebot's signing key pair: the secret key file and the public key consumers trust."""

    name: str
    secret_file: Path
    public: str


def publish(tool: str, to: str, settings: Settings) -> dict[str, Any]:
    """Copy a catalogued tool's closure to `to` with `nix copy` and record it in the catalog entry."""
    destination = parse_destination(to)
    catalog = Catalog.open(settings)
    entry = catalog.get(tool)  # NAME or NAME@VERSION
    catalog.index.refuse_read_only()  # the publication is recorded there: refused before a key or a copy is made
    store_path = _live_store_path(tool, entry)
    command.nix_program()  # fail before generating a key when nix is missing
    key = signing_key(settings) if destination.binary_cache and "secret-key=" not in to else None
    entry_path = shared.entry_store_path(entry, store_path, settings) if destination.binary_cache else None
    extra = [entry_path] if entry_path else []
    if shared.cache_dir(destination.url) is not None:
        seconds = _copy_to_file_cache(store_path, destination, key, settings, extra)
    else:
        seconds = _copy(store_path, destination, key, settings.nix_copy_timeout, extra=extra)
    record = _record(store_path, destination, key)
    if entry_path:
        record["entry_path"] = entry_path
        record["entry_dir"] = _share_entry(destination, entry, record, key, settings)
    catalog.update(entry["name"], published={destination.url: record})
    logger.info(
        "published %s (%d paths, %d bytes) to %s in %.1f s",
        store_path,
        record["paths"],
        record["closure_size"],
        destination.url,
        seconds,
    )
    helps = consumer_help(destination, key, store_path, _main_program(Path(entry["dir"]), entry["name"]))
    return {
        "kind": "publication",
        "tool": tool,
        **record,
        "binary_cache": destination.binary_cache,
        "seconds": round(seconds, 3),
        **helps,
    }


def _share_entry(
    destination: Destination, entry: dict[str, Any], record: dict[str, Any], key: SigningKey | None, settings: Settings
) -> str | None:
    """The entry's files and a newly signed index in a file:// cache; other caches hold only its store path for now."""
    if shared.cache_dir(destination.url) is None:
        logger.warning(
            "%s is not a file:// cache: the entry's store path is there, but flakebot writes its index only to file:// caches for now",
            destination.url,
        )
        return None
    return shared.add_entry(destination.url, entry, record, index_key(destination, key, settings))


def index_key(destination: Destination, key: SigningKey | None, settings: Settings) -> shared.IndexKey:
    """The key the index is signed with (flakebot's own, or the secret-key file the URL names) and the keys whose
    earlier snapshots are carried forward: that key's own and those the catalogs setting trusts for the cache."""
    from flakebot.deliver.signatures import public_key

    if key is not None:
        secret = key.secret_file.read_text()
    else:
        files = parse_qs(urlparse(destination.url).query).get("secret-key") or [""]
        try:
            secret = Path(files[0]).read_text()
        except OSError as exc:
            raise UsageError(
                f"cannot read the secret-key file {files[0]} the URL names: {exc.strerror}",
                fix="give secret-key=PATH of a key made with 'nix key generate-secret'",
            ) from None
    url = destination.url.split("?", 1)[0].rstrip("/")
    configured = [k for source in settings.shared_catalogs() if source["url"] == url for k in source["keys"]]
    return shared.IndexKey(secret, [public_key(secret), *configured], settings.shared_index_lifetime)


def _record(store_path: str, destination: Destination, key: SigningKey | None) -> dict[str, Any]:
    """What the catalog keeps about one publication."""
    paths, size, nar_hash = closure(store_path)
    return {
        "to": destination.url,
        "store_path": store_path,
        "nar_hash": nar_hash,
        "paths": paths,
        "closure_size": size,
        "signed_by": key.name
        if key
        else ("the secret-key given in the URL" if "secret-key=" in destination.url else None),
        "public_key": key.public if key else None,
        "published_at": time.time(),
    }


def parse_destination(to: str) -> Destination:
    """A Nix store URL flakebot can copy to, or a UsageError naming what is wrong with it."""
    url = to.strip()
    if url.startswith("/"):
        return Destination(url, binary_cache=False)  # a chroot store: its store lives under <path>/nix/store
    scheme, sep, rest = url.partition("://")
    if sep and scheme in BINARY_CACHE_SCHEMES:
        if scheme == "file" and not rest.startswith("/"):
            raise UsageError(
                f"'{to}' is not an absolute file:// URL", fix="give the cache directory as file:///absolute/path"
            )
        return Destination(url, binary_cache=True)
    if (sep and scheme in STORE_SCHEMES and rest) or (not sep and url.split("?", 1)[0] in STORE_NAMES):
        return Destination(url, binary_cache=False)
    raise UsageError(
        f"'{to}' is not a Nix store URL", fix=f"give --to a binary cache or store URL such as {URL_EXAMPLES}"
    )


def _live_store_path(tool: str, entry: dict[str, Any]) -> str:
    store_path = str(entry.get("store_path") or "")
    if not store_path or not Path(store_path).exists():
        raise CatalogError(
            f"tool '{tool}' has no built store path on this machine ({store_path or 'none recorded'})",
            fix=f"craft it again with 'flakebot craft --fresh' or remove it with 'flakebot rm {tool}'",
        )
    return store_path


# ---------------------------------------------------------------- the signing key


def signing_key(settings: Settings) -> SigningKey:
    """flakebot's key pair in the keys/ of the catalog `settings` write (<catalog_dir>/keys/; a tenant's own in its
    catalog, named after it: what a tenant publishes is signed by a key its agents trust and no other tenant's
    need), generated with `nix key generate-secret` on first use."""
    keys = Catalog.open(settings).root / "keys"
    name = key_name(socket.gethostname(), settings.tenant)
    secret_file, public_file = keys / f"{name}.secret", keys / f"{name}.public"
    keys.mkdir(parents=True, exist_ok=True)
    with open(keys / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two first publishes must not make two different keys
        if not secret_file.exists():
            logger.info("generating flakebot's signing key %s in %s", name, keys)
            atomic_write_text(secret_file, _nix_key(["generate-secret", "--key-name", name]))  # made with mode 0600
        if not public_file.exists():
            atomic_write_text(public_file, _nix_key(["convert-secret-to-public"], stdin=secret_file.read_text()))
            public_file.chmod(0o644)
    return SigningKey(name, secret_file, public_file.read_text().strip())


def key_name(hostname: str, tenant: str | None) -> str:
    """The key's name: the host's, and a tenant's after `_`, which no host part holds (it is kept to letters,
    digits, `.` and `-`), so no two hosts' and tenants' keys share a name (`a` with tenant `b` and host `a-b`)."""
    host = re.sub(r"[^A-Za-z0-9.-]", "-", hostname)
    return f"flakebot-{host}_{tenant}-1" if tenant else f"flakebot-{host}-1"


def _nix_key(args: list[str], stdin: str | None = None) -> str:
    argv = [command.nix_program(), *command.FEATURES, "key", *args]
    result = launcher.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if result.returncode != 0 or not result.stdout.strip():
        raise NixError(
            f"'nix key {args[0]}' failed: {_last_error(result.stderr.splitlines())}",
            fix="check that 'nix key --help' works (Nix 2.4 or later)",
        )
    return result.stdout.strip() + "\n"


# ---------------------------------------------------------------- nix copy


def copy_argv(
    store_path: str, destination: Destination, key: SigningKey | None, extra: list[str] | None = None
) -> list[str]:
    """The `nix copy` command line: binary caches sign with the key; other stores take our own paths unsigned."""
    url = destination.url
    if key is not None:
        url += f"{'&' if '?' in url else '?'}secret-key={key.secret_file}"
    checks = [] if destination.binary_cache else ["--no-check-sigs"]
    return [command.nix_program(), *command.FEATURES, "copy", "--to", url, *checks, store_path, *(extra or [])]


def _copy(
    store_path: str,
    destination: Destination,
    key: SigningKey | None,
    timeout: float,
    extra: list[str] | None = None,
    into: Destination | None = None,
) -> float:
    argv = copy_argv(store_path, into or destination, key, extra)
    logger.info("nix copy of %s to %s", store_path, destination.url)
    outcome = command.run_streaming(argv, timeout)
    if outcome.timed_out:
        fix = "raise nix_copy_timeout ('flakebot config set nix_copy_timeout 3600')"
        raise NixError(f"nix copy to {destination.url} timed out after {timeout:g} s", fix=fix)
    if outcome.returncode != 0:
        raise _copy_failed(destination, outcome.tail)
    return outcome.seconds


def _copy_to_file_cache(
    store_path: str, destination: Destination, key: SigningKey | None, settings: Settings, extra: list[str]
) -> float:
    """`nix copy` into a fresh directory flakebot made, then each file it wrote moved into the file:// cache through
    flakebot.safefs: Nix, run with the user's rights, never writes in a directory someone else owns (it would follow
    a `nar` link there), and flakebot places each file with O_EXCL and a rename beneath the cache's descriptor.

    The closure's narinfos the cache already holds (regular files) are copied into the staging directory first, so
    nix copy skips those paths as it would in the cache itself; a file already in the cache as a regular file is
    kept, anything else at its name (a link) is replaced, never written through."""
    root = shared.cache_dir(destination.url)
    assert root is not None
    root.mkdir(parents=True, exist_ok=True)  # the URL's own spelling is the user's (docs/host-files.md)
    query = destination.url.partition("?")[2]
    scratch = settings.path("cache_dir")
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="publish-", dir=scratch) as tmp, Tree(root) as cache, Tree(tmp) as staging:
        seeded = _seed_narinfos(cache, staging, [store_path, *extra])
        into = Destination(Path(tmp).as_uri() + (f"?{query}" if query else ""), binary_cache=True)
        seconds = _copy(store_path, destination, key, settings.nix_copy_timeout, extra=extra, into=into)
        files = [rel for rel, info in staging.walk() if rel and stat.S_ISREG(info.st_mode) and rel not in seeded]
        for rel in sorted(files, key=lambda r: (r.endswith(".narinfo") or r == "nix-cache-info", r)):
            try:
                if stat.S_ISREG(cache.lstat(rel).st_mode):
                    continue  # nix copy would have kept it too
            except FileNotFoundError:
                pass
            with staging.open_read(rel) as file:
                cache.write_from(rel, file, mode=0o644)
    return seconds


def _seed_narinfos(cache: Tree, staging: Tree, paths: list[str]) -> set[str]:
    """The narinfos of `paths`' closure that the cache holds as regular files, copied into `staging`: their names."""
    argv = [command.nix_program(), *command.FEATURES, "path-info", "--recursive", "--offline", *paths]
    done = launcher.run(argv, capture_output=True, text=True, timeout=120)
    seeded = set()
    for path in done.stdout.split() if done.returncode == 0 else []:
        rel = f"{Path(path).name.split('-', 1)[0]}.narinfo"
        try:
            staging.write_bytes(rel, cache.read_bytes(rel, limit=1 << 20))
        except OSError:  # missing, a link or a FIFO (UnsafePath is an OSError): nix copy writes a fresh one
            continue
        seeded.add(rel)
    return seeded


def _copy_failed(destination: Destination, tail: list[str]) -> NixError:
    error = _last_error(tail)
    ping = f"nix store ping --store {shlex.quote(destination.url)}"
    fix = f"check the URL and your rights there ({ping})"
    if any(marker in error for marker in UNREACHABLE):
        fix = f"check that {destination.url} is reachable and writable from this machine ({ping})"
    return NixError(f"nix copy to {destination.url} failed: {error}", fix=fix, log_tail="\n".join(tail))


def _last_error(lines: list[str]) -> str:
    errors = [line.strip() for line in lines if line.strip().startswith("error:")]
    text = errors[-1] if errors else (lines[-1].strip() if lines else "no output")
    return text.removeprefix("error:").strip()


def closure(store_path: str) -> tuple[int, int, str]:
    """(number of paths, total NAR bytes, NAR hash of the path itself) of a store path's closure."""
    argv = [
        command.nix_program(),
        *command.FEATURES,
        "path-info",
        "--json",
        "--offline",
        "--recursive",
        "--closure-size",
        store_path,
    ]
    result = launcher.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise NixError(
            f"nix path-info of {store_path} failed: {_last_error(result.stderr.splitlines())}",
            fix="check the path with 'nix path-info'",
        )
    infos = {info["path"]: info for info in json.loads(result.stdout)}
    top = infos.get(store_path, {"valid": False})
    if top.get("valid") is False:  # path-info exits 0 for a path the store does not hold
        raise NixError(
            f"{store_path} is not a valid path in the Nix store", fix="build the tool again ('flakebot craft --fresh')"
        )
    return len(infos), int(top.get("closureSize", 0)), str(top.get("narHash", ""))


# ---------------------------------------------------------------- what a consumer runs


def consumer_help(
    destination: Destination, key: SigningKey | None, store_path: str, main_program: str
) -> dict[str, Any]:
    """How another machine gets the tool: the copy command, the nix.conf lines of a cache, the binary to run."""
    trust = ["--option", "extra-trusted-public-keys", key.public] if key else []
    checks = [] if destination.binary_cache else ["--no-check-sigs"]
    substitute = ["nix", *command.FEATURES, "copy", "--from", destination.url, *trust, *checks, store_path]
    nix_conf = f"extra-substituters = {destination.url}\n" + (
        f"extra-trusted-public-keys = {key.public}\n" if key else ""
    )
    run = [f"{store_path}/bin/{main_program}"]
    return {
        "substitute_command": {"argv": substitute, "shell": shlex.join(substitute)},
        "nix_conf": nix_conf if destination.binary_cache else "",
        "run_command": {"argv": run, "shell": shlex.join(run) + " ARGS"},
    }


def _main_program(tool_dir: Path, tool: str) -> str:
    try:
        return str(json.loads((tool_dir / "manifest.json").read_text()).get("main_program") or tool)
    except (OSError, json.JSONDecodeError):
        return tool
