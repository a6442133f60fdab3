"""Which crate sources a host cargo call may reach: the one place a manifest's sources are checked.

Host cargo (fetch, generate-lockfile, add, resolving metadata) follows every source a manifest names, and
what it fetches lands in flakebot's CARGO_HOME, which sandboxes read. So before any of those runs
(`Cargo.run`), every source the tree names must be one a user would allow:

    registry crates   crates.io only (flakebot's own replacement of it is configuration, not the manifest)
    git               https:// on a host of the `git_sources` setting (github.com, gitlab.com, ...); an entry
                      with a scheme (`git://127.0.0.1`) allows exactly that scheme, host and path prefix
    path              inside the tree (the run's workspace, else the cargo workspace root); so is every
                      manifest read (a workspace member), and through a link, where it leads

checked in dependencies of every kind and target (cargo metadata --no-deps --offline lists them, inherited
workspace dependencies resolved), `[workspace.dependencies]`, `[patch.*]` and `[replace]` (the manifests
read as TOML), and the Cargo.lock before and after the call. Never file://, ssh, other registries
(`registry`, `registry-index`), credentials in a URL, or loopback/private/link-local addresses by a bare host.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from flakebot.safefs import read_file_text

if TYPE_CHECKING:
    from flakebot.cargo.runner import Cargo

logger = logging.getLogger(__name__)

DEFAULT_GIT_SOURCES = "github.com,gitlab.com,codeberg.org,git.sr.ht,bitbucket.org"
CRATES_IO = ("registry+https://github.com/rust-lang/crates.io-index", "sparse+https://index.crates.io/")
_CRATES_IO = frozenset(s.rstrip("/") for s in CRATES_IO)
SPEC_KEYS = ("git", "path", "registry", "registry-index")
DEPENDENCY_KINDS = ("dependencies", "dev-dependencies", "dev_dependencies", "build-dependencies", "build_dependencies")


def git_sources(setting: str) -> tuple[str, ...]:
    """The `git_sources` setting as a tuple of entries (comma or space separated)."""
    return tuple(entry for entry in setting.replace(",", " ").split() if entry)


def git_refusal(url: str, allowed: tuple[str, ...]) -> str:
    """Why the git URL `url` may not be fetched ('' when it may)."""
    bare = url.removeprefix("git+").split("#")[0].split("?")[0]
    rule = f"only https:// git URLs on the hosts of the git_sources setting ({', '.join(allowed) or 'none'})"
    try:
        parts = urlsplit(bare)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        return f"git source {bare} refused: not a URL; {rule}"
    if parts.username or parts.password:
        return f"git source {bare} refused: credentials in the URL; {rule}"
    for entry in allowed:
        if "://" in entry and _under(parts, urlsplit(entry)):
            return ""
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host in {e.lower() for e in allowed} and parts.port in (None, 443):
        return "" if not _private(host) else f"git source {bare} refused: {host} is a local or private address"
    if parts.scheme != "https":
        why = f"{parts.scheme or 'no scheme'}:// is not https://"
    elif _private(host):
        why = f"{host} is a local or private address"
    elif parts.port not in (None, 443):
        why = f"port {parts.port} is not https' own"
    else:
        why = f"{host or 'no host'} is not an allowed host"
    return f"git source {bare} refused: {why}; {rule}"


def _under(url: Any, entry: Any) -> bool:
    """`url` is under the scheme, host, port (when the entry names one) and path of the allow-list `entry`."""
    same = url.scheme == entry.scheme and (url.hostname or "") == (entry.hostname or "")
    port = entry.port is None or url.port == entry.port
    prefix = entry.path.rstrip("/")
    return same and port and (not prefix or url.path == prefix or url.path.startswith(prefix + "/"))


def _private(host: str) -> bool:
    if host == "localhost" or host.endswith((".localhost", ".local")) or not host:
        return True
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return not ip.is_global


def git_fetch_env(allowed: tuple[str, ...]) -> dict[str, str]:
    """Environment of host cargo calls: git fetched by the git program, which speaks only the protocols the allow-list
    names (https, and the schemes of entries that name one), so a git dependency's own manifest cannot lead cargo to
    file://, ssh or another protocol either; no system git config, no prompts."""
    schemes = sorted({"https", *(entry.split("://")[0] for entry in allowed if "://" in entry)})
    return {
        "CARGO_NET_GIT_FETCH_WITH_CLI": "true",
        "GIT_ALLOW_PROTOCOL": ":".join(schemes),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
    }


def is_crates_io(source: str) -> bool:
    """Whether a cargo source id is crates.io's index (git or sparse, with or without its trailing slash)."""
    return source.rstrip("/") in _CRATES_IO


def source_refusal(source: str, allowed: tuple[str, ...]) -> str:
    """Why a cargo source id (`registry+URL`, `git+URL?...#rev`, `sparse+URL`) may not be used ('' when it may)."""
    if source.startswith("git+"):
        return git_refusal(source, allowed)
    if is_crates_io(source):
        return ""
    return f"crate source {source} refused: only crates.io (the configured registry) and allowed git sources"


def path_refusal(path: Path | str, tree: Path) -> str:
    if Path(path).resolve().is_relative_to(tree.resolve()):
        return ""
    return f"path {path} refused: it is outside the crate's tree {tree}"


def spec_refusal(name: str, spec: Any, base: Path, tree: Path, allowed: tuple[str, ...], where: str) -> str:
    """Why one dependency table (`{ git = ..., path = ..., registry = ... }`) is refused ('' when fine)."""
    if not isinstance(spec, dict):
        return ""  # a version requirement: crates.io
    reason = ""
    if "registry" in spec or "registry-index" in spec:
        other = spec.get("registry-index") or spec.get("registry")
        reason = f"registry {other} refused: only crates.io (the configured registry)"
    elif "git" in spec:
        reason = git_refusal(str(spec["git"]), allowed)
    elif "path" in spec:
        reason = path_refusal(base / str(spec["path"]), tree)
    return f"{reason} ({name} in {where})" if reason else ""


def check(
    cargo: Cargo, crate_dir: Path, listed: dict[str, Any] | None = None
) -> subprocess.CompletedProcess[str] | None:
    """None when every source the tree at `crate_dir` names may be fetched; else the failed call to return instead:
    cargo's own error when it cannot even list them, or the refusal (exit 101, the rule as cargo's `error:`).
    `listed`: cargo's `metadata --no-deps` answer for the tree as it is, which the caller has (cargo not asked)."""
    args = ["metadata", "--format-version", "1", "--no-deps", "--offline"]
    if listed is not None:  # the manifests are read now, their dependency tables too: the listing may be older
        reason = manifest_refusal(cargo, listed, reread=True)
        return refused(cargo.host_argv(args, crate_dir), reason) if reason else None
    answer = cargo.call(args, crate_dir, timeout=300)
    if answer.returncode != 0:
        return answer
    reason = manifest_refusal(cargo, json.loads(answer.stdout))
    return refused(answer.args, reason) if reason else None


def refused(argv: list[str], reason: str) -> subprocess.CompletedProcess[str]:
    logger.warning("host cargo refused: %s", reason)
    return subprocess.CompletedProcess(argv, 101, "", f"error: {reason}\n")


def manifest_refusal(cargo: Cargo, meta: dict[str, Any], *, reread: bool = False) -> str:
    """Why the workspace `cargo metadata --no-deps` describes names a source that may not be fetched ('' when none).
    `reread`: `meta` is a listing the caller kept, so each listed manifest's dependency tables are read as they are now
    too (a dependency written after the listing is not in it)."""
    root = Path(meta["workspace_root"])
    tree = cargo.tree or root
    allowed = cargo.git_sources
    if not root.resolve().is_relative_to(tree.resolve()):
        return f"workspace root {root} refused: it is outside the crate's tree {tree}"
    for package in meta["packages"]:
        for dep in package["dependencies"]:
            path, source = dep.get("path"), dep.get("source")
            reason = path_refusal(path, tree) if path else source_refusal(source, allowed) if source else ""
            if reason:
                return f"{reason} (dependency {dep['name']} of {package['name']})"
    manifests = dict.fromkeys([root / "Cargo.toml", *(Path(p["manifest_path"]) for p in meta["packages"])])
    for manifest in manifests:
        real = manifest.resolve()  # cargo reads a manifest through links: so does the check, inside the tree only
        if not real.is_relative_to(tree.resolve()):
            return f"manifest {manifest} refused: it is outside the crate's tree {tree}"
        try:
            specs = list(_table_specs(real, dependencies=reread))
        except (OSError, UnicodeDecodeError) as exc:  # a FIFO at the name: refused, not waited on
            return f"manifest {manifest} refused: it cannot be read as a file ({exc})"
        for name, spec, where in specs:
            reason = spec_refusal(name, spec, manifest.parent, tree, allowed, where)
            if reason:
                return reason
    return lock_refusal(root / "Cargo.lock", allowed)


def _table_specs(manifest: Path, *, dependencies: bool = False) -> Iterator[tuple[str, Any, str]]:
    """(name, spec, where) of `[workspace.dependencies]`, `[patch.*]` and `[replace]` in one Cargo.toml; with
    `dependencies`, of its own dependency tables too (of every kind and target, as cargo would list them)."""
    try:
        doc = tomllib.loads(read_file_text(manifest))  # a FIFO at the name raises: refused, not waited on
    except (FileNotFoundError, tomllib.TOMLDecodeError):  # gone since cargo listed it, or cargo's own error to give
        return
    tables = {"[workspace.dependencies]": doc.get("workspace", {}).get("dependencies", {})}
    if dependencies:
        tables.update(_dependency_tables(doc))
    tables["[replace]"] = doc.get("replace", {})
    for key, table in doc.get("patch", {}).items():
        tables[f"[patch.{key}]"] = table
        if "://" in key:  # patching a git source by its URL
            yield key, {"git": key}, f"{manifest} [patch]"
    for label, table in tables.items():
        if isinstance(table, dict):
            for name, spec in table.items():
                yield name, spec, f"{manifest} {label}"


def _dependency_tables(doc: dict[str, Any]) -> dict[str, Any]:
    """A manifest's own dependency tables by where they are, each spec as cargo takes it (`registry = "crates-io"`
    is crates.io, as cargo's listing says)."""
    found = {f"[{kind}]": doc.get(kind) for kind in DEPENDENCY_KINDS}
    targets = doc.get("target")
    for platform, table in targets.items() if isinstance(targets, dict) else []:
        if isinstance(table, dict):
            found.update({f"[target.{platform}.{kind}]": table.get(kind) for kind in DEPENDENCY_KINDS})
    return {
        where: {name: _as_listed(spec) for name, spec in table.items()}
        for where, table in found.items()
        if isinstance(table, dict)
    }


def _as_listed(spec: Any) -> Any:
    if isinstance(spec, dict) and spec.get("registry") == "crates-io" and "registry-index" not in spec:
        return {key: value for key, value in spec.items() if key != "registry"}
    return spec


def lock_refusal(lock: Path, allowed: tuple[str, ...]) -> str:
    """Why a package source in the Cargo.lock `lock` may not be used ('' when all may, or there is no lock)."""
    try:
        doc = tomllib.loads(read_file_text(lock))  # a FIFO or link at the name: refused, not waited on
    except FileNotFoundError:
        return ""
    except (OSError, tomllib.TOMLDecodeError) as exc:
        return f"{lock} cannot be read as TOML ({exc})"
    for package in doc.get("package", []):
        source = package.get("source") if isinstance(package, dict) else None
        reason = source_refusal(str(source), allowed) if source else ""
        if reason:
            return f"{reason} (package {package.get('name')} in {lock.name})"
    return ""
