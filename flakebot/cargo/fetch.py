"""The host-side fetch: what a crate's Cargo.lock names, downloaded into flakebot's CARGO_HOME before any sandboxed build.

This is how nixpkgs builds Rust (fixed-output fetches, then an offline build): `sync(cargo, crate_dir)`
runs `cargo generate-lockfile` when there is no Cargo.lock, then `cargo fetch`, both as trusted host
calls (Cargo.run). Sandboxed cargo is always --offline and finds the crates in that CARGO_HOME.
Offline (a directory source) there is nothing to download: the lock is made when missing, no more.

`ManifestWatch` tells when a Cargo.toml or Cargo.lock of the workspace changed (a model edit, `cargo add`,
a build script), so the edit loop fetches again before the next offline build.

Every host call checks the sources first (cargo/sources.py). The sandbox never sees CARGO_HOME's shared git/:
`refresh_git_view` gives the run its own copy (hard links) of only the checkouts and databases its Cargo.lock
names, as cargo itself reports them (`cargo metadata --offline`), and the sandbox binds that.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from flakebot.cargo.cache_skeleton import NoSkeleton, skeleton_of
from flakebot.cargo.metadata import cargo_error
from flakebot.cargo.runner import Cargo
from flakebot.cargo.sources import git_refusal
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

MANIFESTS = ("Cargo.toml", "Cargo.lock")
SKIP_DIRS = {".git", "target"}
DOWNLOADED = re.compile(r"^\s*Downloaded (\S+ v\S+)")


@dataclass
class FetchReport:
    """What a host fetch did. `stage` says where it failed: "lock" (cargo cannot resolve the manifest) or "fetch" (a download)."""

    ok: bool = True
    lock_generated: bool = False
    downloaded: list[str] = field(default_factory=list)  # "csv v1.1.6", as cargo prints them
    error: str = ""  # cargo's error, on one line
    stage: str = ""
    seconds: float = 0.0
    resolve_error: str = ""  # `cargo metadata --offline` of the fetched graph failed: cargo's error, on one line

    def summary(self) -> str:
        """One line for the model and the log."""
        if not self.ok:
            return f"cargo {'generate-lockfile' if self.stage == 'lock' else 'fetch'} failed on the host: {self.error}"
        got = (
            f"downloaded {len(self.downloaded)} crate(s): {', '.join(self.downloaded[:12])}"
            if self.downloaded
            else "nothing new to download"
        )
        return f"dependencies fetched on the host ({got})"


def sync(
    cargo: Cargo,
    crate_dir: Path,
    lock: Path | None = None,
    timeout: float = 600,
    *,
    watch: Path | None = None,
    locked_now: bool = False,
) -> FetchReport:
    """Make sure the crate has a Cargo.lock (at `lock`, the workspace root's) and, online, that every crate it names is
    fetched; the graph is then resolved offline once, for the git view (keyed by `watch`'s manifests, if given) and
    the report's `resolve_error`. `locked_now`: the lock is cargo's own, written from these manifests just before (a
    new crate's `cargo add`).

    A lock cargo wrote from the manifests (here, or `locked_now`) resolves: when nothing in the crate can name a git
    source either (`_names_no_git`), there is nothing to resolve it for (no error to report, an empty git view), and
    cargo is not asked (~0.08 s of a new crate's craft)."""
    start, report = time.perf_counter(), FetchReport()
    if lock is not None and not lock.exists():
        made = cargo.run(["generate-lockfile"], crate_dir, timeout=timeout)
        if made.returncode != 0:
            refresh_git_view(cargo, crate_dir)
            return _failed(report, "lock", made.stderr, start)
        report.lock_generated = True
    if cargo.online:
        fetched = cargo.run(["fetch"], crate_dir, timeout=timeout)
        if fetched.returncode != 0:
            refresh_git_view(cargo, crate_dir)  # a refused source: what the sandbox saw of it goes too
            return _failed(report, "fetch", fetched.stderr, start)
        report.downloaded = [m.group(1) for line in fetched.stderr.splitlines() if (m := DOWNLOADED.match(line))]
    if (locked_now or report.lock_generated) and _names_no_git(crate_dir, lock):
        refresh_git_view(cargo, crate_dir, watch=watch, no_git=True)
    else:
        resolved = _resolve(cargo, crate_dir)
        if resolved.returncode != 0:
            report.resolve_error = cargo_error(resolved.stderr)
        refresh_git_view(cargo, crate_dir, resolved=resolved, watch=watch)
    report.seconds = time.perf_counter() - start
    logger.info("host fetch for %s: %s (%.1f s)", crate_dir, report.summary(), report.seconds)
    return report


def _failed(report: FetchReport, stage: str, stderr: str, start: float) -> FetchReport:
    report.ok, report.stage, report.error, report.seconds = (
        False,
        stage,
        cargo_error(stderr),
        time.perf_counter() - start,
    )
    logger.info("host fetch failed at %s: %s", stage, report.error)
    return report


def _resolve(cargo: Cargo, crate_dir: Path) -> subprocess.CompletedProcess[str]:
    return cargo.run(["metadata", "--format-version", "1", "--offline"], crate_dir, timeout=300)


def _names_no_git(crate_dir: Path, lock: Path | None) -> bool:
    """Nothing cargo reads for the crate can name a git source: it is its own workspace root (`lock`, the one cargo
    uses, is beside its manifest) and a lone package with no [workspace], [patch] or [replace], no git or path
    dependency and no git package locked (what cargo/cache_skeleton.py's skeleton_of requires, read as data through
    safefs). Anything else, or a tree it cannot read, is answered by cargo."""
    if lock is None or lock.parent.resolve() != crate_dir.resolve():
        return False
    try:
        skeleton_of(crate_dir)
    except NoSkeleton:
        return False
    return True


def refresh_git_view(
    cargo: Cargo,
    crate_dir: Path,
    *,
    resolved: subprocess.CompletedProcess[str] | None = None,
    watch: Path | None = None,
    no_git: bool = False,
) -> list[str]:
    """Rebuild `cargo.git_view`: hard-linked copies of the git/ entries (checkouts/X/REV, db/X) the resolved graph
    (`resolved`, else resolved here) uses, each from an allowed source; returns them. Nothing without a view; an
    unresolvable graph gets an empty one, and so does a crate that names no git source (`no_git`: not resolved). With
    `watch`, the view is kept when it was made for the same manifests under it (their digest is its key, beside it);
    a view made without a key is always made again."""
    if cargo.git_view is None:
        return []
    keyed = cargo.git_view.with_name(cargo.git_view.name + ".key")
    key = ManifestWatch(watch).current() if watch is not None else ""
    if key and resolved is None and cargo.git_view.is_dir():
        try:
            kept = json.loads(keyed.read_text())
        except (OSError, ValueError):
            kept = {}
        if kept.get("key") == key:
            logger.debug("git view of %s: kept, its manifests are unchanged", crate_dir)
            return list(kept.get("entries", []))
    keyed.unlink(missing_ok=True)  # from here until it is written again, the view has no key
    entries: list[str] = []
    resolved = None if no_git else resolved or _resolve(cargo, crate_dir)
    git = (cargo.home / "git").resolve()
    if resolved is not None and resolved.returncode == 0:
        for package in json.loads(resolved.stdout)["packages"]:
            source, manifest = package.get("source") or "", Path(package["manifest_path"]).resolve()
            if source.startswith("git+") and manifest.is_relative_to(git / "checkouts"):
                if not git_refusal(source, cargo.git_sources):
                    name, rev = manifest.relative_to(git / "checkouts").parts[:2]
                    entries += [f"checkouts/{name}/{rev}", f"db/{name}"]
    fresh = cargo.git_view.with_name(cargo.git_view.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    fresh.mkdir(parents=True)
    for entry in dict.fromkeys(entries):
        shutil.copytree(git / entry, fresh / entry, symlinks=True, copy_function=_link_or_copy)
    shutil.rmtree(cargo.git_view, ignore_errors=True)
    fresh.rename(cargo.git_view)
    logger.info("git view of %s: %s", crate_dir, ", ".join(dict.fromkeys(entries)) or "no git checkouts")
    if key:
        keyed.write_text(json.dumps({"key": key, "entries": list(dict.fromkeys(entries))}))
    return list(dict.fromkeys(entries))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        shutil.copy2(src, dst)


class ManifestWatch:
    """A digest of every Cargo.toml and Cargo.lock under a workspace; `changed()` says whether it moved since the last look."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = Path(workspace)
        self.digest = self.current()

    def current(self) -> str:
        digest = hashlib.sha256()
        for path in self._manifests():
            digest.update(str(path.relative_to(self.workspace)).encode() + b"\0")
            digest.update(path.read_bytes() if path.is_file() and not path.is_symlink() else b"<not a file>")
            digest.update(b"\0")
        return digest.hexdigest()

    def changed(self) -> bool:
        now = self.current()
        moved, self.digest = now != self.digest, now
        return moved

    def snapshot(self) -> dict[Path, bytes]:
        """The content of every manifest, to put back with `restore` when a change must be undone."""
        return {path: path.read_bytes() for path in self._manifests() if path.is_file() and not path.is_symlink()}

    def restore(self, snapshot: dict[Path, bytes]) -> None:
        # The workspace is the sandbox's to write: through flakebot.safefs, a link a build script left is replaced
        # (or refused on the way), never written through.
        tree = Tree(self.workspace)
        for path in self._manifests():
            if path not in snapshot:
                tree.remove(str(path.relative_to(self.workspace)))  # created since the snapshot (a new Cargo.lock)
        for path, content in snapshot.items():
            rel = str(path.relative_to(self.workspace))
            try:
                same = tree.read_bytes(rel) == content
            except OSError:  # gone, or a link or FIFO in its place (flakebot.safefs.UnsafePath)
                same = False
            if not same:
                tree.write_bytes(rel, content)
        self.digest = self.current()

    def _manifests(self) -> list[Path]:
        found = []
        for root, dirs, files in os.walk(self.workspace):  # does not follow symlinked directories
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            found += [Path(root, name) for name in sorted(files) if name in MANIFESTS]
        return found
