"""acquire(): the chosen crate's source as a git workspace on the run's branch, by one of four methods.

    local    a crate directory (a local directory source): copy, git init, commit "upstream NAME VERSION"
    git      its repository URL: clone, check out the given ref, else the version's tag (else the default branch, with a notice)
    fork     fork on GitHub (REST, polled until ready), then clone the fork
    archive  the published .crate (checksum-verified), unpacked, git init, commit

`craft --from URL|PATH` starts here directly (start_point): a crate with no name or version yet, only
where it is; the package at the top of the tree (or the workspace's only one) is the crate.

Every method builds the workspace in a hidden sibling directory and renames it into place only
when it is complete, so a failure (unreachable host, full disk, ...) leaves nothing behind.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot.cargo.metadata import locate, root_package
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError, UsageError
from flakebot.fsutil import remove_tree
from flakebot.pipeline.run import Run
from flakebot.source import archive, gitrepo
from flakebot.source.github import GitHub, github_token, parse_github_url
from flakebot.source.tree import copy_crate, provenance, refuse_links_leaving, strip_registry_files

logger = logging.getLogger(__name__)

METHODS = ("auto", "local", "git", "fork", "archive")


@dataclass
class Job:
    """One acquisition: what to fetch, the branch to create, and how to call cargo."""

    crate: CrateInfo
    branch: str
    settings: Settings
    cargo: Cargo
    run: Run | None
    ref: str | None = None  # a branch, tag or commit to check out instead of the version's tag


def acquire(
    crate: CrateInfo,
    dest: Path,
    *,
    branch: str,
    settings: Settings,
    method: str = "auto",
    fork: bool = False,
    run: Run | None = None,
    ref: str | None = None,
) -> dict[str, Any]:
    """Make `dest` a git repository on `branch` holding `crate`'s source; returns the origin record."""
    chosen = choose_method(crate, method, fork)
    # cargo metadata (the only cargo call here) reads the target dir's name but never writes to it.
    target = run.target_dir if run is not None else Path(tempfile.gettempdir()) / "flakebot-target"
    job = Job(crate, branch, settings, Cargo.for_run(settings, target), run, ref)
    if run is not None:
        run.register("path", path=str(dest))
    try:
        return acquire_by(chosen, dest, job)
    except AcquireError as exc:
        if not (method == "auto" and chosen == "git" and crate.source == "crates-io" and not settings.offline):
            raise named(crate, exc) from None
        logger.warning("repository of %s unusable (%s); trying its .crate", crate.name, exc.message)
        try:
            origin = acquire_by("archive", dest, job)
        except AcquireError as second:
            raise named(
                crate, AcquireError(f"{exc.message}; and its .crate: {second.message}", fix=second.fix)
            ) from None
        origin["notice"] = (
            f"repository {crate.repository} was unusable ({exc.message}); used the published .crate instead"
        )
        return origin


def choose_method(crate: CrateInfo, method: str, fork: bool) -> str:
    if method not in METHODS:
        raise named(
            crate, AcquireError(f"unknown acquisition method {method!r}", fix=f"use one of: {', '.join(METHODS)}")
        )
    if fork or method == "fork":
        return "fork"
    if method != "auto":
        return method
    return "local" if crate.path else "git" if crate.repository else "archive"


def named(crate: CrateInfo, exc: AcquireError) -> AcquireError:
    """The same error with the crate named first, as every acquisition error is."""
    what = f"{crate.name} {crate.version}" if crate.name else (crate.repository or crate.path)
    return AcquireError(
        f"cannot acquire {what}: {exc.message}", fix=exc.fix, crate=crate.name, version=crate.version, cause=exc.message
    )


def acquire_by(method: str, dest: Path, job: Job) -> dict[str, Any]:
    try:
        with staging(dest) as tmp:
            origin = {"method": method, "crate": job.crate.name, **BUILDERS[method](job, tmp)}
    except OSError as exc:
        raise AcquireError(
            os_cause(exc), fix="free some disk space, or check the permissions of " + str(dest.parent)
        ) from None
    logger.info("acquired %s %s by %s into %s", job.crate.name, origin["version"], method, dest)
    return origin


@contextmanager
def staging(dest: Path) -> Iterator[Path]:
    """A hidden empty sibling of `dest` to build in; renamed to `dest` on success, removed on any failure."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise AcquireError(f"{dest} already exists and is not empty", fix="remove it or choose another destination")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    except AcquireError as exc:
        remove_tree(tmp)
        # Name the destination, not a hidden directory that no longer exists.
        raise AcquireError(exc.message.replace(str(tmp), str(dest)), fix=exc.fix, **exc.details) from None
    except BaseException:
        remove_tree(tmp)
        raise


def os_cause(exc: OSError) -> str:
    if exc.strerror:
        return f"{exc.strerror} ({exc.filename})" if exc.filename else exc.strerror
    return str(exc)[:300]  # shutil.Error carries a list of (src, dst, why)


# ---------------------------------------------------------------- the methods


def from_local(job: Job, tmp: Path) -> dict[str, Any]:
    source = Path(job.crate.path)
    if not (source / "Cargo.toml").is_file():
        raise AcquireError(
            f"the local crate directory {source} has no Cargo.toml", fix="search again so the registry entry is fresh"
        )
    copy_crate(source, tmp)
    return commit_unpacked(job, tmp, source.resolve().as_uri(), provenance(source))


def from_archive(job: Job, tmp: Path) -> dict[str, Any]:
    url = archive.fetch_into(job.crate, tmp, job.settings)
    found = provenance(tmp)
    strip_registry_files(tmp)
    return commit_unpacked(job, tmp, url, found)


def commit_unpacked(job: Job, tmp: Path, url: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Find the crate in an unpacked tree, then make the tree a repository with one upstream commit."""
    refuse_links_leaving(tmp)  # before cargo metadata or any later host step meets the tree
    name = job.crate.name or root_package(job.cargo, tmp)
    crate_dir, version = locate(job.cargo, tmp, name)
    revision = gitrepo.init_commit(tmp, f"upstream {name} {version}", job.branch)
    origin = {
        "url": url,
        "revision": revision,
        "version": version,
        "crate_dir": crate_dir,
        "branch": job.branch,
        **extra,
    }
    if not job.crate.name:  # craft --from: the package found in the tree
        origin["package"] = name
    if job.crate.version and version != job.crate.version:
        origin["notice"] = f"the source holds {name} {version}, not {job.crate.version}"
    return origin


def from_git(job: Job, tmp: Path, url: str = "", token: str = "") -> dict[str, Any]:
    if not (url or job.crate.repository):
        raise AcquireError(
            "it has no repository URL to clone",
            fix="use --method archive (crates.io) or a crate from the local registry",
        )
    url = gitrepo.check_url(url or job.crate.repository)
    name, wanted = job.crate.name, job.crate.version
    notes = []
    gitrepo.clone(url, tmp, job.settings.git_timeout, token)
    tag = gitrepo.find_tag(tmp, name, wanted) if wanted and not job.ref else None
    if tag is None and wanted and not job.ref:
        tried = ", ".join(gitrepo.version_tags(name, wanted))
        notes.append(
            f"no tag for version {wanted} (looked for {tried}); using the default branch {gitrepo.default_branch(tmp)}"
        )
    start = gitrepo.resolve_ref(tmp, job.ref) if job.ref else tag or "HEAD"
    revision = gitrepo.checkout_branch(tmp, job.branch, start)
    refuse_links_leaving(tmp)  # the checked-out tree, before cargo metadata or any later host step meets it
    name = name or root_package(job.cargo, tmp)
    crate_dir, version = locate(job.cargo, tmp, name)
    if wanted and version != wanted:
        notes.append(f"the checked-out {name} is version {version}, not {wanted}")
    origin = {
        "url": url,
        "revision": revision,
        "version": version,
        "crate_dir": crate_dir,
        "branch": job.branch,
        "tag": tag,
    }
    if not job.crate.name:  # craft --from: the package found in the tree
        origin["package"] = name
    if job.ref:
        origin["ref"] = job.ref
    if notes:
        origin["notice"] = "; ".join(notes)
    return origin


def start_point(location: str, ref: str | None = None, *, name: str = "") -> tuple[CrateInfo, str | None]:
    """The crate `craft --from` starts at, and the git ref to check out: a local crate directory, or a
    repository URL (URL#ref names the ref; `ref` may too). `name` picks a package of a workspace."""
    from flakebot.preflight import check_path_name

    check_path_name(location, "the crate location")
    path = Path(location).expanduser()
    if path.is_dir():
        if ref or "#" in location:
            raise UsageError(
                "a ref applies to a git repository, not a local directory",
                fix="leave out --ref (or #REF) for a directory",
            )
        if not (path / "Cargo.toml").is_file():
            raise UsageError(f"{path} has no Cargo.toml", fix="give the directory of a cargo package or workspace")
        return CrateInfo(name=name, version="", path=str(path.resolve()), source="from"), None
    url, _, fragment = location.partition("#")
    if fragment and ref and fragment != ref:
        raise UsageError(f"two refs given: #{fragment} and --ref {ref}", fix="give the ref once")
    if "://" not in url and not url.startswith("git@"):
        raise UsageError(
            f"{location} is neither a directory nor a repository URL",
            fix="pass an existing crate directory or a git URL (https://, git://, ssh://, file://)",
        )
    try:
        url = gitrepo.check_url(url)
    except AcquireError as exc:
        raise UsageError(exc.message, fix=exc.fix) from None
    return CrateInfo(name=name, version="", repository=url, source="from"), fragment or ref or None


def from_fork(job: Job, tmp: Path) -> dict[str, Any]:
    parsed = parse_github_url(job.crate.repository)
    if parsed is None:
        raise AcquireError(
            f"--fork needs a GitHub repository and its repository is {job.crate.repository or 'unknown'}",
            fix="drop --fork to clone it instead",
        )
    token = github_token()
    with GitHub(job.settings, token) as hub:
        fork = hub.fork(*parsed)
        if job.run is not None:  # registered before waiting, so a failed run can still delete it
            job.run.register(
                "fork", url=fork.html_url or fork.clone_url, full_name=fork.full_name, api=job.settings.github_api_url
            )
        hub.wait_ready(fork, job.settings.fork_timeout, job.settings.fork_poll_interval)
    origin = from_git(job, tmp, fork.clone_url, token)
    return {**origin, "fork": fork.full_name, "fork_url": fork.html_url, "upstream": job.crate.repository}


BUILDERS: dict[str, Callable[[Job, Path], dict[str, Any]]] = {
    "local": from_local,
    "git": from_git,
    "fork": from_fork,
    "archive": from_archive,
}
