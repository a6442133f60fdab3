"""The dependency skeleton of a crate: its manifests and Cargo.lock with dummy sources, from which the flake builds the
locked dependencies as a derivation of their own (crane's buildDepsOnly, with nixpkgs alone).

Two tools (or two versions of one tool) whose skeletons are equal get the same deps derivation, so Nix builds the
dependencies once and takes them from the store (or a binary cache) after that. Equal means: a lone package is renamed
SOLE_NAME, every local version is SKELETON_VERSION, manifests are written from parsed TOML with sorted keys (comments
and order do not count), and only what decides how dependencies compile is kept (dependencies, features, profiles,
patches, the workspace, edition, links). No model-written source goes in: each package gets an empty lib and, when it
has a build script, an empty one. Cargo rewrites the lock for the renamed package (host call, offline, on the
skeleton; its answer cached by the skeleton's content in cache_dir/skeleton-locks); a skeleton whose locked registry
packages would change is not used, and a cached lock is held to the same check. The edit loop's stub (`provisional`)
takes flakebot's rename of its lock instead, which its deps build proves (cargo --frozen takes only cargo's own lock)
before it is cached, and cargo relocks when that build fails (loopdeps.build_deps).

    write_skeleton(flake_dir, facts, settings) -> Skeleton, or None (the flake then builds in one derivation)
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from flakebot.config import Settings
from flakebot.errors import NixError
from flakebot.fsutil import atomic_write_text, remove_tree
from flakebot.nix import build_inputs
from flakebot.nix.crate import CrateFacts, LocalPackage

logger = logging.getLogger(__name__)

SKELETON_DIR = "flakebot-deps"  # in the flake, beside the crate's own files
SOLE_NAME = "flakebot-deps"
SKELETON_VERSION = "0.0.0"
DEPENDENCY_TABLES = ("dependencies", "dev-dependencies", "dev_dependencies", "build-dependencies", "build_dependencies")
# What decides how the dependencies compile; the rest of a manifest (targets, metadata, lints) is the crate's own.
KEPT_TABLES = ("cargo-features", *DEPENDENCY_TABLES, "target", "features", "patch", "replace", "profile", "workspace")
KEPT_PACKAGE_KEYS = ("edition", "links", "resolver", "workspace")
RELOCKED_DIR = "skeleton-locks"  # in cache_dir: cargo's relocked Cargo.lock of each skeleton, by _relock_key
RELOCKED_KEPT = 64


@dataclass(frozen=True)
class Skeleton:
    """The skeleton written into the flake: where, how its deps derivation selects packages, and the names of its own
    (dummy) units, which the derivation leaves out of its output."""

    directory: str
    build_flags: list[str]
    local_names: list[str]
    # set when the lock is flakebot's rename of the crate's (provisional), not cargo's relock: its relock key, under
    # which a build that took the lock keeps it (keep_renamed); '' for cargo's own (or a cached copy of it)
    renamed: str = ""
    # whether a package declares dev-dependencies: only then does the derivation's check phase compile anything (the
    # dev-dependencies, the features tests unify) that `cargo build` did not
    dev_dependencies: bool = True


def write_skeleton(
    flake_dir: Path, facts: CrateFacts, settings: Settings, *, provisional: bool = False
) -> Skeleton | None:
    """Write the dependency skeleton of the crate copied into flake_dir, or say why not (logged) and return None.

    `provisional` (the edit loop's stub, whose build falls back when it fails): a lone package's lock not relocked by
    cargo but renamed by flakebot as cargo would (_renamed, ~0.08 s of cargo's resolution saved), unless cargo's relock
    is cached. The build proves it: `cargo build --frozen` takes only the lock cargo itself would write, and the caller
    keeps it then (keep_renamed) or asks cargo when the build failed (relocked_otherwise)."""
    reason = _unsupported(flake_dir, facts)
    if reason:
        logger.info("dependencies build with the tool (no deps derivation): %s", reason)
        return None
    target = flake_dir / SKELETON_DIR
    sole = len(facts.local_packages) == 1
    files: dict[str, str] = {}
    for package in facts.local_packages:
        _package_files(files, flake_dir, package, SOLE_NAME if sole else "")
    _root_files(files, flake_dir, facts)
    for rel, text in files.items():
        _write(target / rel, text)
    lock = (flake_dir / "Cargo.lock").read_bytes()
    (target / "Cargo.lock").write_bytes(lock)
    key = _relock_key(files, lock, settings)
    member = facts.local_packages[0]
    renamed = (
        _renamed(lock, member.name, facts.version)
        if provisional and sole and member.name == facts.pname and not _kept_lock(settings, key).is_file()
        else None
    )
    if renamed is not None:
        (target / "Cargo.lock").write_text(renamed)
    elif not _relock(target, flake_dir / "Cargo.lock", settings, key):
        remove_tree(target)
        return None
    names = [SOLE_NAME] if sole else [p.name for p in facts.local_packages]
    return Skeleton(
        directory=SKELETON_DIR,
        build_flags=_without_bin_flags(facts.cargo_build_flags),
        local_names=sorted({form for name in names for form in (name, name.replace("-", "_"))}),
        renamed=key if renamed is not None else "",
        dev_dependencies=any(
            _declares_dev_dependencies(tomllib.loads(text)) for rel, text in files.items() if rel.endswith("Cargo.toml")
        ),
    )


def keep_renamed(flake_dir: Path, skeleton: Skeleton, settings: Settings) -> None:
    """A build took the skeleton's renamed lock (`cargo build --frozen` refuses any other than cargo's own): kept as
    cargo's relock of that skeleton, for the package stage's skeleton (the same key) and later crafts."""
    if skeleton.renamed:
        _keep(_kept_lock(settings, skeleton.renamed), (flake_dir / skeleton.directory / "Cargo.lock").read_text())


def relocked_otherwise(flake_dir: Path, skeleton: Skeleton, settings: Settings) -> bool | None:
    """After a failed build of a skeleton whose lock flakebot renamed: cargo's own relock put in its place. True when
    cargo wrote another lock (build again), False when the same (the build failed for another reason), None when
    cargo cannot lock it or would lock other registry crates (no deps derivation, as write_skeleton says)."""
    target = flake_dir / skeleton.directory
    renamed = (target / "Cargo.lock").read_bytes()
    (target / "Cargo.lock").write_bytes((flake_dir / "Cargo.lock").read_bytes())
    if not _relock(target, flake_dir / "Cargo.lock", settings, skeleton.renamed):
        return None
    return (target / "Cargo.lock").read_bytes() != renamed


def _renamed(lock: bytes, name: str, version: str) -> str | None:
    """The crate's Cargo.lock as cargo relocks it once its lone package is SOLE_NAME SKELETON_VERSION: that package's
    entry renamed and moved to its place in cargo's order (packages sorted by name first), nothing else changed; the
    skeleton's dependency tables are the crate's, so its lock is the crate's when that one is current. None for any
    lock this rename cannot be sure of: another layout (CR LF, a [metadata] or [[patch.unused]] table), the package not
    there exactly once, another entry naming it or SOLE_NAME. (A stale lock is caught by the build: cargo --frozen.)"""
    try:
        text = lock.decode()
    except UnicodeDecodeError:
        return None
    head, sep, rest = text.partition("\n[[package]]\n")
    if not sep or "\r" in text or not rest.endswith("\n") or "\n\n\n" in rest:
        return None
    blocks = ("[[package]]\n" + rest[:-1]).split("\n\n")
    if any(not block.startswith("[[package]]\nname = ") for block in blocks):
        return None
    names = [block.split("\n", 2)[1].removeprefix("name = ") for block in blocks]
    own = f'[[package]]\nname = "{name}"\nversion = "{version}"\n'
    found = [i for i, block in enumerate(blocks) if (block + "\n").startswith(own) and "\nsource = " not in block]
    if len(found) != 1 or f'"{SOLE_NAME}"' in names:
        return None
    mention = re.compile(rf'^ "{re.escape(name)}( [^"]*)?",?$', re.MULTILINE)
    if any(mention.search(block) for i, block in enumerate(blocks) if i != found[0]):
        return None  # another package depends on it: its entry would change too
    entry = (blocks.pop(found[0]) + "\n").replace(
        own, f'[[package]]\nname = "{SOLE_NAME}"\nversion = "{SKELETON_VERSION}"\n'
    )
    del names[found[0]]
    at = next((i for i, quoted in enumerate(names) if quoted.strip('"') > SOLE_NAME), len(blocks))
    blocks.insert(at, entry[:-1])
    return head + sep + "\n\n".join(blocks).removeprefix("[[package]]\n") + "\n"


def _kept_lock(settings: Settings, key: str) -> Path:
    return settings.path("cache_dir") / RELOCKED_DIR / f"{key}.lock"


def _unsupported(flake_dir: Path, facts: CrateFacts) -> str:
    """Why this crate's dependencies cannot build on a skeleton ('' when they can)."""
    if not facts.local_packages:
        return "cargo reported no workspace members"
    if facts.outside_path_packages:
        # a path crate that is not a member ([patch] of a registry crate, say) may be what registry crates build on
        return f"path packages outside the workspace members ({', '.join(facts.outside_path_packages)})"
    if (flake_dir / SKELETON_DIR).exists():
        return f"the crate has its own {SKELETON_DIR}"
    root = _load(flake_dir / "Cargo.toml")
    patterns = [str(p) for p in root.get("workspace", {}).get("members", [])]
    if any(fnmatch.fnmatch(SKELETON_DIR, pattern) for pattern in patterns):
        return f"a workspace member pattern would take in {SKELETON_DIR}"
    return ""


def _load(manifest: Path) -> dict[str, Any]:
    return tomllib.loads(manifest.read_text())


def _package_files(files: dict[str, str], flake_dir: Path, package: LocalPackage, rename: str) -> None:
    manifest = _load(flake_dir / package.manifest)
    skeleton = _kept(manifest)
    declared = manifest.get("package", {})
    skeleton["package"] = {
        "name": rename or package.name,
        "version": SKELETON_VERSION,
        **{key: declared[key] for key in KEPT_PACKAGE_KEYS if key in declared},
        "build": "build.rs" if package.build_script else False,
        "publish": False,
        **{f"auto{kind}": False for kind in ("bins", "examples", "tests", "benches")},
    }
    skeleton["lib"] = {"path": "src/lib.rs", **({"proc-macro": True} if package.proc_macro else {})}
    home = Path(package.manifest).parent
    files[str(home / "Cargo.toml")] = tomlkit.dumps(_sorted(skeleton))
    files[str(home / "src" / "lib.rs")] = ""
    if package.build_script:
        files[str(home / "build.rs")] = "fn main() {}\n"


def _root_files(files: dict[str, str], flake_dir: Path, facts: CrateFacts) -> None:
    """A virtual workspace's root manifest (a root that is a package was written with the packages)."""
    if any(p.manifest == "Cargo.toml" for p in facts.local_packages):
        return
    files["Cargo.toml"] = tomlkit.dumps(_sorted(_kept(_load(flake_dir / "Cargo.toml"))))


def _kept(manifest: dict[str, Any]) -> dict[str, Any]:
    """The tables of a manifest that decide how dependencies compile, path dependencies without a version
    requirement (the skeleton's local versions are all SKELETON_VERSION)."""
    kept = {key: manifest[key] for key in KEPT_TABLES if key in manifest}
    for table in _dependency_tables(kept):
        for spec in table.values():
            if isinstance(spec, dict) and "path" in spec:
                spec.pop("version", None)
    return kept


def _dependency_tables(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    tables = [manifest[key] for key in DEPENDENCY_TABLES if isinstance(manifest.get(key), dict)]
    for platform in manifest.get("target", {}).values():
        tables += [platform[key] for key in DEPENDENCY_TABLES if isinstance(platform.get(key), dict)]
    workspace = manifest.get("workspace", {})
    if isinstance(workspace.get("dependencies"), dict):
        tables.append(workspace["dependencies"])
    return tables


def _declares_dev_dependencies(manifest: dict[str, Any]) -> bool:
    """Whether a skeleton manifest names any dev-dependency, for every platform or for one ([target.X])."""
    platforms = [manifest, *(t for t in manifest.get("target", {}).values() if isinstance(t, dict))]
    return any(platform.get(key) for platform in platforms for key in ("dev-dependencies", "dev_dependencies"))


def _sorted(value: Any) -> Any:
    """Tables with their keys in order, so two manifests that say the same are the same text."""
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _relock_key(files: dict[str, str], lock: bytes, settings: Settings) -> str:
    """What cargo's relock of a skeleton depends on: its files, the crate's lock, and where crates come from."""
    digest = hashlib.sha256(
        json.dumps([sorted(files.items()), settings.registry, settings.local_registry, settings.offline]).encode()
    )
    digest.update(lock)
    return digest.hexdigest()


def _relock(target: Path, original: Path, settings: Settings, key: str) -> bool:
    """Let cargo rewrite the skeleton's lock for its local packages; False when it would lock other registry crates.
    A skeleton relocked before (the edit loop's stub, then the package stage; another tool on the same dependencies)
    takes cargo's lock from the cache, held to the same check."""
    from flakebot.cargo.runner import Cargo

    kept = _kept_lock(settings, key)
    if kept.is_file():
        if _from_cache(kept, target / "Cargo.lock", original):
            return True
        kept.unlink(missing_ok=True)  # not what cargo wrote for this skeleton: ask cargo again
        (target / "Cargo.lock").write_bytes(original.read_bytes())
    with tempfile.TemporaryDirectory(prefix="flakebot-cargo-") as scratch:
        cargo = Cargo.for_run(settings, Path(scratch) / "target")
        result = cargo.run(["metadata", "--format-version", "1", "--offline"], target, timeout=settings.command_timeout)
    if result.returncode != 0:
        logger.info("no deps derivation: cargo cannot lock the skeleton: %s", result.stderr.strip()[-300:])
        return False
    if _locked(target / "Cargo.lock") != _locked(original):
        logger.info("no deps derivation: the skeleton would lock other registry crates than the crate does")
        return False
    _keep(kept, (target / "Cargo.lock").read_text())
    return True


def _from_cache(kept: Path, lock: Path, original: Path) -> bool:
    """The cached lock written as the skeleton's, if it locks the registry packages the crate's lock does."""
    try:
        lock.write_bytes(kept.read_bytes())
        if _locked(lock) != _locked(original):
            return False
        os.utime(kept)
    except (OSError, UnicodeDecodeError, NixError):
        return False
    return True


def _keep(path: Path, lock: str) -> None:
    """Cache one relocked lock (a few KB), keeping the RELOCKED_KEPT most recently used; a cache that cannot be
    written costs a cargo call next time, nothing else."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, lock)
        kept = sorted(path.parent.glob("*.lock"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[RELOCKED_KEPT:]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        logger.info("skeleton lock not cached: %s", exc)


def _locked(lock: Path) -> set[tuple[str, str, str, str]]:
    """The lock's packages that come from a source (registry, git), with their checksums."""
    return {
        (str(p.get("name")), str(p.get("version")), str(p["source"]), str(p.get("checksum", "")))
        for p in build_inputs.lock_packages(lock)
        if p.get("source")
    }


def _without_bin_flags(flags: list[str]) -> list[str]:
    """The tool's cargoBuildFlags less `--bin NAME`: the skeleton has no binaries (dependencies compile the same)."""
    kept: list[str] = []
    skip = False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--bin":
            skip = True
        elif not flag.startswith("--bin="):
            kept.append(flag)
    return kept
