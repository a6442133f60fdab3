"""The edit loop's commits on a real git workspace: made on a thread beside the next model call, yet every state the
loop judged no worse is committed exactly as judged, settled before the next tool touches the tree, the best one
restored at the end, and a commit's failure still ends the run."""

from __future__ import annotations

import threading
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
    `commit_waits`: a commit first waits (at most 5 s) for this event, and notes whether it came."""

    def __init__(self, ws: Workspace, failures: list[int], commit_waits: threading.Event | None = None) -> None:
        self.ws, self.failures, self.waits = ws, failures, commit_waits
        self.judged: list[str] = []  # main.rs as each verdict saw it
        self.overlapped: list[bool] = []

    def commit(self, message: str) -> str:
        if self.waits is not None and "iteration" in message:
            self.overlapped.append(self.waits.wait(5))
        return self.ws.commit(message)

    def restore(self, sha: str) -> None:
        self.ws.restore(sha)

    def guard(self) -> None:
        self.ws.guard()

    def verdict(self, claimed: bool = False) -> Verdict:
        self.judged.append((self.ws.root / MAIN).read_text())
        failures = self.failures[len(self.judged) - 1]
        return Verdict(failures == 0, failures, f"{failures} failing", f"key{len(self.judged)}")


class Seen:
    """The real Toolbox; each call first notes the subject of the workspace's HEAD commit."""

    def __init__(self, toolbox: Toolbox, ws: Workspace) -> None:
        self.toolbox, self.ws = toolbox, ws
        self.heads: list[str] = []

    def schemas(self) -> list[dict[str, Any]]:
        return self.toolbox.schemas()

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        self.heads.append(self.ws.git("log", "-1", "--format=%s").strip())
        return self.toolbox.call(name, arguments)


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
    # each tool call came after the commit the iteration before it made
    assert tools.heads == ["base", *["flakebot: iteration 1, 2 failing"] * 2, "flakebot: iteration 3, 1 failing"]


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

    def broken(message: str) -> str:
        if "iteration" in message:
            raise EditError("git commit failed", fix="inspect the workspace")
        return ws.commit(message)

    env.commit = broken  # type: ignore[method-assign]
    with pytest.raises(EditError, match="git commit failed"):
        loop.run("system", "task", Verdict(False, 5, "5 failing", "base"))
