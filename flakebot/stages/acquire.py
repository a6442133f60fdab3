"""The pipeline's acquire stage, and the fork/push steps that end a craft."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from typing import Any

import tomlkit

from flakebot.cargo.fetch import sync
from flakebot.cargo.metadata import metadata, workspace_root
from flakebot.cargo.runner import Cargo
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.fsutil import remove_tree
from flakebot.nix.devdeps import Dropped, lock_without_unresolvable
from flakebot.pipeline.engine import StageContext
from flakebot.safefs import Tree
from flakebot.services.crafting import TEMPLATE as SERVICE_TEMPLATE
from flakebot.source import gitrepo, safegit
from flakebot.source.acquisition import acquire
from flakebot.source.newcrate import new_crate
from flakebot.stages.outputs import AcquireOut, ChoiceOut, SpecOut

logger = logging.getLogger(__name__)

FETCH_FIX = (
    "check that the crate registry (settings cratesio_index_url, cratesio_static_url) is reachable and serves the crates "
    "its index lists with matching checksums, or work offline with --registry local"
)


def acquire_stage(ctx: StageContext) -> AcquireOut:
    """Acquire the chosen crate (or start a new one) into the run's workspace, ready for offline cargo."""
    choice, tool = ctx.get(ChoiceOut), ctx.get(SpecOut).name
    if not tool:
        raise AcquireError("the spec stage gave the tool no name", fix="run the spec stage again (flakebot resume)")
    mode = choice.mode or "fork"
    crate = CrateInfo.from_dict(choice.crate) if choice.crate else None
    if crate is None and mode != "new":
        raise AcquireError("no crate was chosen to start from", fix="run the search stage again, or start a new crate")
    run, workspace, branch = ctx.run, ctx.run.workspace, f"flakebot/{tool}"
    if workspace.exists():  # left by an attempt that failed part-way: its state is unknown, start over
        ctx.progress("removing the workspace of an earlier attempt")
        remove_tree(workspace)
    run.state.pop("edit_base", None)  # a new workspace: the edit stage starts from what this acquisition commits
    run.register("path", path=str(workspace))
    run.register("path", path=str(run.target_dir))
    if mode == "new":
        ctx.progress(f"starting new crate {tool}" + (f" using {crate.name} {crate.version}" if crate else ""))
        origin = new_crate(tool, workspace, library=crate, settings=ctx.settings)
    else:
        assert crate is not None
        ctx.progress(
            f"acquiring {crate.name} {crate.version}" if crate.name else f"acquiring {crate.repository or crate.path}"
        )
        method, fork = ctx.request.method or "auto", ctx.request.fork
        origin = acquire(
            crate,
            workspace,
            branch=branch,
            settings=ctx.settings,
            method=method,
            fork=fork,
            run=run,
            ref=ctx.request.ref,
        )
    if crate is not None and crate.path and Path(crate.path).resolve() == SERVICE_TEMPLATE.resolve():
        name_the_template(workspace, origin["crate_dir"], tool)
    if origin.get("notice"):
        ctx.progress(origin["notice"], notice=True)
    cargo_for_run = Cargo.for_run(ctx.settings, run.target_dir, run.dir)
    if cargo_for_run.online:
        ctx.progress("fetching the crate's dependencies on the host (builds and tests run offline in the sandbox)")
    new = mode == "new"  # cargo's own crate (init, add): see prepare_cargo
    cargo = prepare_cargo(workspace, origin["crate_dir"], cargo_for_run, new=new)
    for dropped in cargo["dropped"]:
        ctx.progress(Dropped(**dropped).notice(), notice=True)
    if new and cargo["lockfile"] != "failed":  # cargo's own crate, all of it committed (gitrepo.init_commit, the lock)
        run.workspace_committed = safegit.head_from_files(workspace)
    if not cargo["metadata_ok"]:
        ctx.progress(f"cargo cannot resolve the crate's dependencies: {cargo['cargo_error']}", warning=True)
    request = ctx.request
    return AcquireOut(
        origin=origin,
        crate_dir=origin["crate_dir"],
        workspace=str(workspace),
        branch=branch,
        target_dir=str(run.target_dir),
        lockfile=cargo["lockfile"],
        metadata_ok=cargo["metadata_ok"],
        cargo_error=cargo["cargo_error"],
        fetch=cargo.get("fetch", {}),
        fork=request.fork,
        push=request.push,
        delete_fork=request.delete_fork,
        dropped_dev_dependencies=cargo["dropped"],
        untested=untested_note(cargo["dropped"]),
        # `cargo init`'s binary, named like the tool, needs no feature
        features=[] if new else binary_features(cargo_for_run, workspace / origin["crate_dir"], tool),
    )


def prepare_cargo(workspace: Path, crate_dir: str, cargo: Cargo, *, new: bool = False) -> dict[str, Any]:
    """Give the workspace a committed Cargo.lock and, online, fetch what it names on the host (sandboxed cargo is offline).

    A lock cargo cannot make is reported (the model may still fix the manifest); a failed download ends the run.
    `new`: a crate cargo made (`cargo init`, then `cargo add`) at the workspace's top: its own workspace root (not
    asked of cargo), and its lock the one cargo just wrote from the manifest (fetch.sync's `locked_now`)."""
    crate_path = workspace / crate_dir
    report: dict[str, Any] = {"lockfile": "existing", "metadata_ok": True, "cargo_error": "", "dropped": []}
    root = crate_path if new else workspace_root(cargo, crate_path)
    lock = root / "Cargo.lock"
    fetched = sync(cargo, crate_path, lock, watch=workspace, locked_now=new)
    if not fetched.ok and fetched.stage == "lock":
        # The workspace is flakebot's clone: like a packaged copy, it may leave out dev-dependencies that do not resolve.
        dropped = lock_without_unresolvable(cargo, root, 300)
        if dropped is not None:
            _commit_lock(workspace, lock, dropped)
            report.update(lockfile="generated", dropped=[d.to_dict() for d in dropped])
            fetched = sync(cargo, crate_path, lock, watch=workspace)  # online: fetch what the new lock names
    elif fetched.lock_generated:
        _commit_lock(workspace, lock, [])
        report["lockfile"] = "generated"
    if cargo.online:
        report["fetch"] = asdict(fetched)
    if not fetched.ok and fetched.stage == "fetch":
        raise AcquireError(
            f"cannot fetch the crate's dependencies: {fetched.error}", fix=FETCH_FIX, cause=fetched.error
        )
    if not fetched.ok:
        return {**report, "lockfile": "failed", "metadata_ok": False, "cargo_error": fetched.error}
    if cargo.offline and fetched.resolve_error:  # online, `cargo fetch` has just resolved the whole graph
        report.update(metadata_ok=False, cargo_error=fetched.resolve_error)
    return report


def _commit_lock(workspace: Path, lock: Path, dropped: list[Dropped]) -> None:
    """Commit Cargo.lock, and the manifests that lost dev-dependencies (so the edit loop starts from them)."""
    if not dropped:
        gitrepo.commit_files(
            workspace, [str(lock.relative_to(workspace.resolve()))], "Cargo.lock for the crate source this run uses"
        )
        return
    root = lock.parent.resolve().relative_to(workspace.resolve())
    files = [str(lock.relative_to(workspace.resolve()))] + sorted({str(root / d.manifest) for d in dropped})
    names = ", ".join(d.name for d in dropped)
    gitrepo.commit_files(
        workspace, files, f"flakebot: leave out dev-dependencies the crate source cannot satisfy ({names}); Cargo.lock"
    )


def name_the_template(workspace: Path, crate_dir: str, tool: str) -> None:
    """flakebot's service template is a package called `service`: named like the tool before the first build, so the
    frozen test's binary exists from the start and the model spends no turn on a rename. The manifest is flakebot's
    own (read from its data, not from the workspace), written through safefs, and committed as the edit base."""
    manifest = tomlkit.parse((SERVICE_TEMPLATE / "Cargo.toml").read_text())
    manifest["package"]["name"] = tool
    rel = str(PurePosixPath(crate_dir or ".") / "Cargo.toml")
    with Tree(workspace) as tree:
        tree.write_text(rel, tomlkit.dumps(manifest))
    gitrepo.commit_files(workspace, [rel], f"flakebot: the service template's package named {tool}")


def untested_note(dropped: list[dict[str, Any]]) -> str:
    """For the manifest: which of the crate's own tests could not run, and why."""
    if not dropped:
        return ""
    names = ", ".join(f"{d['name']} ({d['reason']})" for d in dropped)
    return f"the crate's own tests did not run (only the acceptance tests did): they need dev-dependencies left out: {names}"


def binary_features(cargo: Cargo, crate_path: Path, tool: str) -> list[str]:
    """required-features of the crate's binary named like the tool (the one the acceptance test runs)."""
    for package in metadata(cargo, crate_path)["packages"]:
        for target in package.get("targets", []):
            if target["name"] == tool and "bin" in target.get("kind", []):
                return list(target.get("required-features") or [])
    return []
