"""Installing a tool from a shared catalog: verify the cache's signed index, fetch the entry and closure it names,
check them, catalogue the tool.

Trust is explicit: only the caches in the `catalogs` setting are read (with a team tenant, the organisation's and
that tenant's own: Settings.shared_catalogs), and only with the keys configured for each. `read_catalog` is the one
way in to a cache's index: its snapshot must be signed by one of those keys,
unexpired and well formed (flakebot.deliver.index), and no older than what this machine saw of that catalog
(flakebot.deliver.seen) before anything reads it; a refusal is a CatalogTrustError (exit 61), and craft skips that
catalog with a warning. The entry and the tool's closure are fetched with `nix copy --from` against exactly those
keys (trusted-public-keys, require-sigs, never --no-check-sigs); then the entry and every path of the closure
that Nix let in unsigned (content-addressed ones) must carry a signature by one of them
(flakebot.deliver.signatures). The signed entry must be the tool asked for (name, version, need) and name the
index record's store path, and so must its manifest: what runs is the one path verified. Its `nix run` command and
its USAGE.md are made here (the publisher's usage fenced as data), never taken from the entry. Nothing is built
and no cargo runs.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.config import Settings
from flakebot.deliver import seen, shared
from flakebot.deliver.catalog import Catalog, normalize_need
from flakebot.deliver.index import Snapshot, verify
from flakebot.deliver.manifest import install_command
from flakebot.deliver.versions import VERSION_RE, ToolRef, parse_ref
from flakebot.errors import CatalogError, NixError
from flakebot.modeltext import DATA_NOTE, fenced, markdown, one_line
from flakebot.nix import command
from flakebot.toolspec import NAME_RE

logger = logging.getLogger(__name__)

CONFIGURE_FIX = 'add it to flakebot.toml: [[catalogs]] url = "URL" keys = ["NAME:BASE64"] (the publisher\'s public key)'
REFUSED = ("lacks a valid signature", "no signature", "not signed")


def sources(settings: Settings, url: str | None = None) -> list[dict[str, Any]]:
    """The configured shared catalogs ({url, keys}), or the one `url` names, which must be configured (a tenant's:
    the organisation's and its own, never another tenant's)."""
    configured = list(settings.shared_catalogs())
    if url is None:
        if not configured:
            raise CatalogError("no shared catalogs are configured", fix=CONFIGURE_FIX)
        return configured
    wanted = url.strip().rstrip("/")
    found = [source for source in configured if source["url"] == wanted]
    if not found:
        raise CatalogError(
            f"{wanted} is not a configured catalog, so no key is trusted for it",
            fix=CONFIGURE_FIX.replace("URL", wanted),
        )
    return found


def read_catalog(source: dict[str, Any], settings: Settings) -> Snapshot:
    """The catalog's index, verified: signed by one of its configured keys, unexpired, well formed, and not older
    than what this machine saw of it (which it then records). The only way anything reads a shared index."""
    url, keys = source["url"], list(source["keys"])
    raw = shared.read_index(url, settings.catalog_read_timeout)
    if raw is None:
        if seen.last_sequence(url, settings) is not None:  # it had an index: taking it away hides every update
            raise seen.rollback(url, "its index is gone, though this machine saw one", seen.state_file(settings))
        return Snapshot(url, "", 0, 0.0, 0.0, "", {})
    snapshot = verify(raw, url, keys, now=time.time())
    seen.check_and_record(snapshot, settings)
    return snapshot


def remote_tools(settings: Settings, url: str | None = None) -> list[dict[str, Any]]:
    """Every tool the shared catalogs list (each version), with the catalog it is in and the key that signed it."""
    listed = []
    for source in sources(settings, url):
        snapshot = read_catalog(source, settings)
        for name, tool in sorted(snapshot.tools.items()):
            for version, record in sorted(tool["versions"].items()):
                listed.append(
                    {
                        "name": name,
                        "version": version,
                        "current": version == tool["version"],
                        "need": tool["need"],
                        "summary": record["summary"],
                        "catalog": source["url"],
                        "signed_by": snapshot.signer.partition(":")[0],
                        "public_key": snapshot.signer,
                        "trusted": True,  # the index verified against this key, which the user configured
                        "store_path": record["store_path"],
                        "published_at": record["published_at"],
                        "sequence": snapshot.sequence,
                        "expires": snapshot.expires,
                    }
                )
    return listed


def find_need(need: str, settings: Settings, only: dict[str, Any] | None = None) -> tuple[dict[str, Any], str] | None:
    """(catalog, NAME@VERSION) of a tool a configured shared catalog (or `only` that one) holds for the same
    (normalized) need. A catalog that cannot be read, or whose index is refused, is skipped with a warning: a craft
    goes on without it."""
    key = normalize_need(need)
    for source in [only] if only is not None else settings.shared_catalogs():
        try:
            snapshot = read_catalog(source, settings)
        except CatalogError as exc:
            logger.warning("shared catalog %s skipped: %s", source["url"], exc.one_line())
            continue
        for name, tool in sorted(snapshot.tools.items()):
            if tool["need_key"] == key:
                return source, f"{name}@{tool['version']}"
    return None


def install(ref: str, settings: Settings, url: str | None = None, need: str | None = None) -> dict[str, Any]:
    """Install NAME or NAME@VERSION from the first configured catalog (or `url`) listing it; its catalog entry here.
    `need`: the tool must have been made for that need (as craft finds it)."""
    tool_ref = parse_ref(ref)
    for source in sources(settings, url):
        installed = _install_listed(tool_ref, source, settings, need)
        if installed is not None:
            return installed
    where = url or ", ".join(s["url"] for s in settings.shared_catalogs())
    raise CatalogError(
        f"no tool '{tool_ref.name}' in the shared catalogs ({where})", fix="list them with 'flakebot list --remote'"
    )


def install_from_catalog(
    ref: str, source: dict[str, Any], settings: Settings, need: str | None = None
) -> dict[str, Any]:
    """Install NAME or NAME@VERSION from the one configured catalog `source` (verified with its own keys only)."""
    installed = _install_listed(parse_ref(ref), source, settings, need)
    if installed is None:
        raise CatalogError(
            f"no tool '{parse_ref(ref).name}' in the shared catalogs ({source['url']})",
            fix="list them with 'flakebot list --remote'",
        )
    return installed


def _install_listed(
    tool_ref: ToolRef, source: dict[str, Any], settings: Settings, need: str | None
) -> dict[str, Any] | None:
    """The tool installed from `source` when its verified index lists it, None when it does not."""
    tool = read_catalog(source, settings).tools.get(tool_ref.name)
    if tool is None:
        return None
    version = tool_ref.version or tool["version"]
    record = tool["versions"].get(version)
    if record is None:
        raise CatalogError(
            f"{source['url']} has no version {version} of {tool_ref.name} (it has {', '.join(tool['versions'])})",
            fix=f"install one of those: flakebot install {tool_ref.name}@VERSION",
        )
    return install_from(source, record, settings, Wanted(tool_ref.name, str(version), need))


@dataclass(frozen=True)
class Wanted:
    """What the caller asked for, which the signed entry must be (the index's signer may differ from the entry's)."""

    name: str
    version: str
    need: str | None = None


def install_from(source: dict[str, Any], record: dict[str, Any], settings: Settings, wanted: Wanted) -> dict[str, Any]:
    """Fetch and check one published version (its verified index record), then catalogue it as installed from `source`."""
    started = time.monotonic()
    entry_path, store_path = str(record["entry_path"]), str(record["store_path"])
    fetch(source, [entry_path], settings)
    signer = require_signed(entry_path, source, settings)
    entry = _checked_entry(Path(entry_path), wanted, source, store_path)
    fetch(source, [store_path], settings)
    require_signed(store_path, source, settings)  # the tool itself, whatever Nix checked
    require_closure_signed(store_path, source, settings)
    installed_from = {
        "catalog": source["url"],
        "signed_by": signer.partition(":")[0],
        "public_key": signer,
        "entry_path": entry_path,
        "installed_at": time.time(),
    }
    catalogued = _catalogue(entry, Path(entry_path), installed_from, settings)
    logger.info(
        "installed %s %s from %s in %.1f s", entry["name"], entry["version"], source["url"], time.monotonic() - started
    )
    return catalogued


def _checked_entry(entry_dir: Path, wanted: Wanted, source: dict[str, Any], store_path: str) -> dict[str, Any]:
    """The signed entry, refused unless it is the tool asked for, names the store path the signed index does (and
    its manifest the same), and its names are safe to use as paths here."""
    try:
        entry = json.loads((entry_dir / "entry.json").read_text())
        manifest = json.loads((entry_dir / "manifest.json").read_text())
        name, version, entry_store = str(entry["name"]), str(entry["version"]), str(entry["store_path"])
        main = str(manifest.get("main_program") or name)
        runs = str(manifest.get("store_path") or entry_store)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CatalogError(
            f"the entry {entry_dir} from {source['url']} is unreadable ({type(exc).__name__})",
            fix="ask the publisher to publish again",
        ) from None
    problems = [
        f"it is {name}@{version}, not {wanted.name}@{wanted.version}"
        if (name, version) != (wanted.name, wanted.version)
        else "",
        f"it was made for another need ({one_line(entry.get('need', ''), 80)!r})"
        if wanted.need is not None and normalize_need(str(entry.get("need", ""))) != normalize_need(wanted.need)
        else "",
        "its name or version is malformed" if not NAME_RE.fullmatch(name) or not VERSION_RE.fullmatch(version) else "",
        f"its store path is not the one the signed index names ({store_path})" if entry_store != store_path else "",
        f"its manifest runs another store path than the one verified ({store_path})" if runs != store_path else "",
        "its program name is not a plain file name" if "/" in main or main in ("", ".", "..") else "",
    ]
    if any(problems):
        raise CatalogError(
            f"refused the entry {entry_dir} from {source['url']}: {'; '.join(p for p in problems if p)}",
            fix="the shared catalog's publisher signed a wrong entry: tell them",
            reason="mismatch",
        )
    return dict(entry)


def _store_path(path: str) -> bool:
    parts = Path(path).parts
    return len(parts) == 4 and parts[:3] == ("/", "nix", "store") and not parts[3].startswith(".")


def fetch(source: dict[str, Any], paths: list[str], settings: Settings) -> None:
    """`nix copy --from` the catalog's cache, trusting only its configured keys."""
    keys = " ".join(source["keys"])
    args = [
        "--from",
        source["url"],
        "--option",
        "trusted-public-keys",
        keys,
        "--option",
        "require-sigs",
        "true",
        *paths,
    ]
    argv = command.nix_argv(["copy"], args, "pinned", None)
    outcome = command.run_streaming(argv, settings.nix_copy_timeout)
    if outcome.timed_out:
        raise NixError(
            f"nix copy from {source['url']} timed out after {settings.nix_copy_timeout:g} s",
            fix="raise nix_copy_timeout ('flakebot config set nix_copy_timeout 3600')",
        )
    if outcome.returncode != 0:
        errors = [line.strip() for line in outcome.tail if line.strip().startswith("error:")] or outcome.tail[-1:]
        error = (errors[-1] if errors else "no output").removeprefix("error:").strip()
        if any(marker in error for marker in REFUSED):
            raise _untrusted(paths[0], source)
        raise NixError(
            f"nix copy from {source['url']} failed: {error}",
            fix=f"check that {source['url']} is reachable (nix store ping --store {source['url']})",
            log_tail="\n".join(outcome.tail),
        )


def require_signed(path: str, source: dict[str, Any], settings: Settings) -> str:
    """The configured key with a valid signature on `path` as this store holds it, or a refusal. The signatures
    are this store's and the cache's: a path the store held already (built here, or fetched from another catalog)
    was not copied, so its record lacks the cache's. Either is checked against the local path's own NAR hash, size
    and references, so a cache's signature counts only for the very content here."""
    from flakebot.deliver.signatures import fingerprint, verified_signer

    info = _path_infos([path], settings)[0]
    if info.get("valid", True) is False:
        raise _untrusted(path, source)
    signatures = [str(sig) for sig in info.get("signatures") or []]
    signer = verified_signer(fingerprint(info), signatures, source["keys"])
    if signer is None:
        cached = _path_infos([path], settings, store=source["url"])[0]
        signatures += [str(sig) for sig in cached.get("signatures") or []]
        signer = verified_signer(fingerprint(info), signatures, source["keys"])
    if signer is None:
        raise _untrusted(path, source)
    return signer


def require_closure_signed(store_path: str, source: dict[str, Any], settings: Settings) -> None:
    """Every path of the tool's closure is signed by a configured key (its record here, or the cache's over the
    same content) or was built on this machine (ultimate). Neither kind of path is taken on Nix's word: Nix lets a
    content-addressed path in unsigned, and copies (so checks) no path this store held already, an input-addressed
    one fetched from another catalog under another key included."""
    from flakebot.deliver.signatures import fingerprint, trusted_signer, verified_signer

    unvouched = []
    for info in _path_infos([store_path], settings, recursive=True):
        if info.get("valid") is False:
            raise _untrusted(str(info.get("path", store_path)), source)
        if not info.get("ultimate") and trusted_signer(info, source["keys"]) is None:
            unvouched.append(info)
    if not unvouched:
        return
    # paths this store held already (nix copy did not bring their signatures): the cache's own signature over this
    # very content (its NAR hash, size and references here), asked for all at once, or a refusal
    cached = _path_infos([str(info["path"]) for info in unvouched], settings, store=source["url"])
    signed = {str(record.get("path")): [str(sig) for sig in record.get("signatures") or []] for record in cached}
    for info in unvouched:
        signatures = [*(str(sig) for sig in info.get("signatures") or []), *signed.get(str(info["path"]), [])]
        if verified_signer(fingerprint(info), signatures, source["keys"]) is None:
            raise _untrusted(str(info["path"]), source)


def _path_infos(
    paths: list[str], settings: Settings, recursive: bool = False, store: str | None = None
) -> list[dict[str, Any]]:
    """`nix path-info` records of `paths` in this store (or the binary cache `store`), signatures included."""
    where = ["--store", store] if store else ["--offline"]
    flags = ["--json", "--sigs", *where, *(["--recursive"] if recursive else [])]
    argv = command.nix_argv(["path-info"], [*flags, *paths], "pinned", None)
    done = launcher.run(argv, capture_output=True, text=True, timeout=settings.nix_copy_timeout)
    try:
        infos = json.loads(done.stdout)
        assert isinstance(infos, list) and infos and all(isinstance(info, dict) for info in infos)
    except (json.JSONDecodeError, AssertionError):
        raise NixError(
            f"nix path-info of {paths[0]} failed: {done.stderr.strip()[-300:]}", fix="check the Nix store"
        ) from None
    return infos


def _untrusted(path: str, source: dict[str, Any]) -> CatalogError:
    names = ", ".join(key.partition(":")[0] for key in source["keys"])
    return CatalogError(
        f"refused {path} from {source['url']}: it is not signed by a key you trust ({names})",
        fix="ask the publisher for their public key and check it, or remove that catalog from the catalogs setting",
        reason="untrusted",
    )


def _catalogue(
    entry: dict[str, Any], entry_dir: Path, installed_from: dict[str, Any], settings: Settings
) -> dict[str, Any]:
    """Put the fetched tool in this machine's catalog: its files from the entry, paths rewritten to this catalog."""
    catalog = Catalog.open(settings)
    name, version = str(entry["name"]), str(entry["version"])
    here, there = str(catalog.version_dir(name, version)), str(entry.get("catalog_dir") or "")
    manifest_text = (entry_dir / "manifest.json").read_text()
    usage_md = (entry_dir / "USAGE.md").read_text()
    if there:  # the publisher's catalog paths (flake_ref, nix run) become this catalog's
        manifest_text = manifest_text.replace(json.dumps(there)[1:-1], json.dumps(here)[1:-1])
        usage_md = usage_md.replace(there, here)
    manifest = {**json.loads(manifest_text), "catalog_dir": here, "installed_from": installed_from}
    manifest["store_path"] = str(entry["store_path"])  # what runs: the one path verified (checked equal already)
    usage_md = installed_usage(name, manifest, usage_md, installed_from)
    # The command to run it is this machine's, never the entry's (a command line would run outside the sandbox).
    nix_run = command.run_argv(Path(here) / "flake", "pinned", None)
    manifest.update(nix_run_argv=nix_run, flake_ref=str(Path(here) / "flake"), nix_run=shlex.join(nix_run) + " -- ARGS")
    manifest["installation_command"] = shlex.join(install_command(nix_run))
    with tempfile.TemporaryDirectory(prefix="flakebot-install-") as tmp:
        flake = Path(tmp) / "flake"
        if (entry_dir / "flake").is_dir():  # writable copies: the store's are read-only
            shutil.copytree(entry_dir / "flake", flake, symlinks=True, copy_function=shutil.copyfile)
            for path in [flake, *flake.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() else 0o644)
        else:
            flake.mkdir()
        return catalog.add(
            name,
            need=str(entry.get("need", "")),
            flake_dir=flake,
            manifest=manifest,
            usage_md=usage_md,
            store_path=str(entry["store_path"]),
            run_id="",
            origin=dict(manifest.get("origin") or {}),
            version=version,
            installed_from=installed_from,
        )


def installed_usage(name: str, manifest: dict[str, Any], publisher_usage: str, installed_from: dict[str, Any]) -> str:
    """USAGE.md of an installed tool: flakebot's own lines, then the publisher's USAGE.md fenced as data."""
    return (
        f"# {name}\n\n{markdown(manifest.get('summary', ''))}\n\n"
        f"Installed from the shared catalog {markdown(installed_from['catalog'])}, signed by "
        f"{markdown(installed_from['signed_by'])}: nothing was built here.\n\n"
        f"The publisher's USAGE.md, {DATA_NOTE}:\n\n{fenced(publisher_usage, 'markdown')}\n"
    )
