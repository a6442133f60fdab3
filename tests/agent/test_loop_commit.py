"""The edit loop's commits on a real git workspace: made on a thread beside the next model call and tool call, yet
every state the loop judged no worse is committed exactly as judged (the tree read before the next tool touches it),
the best one restored at the end, and a commit's failure still ends the run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flakebot.agent.loop import EditLoop, LoopLimits, Verdict
from flakebot.agent.tools import Toolbox
from flakebot.agent.workspace import Workspace
from flakebot.errors import EditError
from flakebot.llm.base import Reply, ToolCall
from tests.agent.test_workspace import make_workspace

MAIN = "crate/src/main.rs"


class Writes:
    """A model that writes src/main.rs with the next text each turn; `started` is set when a turn begins."""

    name = "test:writes"

    def __init__(self, texts: list[str]) -> None:
        self.texts, self.turns, self.started = texts, 0, threading.Event()

    def complete(self, messages: list[dict[str, Any]], tools: Any = None, *, temperature: float = 0.0) -> Reply:
        self.turns += 1
        if self.turns > 1:
            self.started.set()
        text = self.texts[self.turns - 1]
        return Reply("", [ToolCall(f"c{self.turns}", "write_file", {"path": MAIN, "content": text})])

    def close(self) -> None:
        pass


class Judged:
    """The real workspace (commit, restore, guard) with a verdict per iteration given by the test: `failures[i]`.
    `waits`: an iteration's commit first waits (at most 5 s) for this event, and notes whether it came;
    `after_read(message)`: called once an iteration's commit has read the tree, before the rest of it."""

    verdict_runs_git = True  # as a fork's verdict, unless a test says otherwise

    def __init__(self, ws: Workspace, failures: list[int]) -> None:
        self.ws, self.failures = ws, failures
        self.verdict_started = threading.Event()
        self.waits: threading.Event | None = None
        self.after_read: Callable[[str], None] = lambda message: None
        self.judged: list[str] = []  # main.rs as each verdict saw it
        self.overlapped: list[bool] = []

    def commit(self, message: str, staged: Callable[[], None] = lambda: None) -> str:
        ours = "iteration" in message
        if self.waits is not None and ours:
            self.overlapped.append(self.waits.wait(5))

        def read() -> None:
            staged()
            if ours:
                self.after_read(message)

        return self.ws.commit(message, read)

    def reword(self, made: str, message: str) -> str:
        return self.ws.reword(made, message)

    def restore(self, sha: str) -> None:
        self.ws.restore(sha)

    def guard(self) -> None:
        self.ws.guard()

    def verdict(self, claimed: bool = False) -> Verdict:
        self.verdict_started.set()
        self.judged.append((self.ws.root / MAIN).read_text())
        failures = self.failures[len(self.judged) - 1]
        return Verdict(failures == 0, failures, f"{failures} failing", f"key{len(self.judged)}")


class Seen:
    """The real Toolbox; each call first notes main.rs as the workspace's index holds it (what a commit read), and
    is counted once done (`made(n)` waits, at most 5 s, for the n-th)."""

    def __init__(self, toolbox: Toolbox, ws: Workspace) -> None:
        self.toolbox, self.ws = toolbox, ws
        self.staged: list[str] = []
        self.calls, self.counted = 0, threading.Condition()

    def schemas(self) -> list[dict[str, Any]]:
        return self.toolbox.schemas()

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.staged.append(self.ws.git("show", f":{MAIN}", sweep=False))
        try:
            return self.toolbox.call(name, arguments)
        finally:
            with self.counted:
                self.calls += 1
                self.counted.notify_all()

    def made(self, n: int) -> bool:
        with self.counted:
            return self.counted.wait_for(lambda: self.calls >= n, 5)


def loop_on(tmp_path: Path, texts: list[str], failures: list[int]) -> Any:
    ws = make_workspace(tmp_path / "repo")
    env = Judged(ws, failures)
    tools = Seen(Toolbox(ws.root, ws.checks.sandbox, ws.checks.cargo, crate_dir="crate"), ws)
    model = Writes(texts)
    loop = EditLoop(model, tools, env, LoopLimits(len(texts), 60))  # type: ignore[arg-type]
    return loop, ws, env, tools, model


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    return tmp_path


def test_each_state_judged_no_worse_is_committed_as_judged_and_the_best_restored(repo: Path) -> None:
    texts = [f"fn main() {{ /* {n} */ }}\n" for n in range(4)]
    loop, ws, env, tools, _ = loop_on(repo, texts, failures=[2, 3, 1, 4])
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.status == "iterations"
    subjects = ws.git("log", "--format=%s").splitlines()
    assert subjects[:3] == ["flakebot: iteration 3, 1 failing", "flakebot: iteration 1, 2 failing", "base"]
    assert ws.git("show", f"{result.best_commit}:{MAIN}") == texts[2] == env.judged[2]
    assert (ws.root / MAIN).read_text() == texts[2]  # restored: the 4th state was worse
    # each tool call came after the commit the iteration before it made had read the tree
    assert tools.staged == [ws.git("show", f"{ws.base}:{MAIN}"), texts[0], texts[0], texts[2]]


def test_the_commit_runs_beside_the_next_model_call(repo: Path) -> None:
    texts = ["fn main() { /* a */ }\n", "fn main() { /* b */ }\n"]
    loop, ws, env, _, model = loop_on(repo, texts, failures=[1, 0])
    env.waits = model.started  # the first commit waits for the second model call: a commit in line would not see it
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.green and env.overlapped[:1] == [True]
    assert ws.git("show", f"{result.best_commit}:{MAIN}") == texts[1]
    assert ws.git("log", "-1", "--format=%s").strip() == "flakebot: iteration 2, 0 failing"


def test_a_commit_that_fails_on_its_thread_ends_the_run(repo: Path) -> None:
    loop, ws, env, _, _ = loop_on(repo, ["fn main() { /* a */ }\n", "x"], failures=[1, 1])

    def broken(message: str, staged: Callable[[], None] = lambda: None) -> str:
        if "iteration" in message:
            raise EditError("git commit failed", fix="inspect the workspace")
        return ws.commit(message, staged)

    env.commit = broken  # type: ignore[method-assign]
    with pytest.raises(EditError, match="git commit failed"):
        loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    # the tree is left at the last commit made (the base), not at the state whose commit failed
    assert ws.git("log", "-1", "--format=%s").strip() == "base"  # the baseline had nothing new to commit
    assert (ws.root / MAIN).read_text() == "fn main() {}\n" and ws.git("status", "--porcelain") == ""


def test_the_rest_of_a_commit_runs_beside_the_next_tool_call_and_holds_the_tree_as_judged(repo: Path) -> None:
    texts = ["fn main() { /* a */ }\n", "fn main() { /* b */ }\n", "fn main() { /* c */ }\n"]
    loop, ws, env, tools, _ = loop_on(repo, texts, failures=[2, 1, 0])
    waited = []

    def until_the_next_tool_wrote(message: str) -> None:  # iterations 1 and 2: the 3rd is green, the run's last
        iteration = int(message.split()[2].rstrip(","))
        if iteration < 3:
            waited.append(tools.made(iteration + 1))

    env.after_read = until_the_next_tool_wrote
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.green and waited == [True, True]
    commits = ws.git("log", "--format=%H %s").splitlines()[:3]
    held = {subject: ws.git("show", f"{sha}:{MAIN}") for sha, subject in (c.split(" ", 1) for c in commits)}
    assert held == {f"flakebot: iteration {n + 1}, {2 - n} failing": texts[n] for n in range(3)}
    assert list(held.values()) == env.judged[::-1]  # as each verdict saw it
    assert ws.git("status", "--porcelain") == ""


@pytest.mark.parametrize("runs_git", [False, True])
def test_the_rest_of_a_commit_runs_beside_a_verdict_that_runs_no_host_git(repo: Path, runs_git: bool) -> None:
    """make_verdict's verdict runs cargo in the sandbox, no host git: the commit before it goes on beside it (its read
    of the tree was waited for before the tool call), and is still made as judged. A verdict that runs host git (a
    fork's) waits for the whole commit first."""
    texts = ["fn main() { /* a */ }\n", "fn main() { /* b */ }\n", "fn main() { /* c */ }\n"]
    loop, ws, env, _, _ = loop_on(repo, texts, failures=[2, 1, 0])
    env.verdict_runs_git = runs_git
    beside = []

    def until_the_next_verdict_started(message: str) -> None:  # iteration 1's commit, after its read
        if message.startswith("flakebot: iteration 1,"):
            env.verdict_started.clear()
            beside.append(env.verdict_started.wait(0 if runs_git else 5))

    env.after_read = until_the_next_verdict_started
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.green and beside == [not runs_git]
    commits = ws.git("log", "--format=%H %s").splitlines()[:3]
    held = {subject: ws.git("show", f"{sha}:{MAIN}") for sha, subject in (c.split(" ", 1) for c in commits)}
    assert held == {f"flakebot: iteration {n + 1}, {2 - n} failing": texts[n] for n in range(3)}
    assert result.best_commit == ws.git.head() and ws.git("status", "--porcelain") == ""


def test_a_verdict_asking_host_git_for_the_changed_files_does_not_make_the_commit_beside_it_fail(repo: Path) -> None:
    """ForkVerdict asks `git diff` for the changed files: git refreshes the index under .git/index.lock when a tracked
    file's stat changed but not its bytes (a build touched it), and a `git commit` started meanwhile dies on that lock.
    The previous commit, paused after its read until the verdict's git holds the lock (or 3 s), must still be made."""
    texts = ["fn main() { /* a */ }\n", "fn main() { /* b */ }\n"]
    big = repo / "repo/crate/assets.bin"  # in the base, the commit `git diff` compares with
    big.parent.mkdir()
    big.write_bytes(b"\0" * (96 * 1024 * 1024))  # git takes a while to hash it again
    loop, ws, env, tools, _ = loop_on(repo, texts, failures=[1, 0])
    lock = ws.root / ".git/index.lock"
    judge = env.verdict

    def verdict(claimed: bool = False) -> Verdict:
        ws.changed_files()  # as ForkVerdict does before it picks the affected targets
        return judge(claimed)

    def until_the_verdicts_git_holds_the_index(message: str) -> None:
        if message.startswith("flakebot: iteration 1") and tools.made(2):
            os.utime(big)  # a build script touched a tracked file: stat changed, bytes not
            deadline = time.monotonic() + 3
            while not lock.exists() and time.monotonic() < deadline:
                time.sleep(0.001)

    env.verdict = verdict  # type: ignore[method-assign]
    env.after_read = until_the_verdicts_git_holds_the_index
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.green
    assert ws.git("log", "--format=%s").splitlines()[:2] == [
        "flakebot: iteration 2, 0 failing",
        "flakebot: iteration 1, 1 failing",
    ]
    assert ws.git("show", f"{result.best_commit}:{MAIN}") == texts[1]


def change_everything(root: Path, ran: Path) -> None:
    """What a sandboxed build may do to the tree: a tracked file made a repository whose config names a program, a
    new nested repository, a tracked file replaced by a link, another deleted, a big untracked file."""
    hook = root.parent / "fsmonitor.sh"
    hook.write_text(f"#!/bin/sh\ntouch {ran}\n")
    hook.chmod(0o755)
    (root / "other/notes.txt").unlink()
    for repo in (root / "other/notes.txt", root / "crate/sub"):
        (repo / ".git/refs/heads").mkdir(parents=True)
        (repo / ".git/objects").mkdir()
        (repo / ".git/config").write_text(f"[core]\n\tfsmonitor = {hook}\n")
        (repo / ".git/HEAD").write_text("ref: refs/heads/main\n")
        (repo / "file.txt").write_text("inside a nested repository\n")
    (root / "crate/Cargo.toml").unlink()
    (root / "crate/Cargo.toml").symlink_to("/etc/hostname")
    (root / ".gitignore").unlink()
    (root / "crate/huge.bin").write_bytes(b"\1" * (64 * 1024 * 1024))


@pytest.mark.parametrize(
    ("changed_at", "failures"),
    [(1, [1, 2]), (2, [1, 1])],  # a commit with something staged (the next state worse), one with nothing new
)
def test_a_tree_changed_every_way_while_git_commit_runs_changes_nothing_committed_or_restored(
    repo: Path, changed_at: int, failures: list[int]
) -> None:
    texts = ["fn main() { /* a */ }\n"] * 2  # the same state twice: the second commit has nothing to commit
    loop, ws, env, _, _ = loop_on(repo, texts, failures)
    judged = {rel: ws.git("show", f"HEAD:{rel}") for rel in ("crate/Cargo.toml", "other/notes.txt", ".gitignore")}
    judged[MAIN] = texts[0]
    ran = repo / "fsmonitor-ran"

    changed = []

    def changes_the_tree(message: str) -> None:
        if message.startswith(f"flakebot: iteration {changed_at},"):
            change_everything(ws.root, ran)
            changed.append(message)

    env.after_read = changes_the_tree
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.status == "iterations" and result.best_failures == 1 and len(changed) == 1 and not ran.exists()
    assert {rel: ws.git("show", f"{result.best_commit}:{rel}") for rel in judged} == judged
    assert ws.git("ls-tree", "-r", "--name-only", result.best_commit).split() == sorted(
        [*judged, "crate/tests/acceptance.rs"]
    )
    # restored: the tree as judged, every change swept, reset or cleaned
    assert {rel: (ws.root / rel).read_text() for rel in judged} == judged
    assert not (ws.root / "crate/Cargo.toml").is_symlink() and not (ws.root / "crate/sub").exists()
    assert ws.git("status", "--porcelain", "--ignored") == ""


class Claiming(Writes):
    """Writes, and says it is done in the turns (1-based) of `claims`."""

    def __init__(self, texts: list[str], claims: set[int]) -> None:
        super().__init__(texts)
        self.claims = claims

    def complete(self, messages: list[dict[str, Any]], tools: Any = None, *, temperature: float = 0.0) -> Reply:
        reply = super().complete(messages, tools, temperature=temperature)
        said = [ToolCall(f"d{self.turns}", "done", {"summary": "done"})] if self.turns in self.claims else []
        return Reply("", [*reply.tool_calls, *said])


class Examined(Judged):
    """As the edit stage's verdict does once the model said it is done: every test passed, so `on_tested()` is called
    while flakebot's own run of the examples goes on; that run here waits (at most 5 s) until the iteration's commit
    is in the log, noting whether it came, then fails `failures[i]` examples."""

    def __init__(self, ws: Workspace, failures: list[int]) -> None:
        super().__init__(ws, failures)
        self.committed_while_examined: list[bool] = []

    def verdict(self, claimed: bool = False, on_tested: Callable[[], None] | None = None) -> Verdict:
        if claimed and on_tested is not None:
            on_tested()
            made = f"flakebot: iteration {len(self.judged) + 1}, 0 failing"
            deadline = time.monotonic() + 5
            while made not in self.ws.git("log", "--format=%s", sweep=False) and time.monotonic() < deadline:
                time.sleep(0.005)
            self.committed_while_examined.append(time.monotonic() < deadline)
        return super().verdict(claimed)


def claiming_loop(tmp_path: Path, texts: list[str], failures: list[int], claims: set[int]) -> Any:
    ws = make_workspace(tmp_path / "repo")
    env = Examined(ws, failures)
    tools = Toolbox(ws.root, ws.checks.sandbox, ws.checks.cargo, crate_dir="crate")
    loop = EditLoop(Claiming(texts, claims), tools, env, LoopLimits(len(texts), 60))  # type: ignore[arg-type]
    return loop, ws, env


def test_a_claimed_verdict_commits_once_the_tests_passed_beside_the_examples(repo: Path) -> None:
    texts = ["fn main() { /* a */ }\n"]
    loop, ws, env = claiming_loop(repo, texts, failures=[0], claims={1})
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.green and env.committed_while_examined == [True]  # made before the examples' run ended
    assert ws.git("log", "-1", "--format=%s").strip() == "flakebot: iteration 1, 0 failing"
    assert result.best_commit == ws.git.head() and ws.git("show", f"{result.best_commit}:{MAIN}") == texts[0]
    assert ws.git("status", "--porcelain") == ""


def test_a_commit_made_beside_examples_that_then_fail_says_how_many(repo: Path) -> None:
    """No worse than the best: the commit made beside the examples is the best, its message their count."""
    texts = ["fn main() { /* a */ }\n", "fn main() { /* b */ }\n"]
    loop, ws, env = claiming_loop(repo, texts, failures=[2, 3], claims={1})
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.status == "iterations" and env.committed_while_examined == [True]
    assert ws.git("log", "--format=%s").splitlines()[:2] == ["flakebot: iteration 1, 2 failing", "base"]
    assert ws.git("show", f"{result.best_commit}:{MAIN}") == texts[0] == (ws.root / MAIN).read_text()  # restored
    assert result.best_failures == 2


def test_a_commit_made_beside_examples_that_fail_worse_than_the_best_is_not_the_best(repo: Path) -> None:
    """Worse than the best: the commit made says its count, and the best is restored."""
    texts = ["fn main() { /* a */ }\n", "fn main() { /* b */ }\n"]
    loop, ws, env = claiming_loop(repo, texts, failures=[1, 3], claims={2})
    result = loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
    assert result.status == "iterations" and env.committed_while_examined == [True]
    assert ws.git("log", "--format=%s").splitlines()[:2] == ["flakebot: iteration 1, 1 failing", "base"]
    assert "flakebot: iteration 2, 3 failing" in ws.git("log", "-g", "--format=%s").splitlines()  # before the restore
    assert ws.git("log", "-1", "--format=%s", result.best_commit).strip() == "flakebot: iteration 1, 1 failing"
    assert (ws.root / MAIN).read_text() == texts[0] and result.best_failures == 1  # the best restored
