"""The workspace the edit loop acts on: the model's tree, its hardened git, the frozen acceptance files, and what
flakebot's verdict runs. The loop's one collaborator besides the model and the tools (mini-swe-agent's `env`).

    WorkspaceGit  host git in the tree, every call through flakebot.source.safegit with nested .git swept first
    Checks        the verdict's inputs: `cargo test` in the sandbox, the spec's examples on the built binary
    Workspace     commit / restore / changed files / guard / verdict, for EditLoop
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flakebot import preflight
from flakebot.agent.acceptance import Frozen
from flakebot.agent.loop import StopLoop, Verdict
from flakebot.agent.verdict import ExampleRunner, ForkVerdict, LifecycleCheck, Snapshotter, make_verdict
from flakebot.errors import EditError
from flakebot.fsutil import tree_bytes

if TYPE_CHECKING:
    from flakebot.cargo.diagnostics import CargoReport
    from flakebot.cargo.runner import Cargo
    from flakebot.sandbox import Sandbox
    from flakebot.toolspec import ToolSpec

logger = logging.getLogger(__name__)


class WorkspaceGit:
    """Host git in the model's workspace (flakebot.source.safegit): hardened, and every call first removes any
    nested .git a sandboxed command left (sweep), so git never enters a repository the model made."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace

    def __call__(self, *args: str, sweep: bool = True, commit: bool = False) -> str:
        """`git ARGS` in the tree; `sweep`: nested .git removed first. Only a command that reads nothing of the work
        tree but tracked paths (the index, objects, refs) may skip it: one that runs while the sandbox writes the tree.
        `commit`: a `git commit` that finds nothing to commit returns its status rather than failing."""
        from flakebot.source import safegit

        return safegit.git(
            self.workspace,
            *args,
            sweep=sweep,
            error=EditError,
            fix=f"inspect the workspace {self.workspace} (--keep), or start a new run",
            passes=safegit.nothing_to_commit if commit else lambda done: False,
        )

    def head(self, sweep: bool = True) -> str:
        return self("rev-parse", "--verify", "HEAD^{commit}", sweep=sweep).strip()

    def commit(self, message: str, staged: Callable[[], None] = lambda: None) -> str:
        """Commit everything (only when something changed); the HEAD commit. `staged()` is called once the tree is
        read (`git add -A`): what follows reads the index, objects, refs and tracked paths alone (the status git
        commit shows when nothing is staged walks no untracked directory: -uno), so the tree may change meanwhile,
        and no sweep runs beside a command that may be making a repository."""
        self("add", "-A")
        staged()
        try:  # asked at once: `diff --cached` before it cost a git process per commit, and after it one per empty one
            self("commit", "-q", "--no-verify", "--untracked-files=no", "-m", message, sweep=False, commit=True)
        except EditError:  # git's status not the one it gives for nothing to commit: whether it was, asked
            if self("diff", "--cached", "--name-only", sweep=False).strip():
                raise  # something to commit, and git could not: its reason, not "nothing to commit"
        return self.head_from_files() or self.head(sweep=False)

    def reword(self, made: str, message: str) -> str:
        """HEAD's message `made` replaced by `message`, its tree and parents kept (nothing staged is taken: --only);
        HEAD's commit. A HEAD with another message (that commit found nothing to commit) is left as it is."""
        if self("log", "-1", "--format=%B", sweep=False).strip() == made:
            self("commit", "-q", "--no-verify", "--amend", "--only", "--allow-empty", "-m", message, sweep=False)
        return self.head_from_files() or self.head(sweep=False)

    def head_from_files(self) -> str:
        """HEAD's commit read from .git's own files (safegit.head_from_files: written by flakebot's git alone, the
        sandbox binds .git read-only), one git process fewer per commit; '' when they do not hold it plainly."""
        from flakebot.source import safegit

        return safegit.head_from_files(self.workspace)

    def reset(self, sha: str, *clean: str) -> None:
        """The tree as commit `sha` has it; `clean`: the flags of the `git clean` that follows (-fd, -fdx)."""
        self("reset", "-q", "--hard", sha)
        self("clean", "-q", *clean)


@dataclass
class Checks:
    """What flakebot's verdict runs: `cargo test` in the sandbox, then the spec's examples on the built binary.
    `fork`: the crate has a suite of its own (fast steps, the full suite at the baseline and before green);
    `only_acceptance`: its own tests cannot build (dev-dependencies left out), so the acceptance test runs alone."""

    sandbox: Sandbox
    cargo: Cargo
    spec: ToolSpec
    run_example: ExampleRunner
    timeout: float | None = None
    fork: bool = False
    only_acceptance: bool = False
    record: Callable[..., None] = field(default=lambda *_, **__: None)  # the transcript, for the fork's cargo runs
    before_test: Callable[[], None] = field(default=lambda: None)  # the dependency cache follows the manifest
    lifecycle: LifecycleCheck | None = None  # a service: its lifecycle, run by flakebot on the built binary
    # copies the built binary at cargo's artifact message, so the examples run beside the tests (verdict.py)
    snapshot: Snapshotter | None = None


class Workspace:
    """The model's tree as the edit loop changes it: commits of good states, restores of the best, flakebot's verdict,
    and the guard run after every tool call and verdict (frozen files unchanged, disk use bounded)."""

    def __init__(
        self,
        git: WorkspaceGit,
        crate_rel: str,
        frozen: Frozen,
        checks: Checks,
        *,
        base: str,
        scratch: Sequence[Path] = (),
        disk_mb: int,
    ) -> None:
        self.git, self.crate_rel, self.frozen, self.checks = git, crate_rel, frozen, checks
        self.root, self.base = git.workspace, base
        self.crate_dir = self.root / crate_rel
        self.disk = DiskTotal([self.root, *scratch], disk_mb)  # what the limit counts: the tree and the target dir
        self._fork: ForkVerdict | None = None
        if checks.fork and not checks.only_acceptance:
            self._fork = ForkVerdict(
                self._cargo_test,
                checks.spec,
                self.crate_dir,
                self.changed_files,
                checks.run_example,
                checks.record,
                checks.lifecycle,
                checks.snapshot,
                within=self.root,
            )
            self._verdict: Callable[..., Verdict] = self._fork
        else:
            self._verdict = make_verdict(
                self._cargo_test,
                checks.spec,
                self.root,
                checks.run_example,
                only_acceptance=checks.only_acceptance,
                lifecycle=checks.lifecycle,
                snapshot=checks.snapshot,
            )

    @property
    def verdict_runs_git(self) -> bool:
        """A fork's verdict asks host git for the changed files; make_verdict's runs none."""
        return self._fork is not None

    def commit(self, message: str, staged: Callable[[], None] = lambda: None) -> str:
        return self.git.commit(message, staged)

    def reword(self, made: str, message: str) -> str:
        return self.git.reword(made, message)

    def restore(self, sha: str) -> None:
        self.git.reset(sha, "-fd")

    def changed_files(self) -> list[str]:
        """Files changed (or added) since the edit stage's base, relative to the crate directory."""
        return changed_files(self.git, self.base, self.crate_rel)

    def baseline(self) -> Verdict:
        """The verdict before any edit (a fork's whole suite)."""
        return self._fork.full() if self._fork else self._verdict()

    def verdict(self, claimed: bool = False, on_tested: Callable[[], None] | None = None) -> Verdict:
        """flakebot's verdict on the tree; `claimed`: the model said it is done (only when to start what pays then);
        `on_tested()`: called once the tests passed while flakebot's own examples still run (make_verdict; a fork's
        verdict never calls it)."""
        return self._fork() if self._fork else self._verdict(claimed, on_tested)

    def guard(self) -> None:
        """Checked after every tool call and verdict (guard_trees)."""
        guard_trees(self.frozen, self.disk)

    def _cargo_test(self, extra: list[str], on_line: Callable[[str], None] | None = None) -> CargoReport:
        from flakebot.cargo.diagnostics import run_cargo

        checks = self.checks
        checks.before_test()
        report = run_cargo(
            checks.sandbox,
            checks.cargo,
            "test",
            cwd=self.crate_dir,
            extra=extra,
            timeout=checks.timeout,
            on_line=on_line,
        )
        if not report.ok:  # a linker's bus error or a write error on a full disk is not the model's to fix
            preflight.check_free_space(self.root, preflight.WORKING_FLOOR_MB)
        return report


def changed_files(git: WorkspaceGit, base: str, crate_rel: str) -> list[str]:
    """Files changed (or added) since `base`, relative to the crate directory."""
    paths = git("diff", "--no-ext-diff", "--name-only", base).splitlines()
    paths += git("ls-files", "--others", "--exclude-standard").splitlines()
    prefix = f"{crate_rel.rstrip('/')}/" if crate_rel else ""
    return sorted({p.removeprefix(prefix) for p in paths if p.startswith(prefix)})


def guard_trees(frozen: Frozen, disk: DiskTotal) -> None:
    """The edit loop's guard: the frozen test is unchanged (else `tampered`), and the workspace and target dir hold no
    more than the limit (else `disk`; the sandbox kills one command that writes too much, this bounds what many
    commands leave)."""
    frozen.check()
    disk.check()


class DiskTotal:
    """The disk limit over the workspace and target dir (`measured`), totalled again only when a sandboxed command
    may have written them since the last total (process.commands_seen: one started, or one still running then).
    Between two commands only flakebot's own writes land there (a tool's file, at most MAX_FILE_BYTES; a commit's
    objects): they count at the total after the next command, which every verdict runs (its cargo test)."""

    def __init__(self, measured: Sequence[Path], disk_mb: int) -> None:
        self.measured, self.disk_mb = list(measured), disk_mb
        self.seen: tuple[int, int] | None = None  # commands_seen() at the last total, when none was running

    def check(self) -> None:
        from flakebot.sandbox.process import commands_seen

        now = commands_seen()  # before the total: a command that starts during it is seen by the next check
        if now == self.seen:
            return
        used = sum(tree_bytes(p) for p in self.measured) // (1024 * 1024)
        if used > self.disk_mb:
            raise StopLoop(
                "disk",
                f"the workspace and target dir hold {used} MiB, more than sandbox_disk_mb ({self.disk_mb} MiB)",
            )
        self.seen = now if now[0] == now[1] else None
