"""The dependency cache: a crate's locked dependencies compiled once, and copied into each edit loop's target dir.

An entry is a cargo target dir holding the dependencies `cargo test` builds, under flakebot's cache directory
(`cargo-deps/KEY`). It is built from the crate's skeleton (cargo/cache_skeleton.py: no line of the model's runs) in the
sandbox as its unprivileged uid, in a temp dir renamed into place once complete (a concurrent craft or a crash
leaves no half entry), then handed back to flakebot's own user with no group or other write. The edit loop's
sandbox never sees the cache: it gets a private copy as its CARGO_TARGET_DIR (`cp --reflink=auto -a`:
copy-on-write where the file system can, a full copy else; never hard links, which it could write through),
mtimes kept so cargo's fingerprints hold and the first `cargo test` compiles only the crate.

The cache holds at most `dependency_cache_mb`: storing an entry evicts the least recently used ones beyond it (a
use is a hit or a store: it sets the entry's mtime). An entry used in the last EVICT_GRACE_SECONDS stays, since a copy
of it may be running; one evicted is renamed away before it is removed, so a craft finds an entry whole or not at all.

The key is everything that changes the dependency build: the lock's packages, the manifest's dependency tables
(features asked of each dependency, profiles), the toolchain (`rustc -vV`), the profile, the crate's features
and the crate source cargo reads them from. With the sandbox off (or no bubblewrap) there is no cache: model
code running unisolated could rewrite any entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from flakebot import launcher, probecache
from flakebot.cargo.cache_skeleton import (
    SKELETON_NAME,
    CacheSkeleton,
    NoSkeleton,
    SkeletonInputs,
    read_inputs,
    skeleton_from,
    skeleton_of,
)
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings, rustup_home
from flakebot.fsutil import tree_bytes
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

CACHE_FORMAT = 1
PROFILE = "test"  # `cargo test`: its dependencies are built with the dev profile
ENTRY_INFO = "flakebot-deps.json"  # in each entry: what it was built for (to build the next one on it)
STALE_SECONDS = 6 * 3600  # a temp dir this old is a crashed build's
EVICT_GRACE_SECONDS = 3600  # an entry used this recently is never evicted: a copy of it may be running
EVICTED = ".evicted-"  # an entry renamed away, being removed
SKELETON_PREFIXES = (SKELETON_NAME, SKELETON_NAME.replace("-", "_"), "lib" + SKELETON_NAME.replace("-", "_"))


@dataclass(frozen=True)
class Seeded:
    """What the cache did for one target dir: `hit`, `built` (stored, then copied), `store` (the deps derivation's
    output copied, nix/loopdeps.py) or `skipped` (and why)."""

    status: str
    detail: str
    key: str = ""
    seconds: float = 0.0

    def note(self) -> str:
        if self.status == "skipped":
            return f"dependency cache not used: {self.detail}"
        if self.status == "store":  # nix/loopdeps.py: the flake's deps derivation, which the package stage reuses
            return f"dependency cache from the flake's deps derivation: {self.detail} ({self.seconds:.1f}s)"
        how = "" if self.status == "hit" else ", built once in the sandbox from the manifest and lock only"
        return (
            f"dependency cache {'hit' if self.status == 'hit' else 'stored'}: {self.detail}{how} ({self.seconds:.1f}s)"
        )


class DependencyBuildFailed(Exception):
    """The skeleton's dependencies did not build; the edit loop then builds them itself, as without a cache."""


def cache_root(settings: Settings) -> Path:
    return settings.path("cache_dir") / "cargo-deps"


def seed_target_dir(
    settings: Settings,
    cargo: Cargo,
    crate_dir: Path,
    target_dir: Path,
    *,
    isolated: bool,
    progress: Callable[[str], None] = lambda _: None,
) -> Seeded:
    """Give `target_dir` (empty or missing) the crate's compiled dependencies from the cache, building the entry
    first when there is none. `isolated`: the edit loop runs in bubblewrap (else no cache at all)."""
    if not isolated:
        return Seeded("skipped", "the sandbox is off, so model code could rewrite a shared entry")
    if target_dir.is_dir() and any(target_dir.iterdir()):
        return Seeded("skipped", "the target dir holds a build already")
    return _seed(settings, cargo, crate_dir, target_dir, progress)


class LoopSeeder:
    """The edit loop's target dir kept on the cache: seeded before the first `cargo test`, and seeded again whenever
    the crate's dependency set changes (the model added a dependency): the loop's own dir is dropped and a fresh copy
    of the new set's entry takes its place, so nothing is ever copied into a directory the model's code wrote."""

    def __init__(
        self,
        settings: Settings,
        cargo: Cargo,
        crate_dir: Path,
        target_dir: Path,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.settings, self.cargo, self.crate_dir, self.target_dir = settings, cargo, crate_dir, target_dir
        self.progress, self.key, self.packages = progress, "", list[str]()
        # the manifest, lock and build.rs that gave `key`: equal ones give it again, without parsing the TOML (as
        # nix/loopdeps.py's StoreSeeder)
        self.keyed_inputs: SkeletonInputs | None = None

    def seed(self, *, isolated: bool) -> Seeded:
        """The first seed, before the loop's first test: the model's own cargo runs (its check and test tools) may
        have written the target dir already; that goes first, beneath its parent's descriptor, no link followed."""
        if isolated and self.target_dir.is_dir() and any(self.target_dir.iterdir()):
            try:
                Tree(self.target_dir.parent).remove(self.target_dir.name)
            except OSError as exc:
                logger.warning("dependency cache: cannot clear the target dir (%s); the loop keeps it", exc)
        seeded = seed_target_dir(
            self.settings, self.cargo, self.crate_dir, self.target_dir, isolated=isolated, progress=self.progress
        )
        self.key, self.keyed_inputs = seeded.key, None  # "" when skipped, but for a crate with no dependencies yet
        self.packages = skeleton_of(self.crate_dir).packages() if self.key else []
        return seeded

    def refresh(self) -> Seeded | None:
        """Before a `cargo test`: a new seed when the dependency set changed since the last one (None: nothing done).
        A set with no entry yet is built only when dependencies were added (on the current entry, so only they
        compile); after a removal or another version, cargo in the loop handles the difference, as without a cache."""
        if not self.key:
            return None
        try:
            inputs = read_inputs(self.crate_dir)
            if inputs == self.keyed_inputs:
                return None
            skeleton = skeleton_from(inputs)
            key = dependency_key(skeleton, self.cargo)
        except NoSkeleton:
            return None
        if key == self.key:
            self.keyed_inputs = inputs
            return None
        grown = set(self.packages) <= set(skeleton.packages())
        self.key, self.packages, self.keyed_inputs = key, skeleton.packages(), None
        if not grown and not (cache_root(self.settings) / key).is_dir():
            return None
        try:  # the loop's sandbox wrote inside it: removed beneath its parent's descriptor, no link followed
            Tree(self.target_dir.parent).remove(self.target_dir.name)
        except OSError as exc:
            logger.warning("dependency cache: cannot clear the target dir (%s); the loop keeps it", exc)
            self.key = ""
            return None
        seeded = _seed(self.settings, self.cargo, self.crate_dir, self.target_dir, self.progress)
        self.key = seeded.key  # "" when skipped, but for a crate with no dependencies yet
        return seeded


def _seed(
    settings: Settings, cargo: Cargo, crate_dir: Path, target_dir: Path, progress: Callable[[str], None]
) -> Seeded:
    started = time.monotonic()
    try:
        skeleton = skeleton_of(crate_dir)
    except NoSkeleton as exc:
        return Seeded("skipped", str(exc))
    key = dependency_key(skeleton, cargo)
    if not skeleton.packages():  # a new crate: nothing to build or copy; the key lets refresh() see the first addition
        return Seeded("skipped", "the crate has no dependencies yet", key)
    entry = cache_root(settings) / key
    status = "hit"
    try:
        if not entry.is_dir():
            progress("building the dependencies once, sandboxed, from the manifest and lock only (dependency cache)")
            build_entry(settings, cargo, skeleton, key)
            status = "built"
        os.utime(entry)  # used now: the last to be evicted
        copy_entry(entry, target_dir)
    except (DependencyBuildFailed, OSError, subprocess.SubprocessError) as exc:
        logger.warning("dependency cache: %s", exc)
        try:  # a half copy could pass for fresh outputs
            Tree(target_dir.parent).remove(target_dir.name)
        except OSError as cleanup:
            logger.warning("dependency cache: cannot remove the half copy %s: %s", target_dir, cleanup)
        return Seeded("skipped", f"the dependencies did not build or copy alone ({exc})")
    size = tree_bytes(target_dir) // (1024 * 1024)
    return Seeded(status, f"{key[:12]}, {size} MiB copied", key, time.monotonic() - started)


def dependency_key(skeleton: CacheSkeleton, cargo: Cargo) -> str:
    """The entry's name: a digest of everything that changes the dependency build (see the module docstring)."""
    material = {"base": _base_key(cargo), "skeleton": json.loads(skeleton.key_material())}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _base_key(cargo: Cargo) -> str:
    """What every entry a build may start from must share with it: the toolchain, profile, features and source."""
    material = {
        "format": CACHE_FORMAT,
        "toolchain": rustc_version(cargo),
        "profile": PROFILE,
        "features": sorted(cargo.features),
        "source": cargo.source_args(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def rustc_version(cargo: Cargo) -> str:
    """`rustc -vV` of the pinned toolchain, asked from a neutral directory (no rust-toolchain.toml can steer it)."""
    env = cargo.host_env()
    return _rustc_version(
        tuple(sorted((k, env[k]) for k in ("PATH", "HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN") if k in env))
    )


def _rustc_version(env_items: tuple[tuple[str, str], ...]) -> str:
    """Asked once while rustup's proxy and what it chooses a toolchain by are unchanged (probecache, across
    processes): this answer keys dependency builds, so a toolchain updated in place must be asked again."""
    rustc = shutil.which("rustc") or "rustc"
    home = Path(dict(env_items).get("RUSTUP_HOME") or rustup_home())
    try:
        return probecache.remembered(
            ["-vV from a neutral directory", rustc, env_items],
            [Path(rustc), *probecache.toolchain_choice(home, tempfile.gettempdir())],
            lambda: _ask_rustc_version(rustc, env_items),
        )
    except _NoVersion as failed:
        return str(failed)


class _NoVersion(Exception):
    """rustc printed no version: the text to key by instead, never remembered."""


def _ask_rustc_version(rustc: str, env_items: tuple[tuple[str, str], ...]) -> str:
    with tempfile.TemporaryDirectory(prefix="flakebot-rustc-") as neutral:
        done = launcher.run(
            [rustc, "-vV"], cwd=neutral, env=dict(env_items), capture_output=True, text=True, timeout=60, check=False
        )
    if not done.stdout.strip():
        raise _NoVersion(f"unknown ({done.stderr.strip()[-200:]})")
    return done.stdout.strip()


def build_entry(settings: Settings, cargo: Cargo, skeleton: CacheSkeleton, key: str) -> Path:
    """Compile the skeleton's dependencies in the sandbox and store them atomically as entry `key`."""
    from flakebot.sandbox import limits_for, open_sandbox

    root = cache_root(settings)
    root.mkdir(parents=True, exist_ok=True)
    _sweep_stale(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{key[:12]}-", dir=root))
    try:
        crate, target = tmp / "crate", tmp / "target"
        try:
            skeleton.write(crate)
        except tomlkit.exceptions.TOMLKitError as exc:
            raise DependencyBuildFailed(f"cannot rewrite the manifest or lock: {exc}") from None
        base = _nearest_entry(root, _base_key(cargo), skeleton.packages())
        if base is not None:  # cargo compiles only what it lacks: the dependencies added since (an improved tool's)
            logger.info("dependency cache: building on %s", base.name)
            copy_entry(base, target)
        sandbox = open_sandbox(
            settings.sandbox,
            workspace=crate,
            writable=[crate, target],
            readable=[cargo.registry_dir] if cargo.registry_dir else [],
            cargo_home=cargo.home,
            adopt=True,
            limits=limits_for(settings),
        )
        builder = dataclasses.replace(cargo, target_dir=target, git_view=None)
        features = ["--features", ",".join(cargo.features)] if cargo.features else []
        result = sandbox.run(
            builder.argv("test", "--no-run", "--lib", "--locked", *features), cwd=crate, env=builder.env()
        )
        if not result.ok:
            raise DependencyBuildFailed(_last_error(result.stderr) or f"cargo exit {result.returncode}")
        # The build script of any dependency wrote `target` as it pleased (links, FIFOs): from here on the host
        # touches it only through flakebot.safefs, beneath a descriptor of the temp dir it made itself.
        built = Tree(target)
        _drop_skeleton_outputs(built)
        built.write_text(ENTRY_INFO, json.dumps({"base": _base_key(cargo), "packages": skeleton.packages()}))
        _hand_to_owner(built)
        entry = root / key
        try:
            target.rename(entry)
        except OSError:
            if not entry.is_dir():  # else another craft stored the same entry first: theirs is as good
                raise
        logger.info("dependency cache: stored %s", entry)
        try:
            evict(root, settings.dependency_cache_mb * 1024 * 1024, keep=entry)
        except OSError as exc:  # the entry is stored: a cache over its limit is no reason to fail the craft
            logger.warning("dependency cache: eviction stopped: %s", exc)
        return entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def evict(root: Path, limit_bytes: int, keep: Path) -> list[str]:
    """Remove the least recently used entries until the cache holds at most `limit_bytes` (0: no limit); the names
    removed. `keep` (the entry just stored) and entries used in the last EVICT_GRACE_SECONDS stay, so the cache may
    be over its limit until they age. An entry goes by rename first: whoever looks for it finds it whole or not at
    all (a copy of it still running fails, and that loop builds its dependencies itself, as without a cache)."""
    if limit_bytes <= 0:
        return []
    entries = [
        (entry.stat().st_mtime, tree_bytes(entry), entry)
        for entry in root.iterdir()
        if not entry.name.startswith(".") and entry.is_dir() and not entry.is_symlink()
    ]
    total, now, removed = sum(size for _, size, _ in entries), time.time(), []
    for used, size, entry in sorted(entries):
        if total <= limit_bytes:
            break
        if entry == keep or now - used < EVICT_GRACE_SECONDS:
            continue
        doomed = root / f"{EVICTED}{entry.name}-{os.getpid()}"
        try:
            entry.rename(doomed)
        except OSError:  # another craft evicted it first
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        total -= size
        removed.append(entry.name)
    if removed:
        logger.info("dependency cache: evicted %d unused entries to stay under %d MiB", len(removed), limit_bytes >> 20)
    return removed


def _nearest_entry(root: Path, base_key: str, packages: list[str]) -> Path | None:
    """The largest stored entry whose packages are all among `packages` (same toolchain, profile, features, source).
    Only code of the new set ever ran to make it (registry build scripts and proc macros, never the model's), so a
    build that starts from it is as clean as one from nothing."""
    wanted, best, shared = set(packages), None, 0
    entries = Tree(root)
    for entry in root.iterdir():
        try:
            info = json.loads(entries.read_text(f"{entry.name}/{ENTRY_INFO}", limit=1 << 20))
        except (OSError, ValueError):
            continue
        has = set(info.get("packages", []))
        if info.get("base") == base_key and has <= wanted and len(has) > shared:
            best, shared = entry, len(has)
    return best


def copy_entry(entry: Path, target_dir: Path) -> None:
    """A private copy of `entry` at `target_dir`, mtimes and modes kept (cargo's fingerprints compare mtimes)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    launcher.run(
        ["cp", "--reflink=auto", "-a", "--", f"{entry}/.", str(target_dir)],
        check=True,
        capture_output=True,
        timeout=600,
    )


def _drop_skeleton_outputs(target: Tree) -> None:
    """Remove the skeleton crate's own outputs: only the dependencies' are worth keeping."""
    top = [name for name in target.listdir() if target.is_dir(name)]  # is_dir: a link is not entered
    second = [f"{name}/{child}" for name in top for child in target.listdir(name) if target.is_dir(f"{name}/{child}")]
    for directory in ["", *top, *second]:
        for name in target.listdir(directory):
            if name.startswith(SKELETON_PREFIXES):
                target.remove(f"{directory}/{name}" if directory else name)


def _hand_to_owner(target: Tree) -> None:
    """The entry owned by flakebot's own user (the sandbox uid made it), writable by nobody else."""
    uid, gid = os.geteuid(), os.getegid()
    for rel, st in target.walk():
        if stat.S_ISLNK(st.st_mode):
            continue
        if st.st_uid != uid or st.st_gid != gid:
            target.chown(rel, uid, gid)
        mode = stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH | stat.S_ISUID | stat.S_ISGID)
        target.chmod(rel, mode)


def _sweep_stale(root: Path) -> None:
    for doomed in root.glob(f"{EVICTED}*"):  # an eviction that crashed before it removed the entry
        shutil.rmtree(doomed, ignore_errors=True)
    for tmp in root.glob(".build-*"):
        try:
            if time.time() - tmp.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            continue


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error")]
    return (errors or lines or [""])[-1][:300]
