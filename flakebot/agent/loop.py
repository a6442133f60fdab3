"""The edit loop: a bounded agent that edits a crate until flakebot's own test run is green.

run -> step -> query -> execute -> verdict
  limits (iterations, wall time, tokens/cost) are checked before every model call;
  after a step that changed files flakebot runs the tests itself and shows the model the result;
  a state no worse than the best so far is committed, and the best is restored at the end; the commit runs on a
  thread beside the step's report and the next model call; its read of the tree (`git add -A`) is waited for before
  the next tool call (it may change the tree), the rest of it (index, objects, refs: nothing the tools or the
  sandbox write) goes on beside the tool calls and the verdict's sandboxed cargo, and the whole commit is settled
  before a verdict that runs host git in the tree (a fork's: it may lock the index), after any verdict, before a
  restore, and at the end of the run; when the model said it is done, the commit starts as soon
  as the verdict's tests have passed, beside flakebot's own run of the examples (which writes nothing of the tree),
  and should that run fail, the commit made gets the count of failures (the best commit is still the one restored);
  the same edit or the same failures three times in a row stops the loop;
  `workspace.guard()` runs after every tool call and every verdict (the frozen-file check; in a verdict that commits
  beside the examples, once cargo has ended, before the commit): it may stop the loop;
  `done` is not trusted: only flakebot's verdict ends the loop green.
What the loop does to the world goes through the workspace (agent/workspace.py); what it reports, through `events`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from flakebot.errors import BudgetExceeded, ModelError
from flakebot.llm.base import Model, ToolCall

if TYPE_CHECKING:
    from flakebot.agent.tools import ToolResult

logger = logging.getLogger(__name__)

REPEAT_LIMIT = 3
EDIT_TOOLS = {"write_file", "edit_file", "add_dependency"}


class Tools(Protocol):
    """What the loop needs of its tools (a Toolbox, or a Toolbox with more tools such as disputes.DisputeDesk)."""

    def schemas(self) -> list[dict[str, Any]]: ...
    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult: ...


class Environment(Protocol):
    """What the loop does to the world (agent/workspace.py's Workspace): commit and restore states, judge, guard.
    `verdict_runs_git`: the verdict runs host git in the tree (a fork's changed files), so no commit may run beside it."""

    @property
    def verdict_runs_git(self) -> bool: ...

    def commit(self, message: str, staged: Callable[[], None] = ...) -> str: ...
    def reword(self, made: str, message: str) -> str: ...
    def restore(self, sha: str) -> None: ...
    def verdict(self, claimed: bool = False, on_tested: Callable[[], None] | None = None) -> Verdict: ...
    def guard(self) -> None: ...


class LoopEvents(Protocol):
    """What the loop reports: records for the transcript, and the end of each step (the run's progress)."""

    def record(self, kind: str, **data: Any) -> None: ...
    def step(self, iteration: int, result: LoopResult, verdict: Verdict | None) -> None: ...


class Quiet:
    """LoopEvents that keep nothing."""

    def record(self, kind: str, **data: Any) -> None:
        pass

    def step(self, iteration: int, result: LoopResult, verdict: Verdict | None) -> None:
        pass


@dataclass
class Verdict:
    """flakebot's own judgement of the workspace, from one test run."""

    green: bool
    failures: int  # failing tests; compile failure counts as worse than any number of failing tests
    summary: str  # what the model is shown
    key: str  # identity of the failure set, for loop detection
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopResult:
    """How the loop ended: its status, a summary, the error if any, the best commit and a log of tool calls."""

    status: str  # green | iterations | time | budget | loop_detected | model_error | tampered | disk
    summary: str = ""
    error: str | None = None
    fix: str | None = None  # the remedy the model error or budget named, when one ended the loop
    iterations: int = 0
    best_failures: int | None = None
    best_commit: str = ""
    verdict: dict[str, Any] = field(default_factory=dict)
    log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def green(self) -> bool:
        return self.status == "green"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PendingCommit:
    """A commit made on a thread while the loop goes on: `staged()` waits until it has read the tree, `sha()` for the
    whole commit (each raises what the commit raised)."""

    def __init__(self, commit: Callable[..., str], message: str) -> None:
        self._sha = ""
        self._error: BaseException | None = None
        self._staged = threading.Event()
        self._thread = threading.Thread(target=self._make, args=(commit, message), name="loop-commit", daemon=True)
        self._thread.start()

    def _make(self, commit: Callable[..., str], message: str) -> None:
        try:
            self._sha = commit(message, self._staged.set)
        except BaseException as exc:  # handed to the loop's thread by staged() or sha()
            self._error = exc
        finally:
            self._staged.set()

    def staged(self) -> None:
        self._staged.wait()
        if self._error is not None:
            raise self._error

    def sha(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sha

    def wait(self) -> None:
        """Until the commit has ended, whatever its outcome."""
        self._thread.join()


class StopLoop(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class LoopLimits:
    max_iterations: int
    max_wall_seconds: float


class EditLoop:
    """Drive a model with a toolbox until the verdict is green or a limit is reached."""

    def __init__(
        self, model: Model, toolbox: Tools, workspace: Environment, limits: LoopLimits, events: LoopEvents | None = None
    ) -> None:
        self.model, self.toolbox, self.workspace, self.limits = model, toolbox, workspace, limits
        self.events: LoopEvents = events or Quiet()
        self.result = LoopResult(status="running")
        self.messages: list[dict[str, Any]] = []
        self._recent_edits: list[str] = []
        self._recent_failures: list[str] = []
        self._started = 0.0
        self._pending: PendingCommit | None = None

    def run(self, system: str, task: str, baseline: Verdict) -> LoopResult:
        self._started = time.monotonic()
        self.messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"{task}\n\nCurrent test result:\n{baseline.summary}"},
        ]
        self._remember(baseline, self.workspace.commit("flakebot: baseline"))
        try:
            while True:
                self._check_limits()
                if self.step():
                    self.result.status = "green"
                    break
        except StopLoop as stop:
            self.result.status, self.result.error = stop.status, str(stop)
        except BudgetExceeded as exc:
            self.result.status, self.result.error, self.result.fix = "budget", exc.message, exc.fix
        except ModelError as exc:
            self.result.status, self.result.error, self.result.fix = "model_error", exc.message, exc.fix
        finally:
            try:
                self.settle()
            finally:
                if not self.result.green and self.result.best_commit:
                    self.workspace.restore(self.result.best_commit)
        return self.result

    def settle(self) -> None:
        """Wait for the commit still being made (if any): its sha becomes the best commit."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.result.best_commit = pending.sha()

    def settle_tree(self) -> None:
        """Wait until the commit still being made (if any) has read the tree: then the tree may change."""
        if self._pending is not None:
            self._pending.staged()

    def _check_limits(self) -> None:
        if self.result.iterations >= self.limits.max_iterations:
            raise StopLoop("iterations", f"stopped after {self.result.iterations} iterations without green tests")
        if time.monotonic() - self._started > self.limits.max_wall_seconds:
            raise StopLoop("time", f"stopped after {self.limits.max_wall_seconds:.0f}s without green tests")

    def step(self) -> bool:
        """One model call and its tool calls; True when flakebot's verdict is green after `done`."""
        self.result.iterations += 1
        reply = self.model.complete(self.messages, self.toolbox.schemas())
        self.messages.append(reply.to_message())
        self.events.record(
            "model_reply",
            iteration=self.result.iterations,
            text=reply.text,
            tool_calls=[c.name for c in reply.tool_calls],
        )
        if not reply.tool_calls:
            self.messages.append(
                {"role": "user", "content": "Use the tools to change the code; call done when the tests pass."}
            )
            self.events.step(self.result.iterations, self.result, None)
            return False
        changed, finished = False, False
        for call in reply.tool_calls:
            text, edited, finished_now = self._execute(call)
            changed |= edited
            finished |= finished_now
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        verdict = self._judge(finished) if changed or finished else None
        self.events.step(self.result.iterations, self.result, verdict)
        if verdict is None:
            return False
        if verdict.green:  # flakebot's verdict ends the loop, with or without the model's `done`
            self.result.summary = self.result.summary or f"tests green after {self.result.iterations} iterations"
            return True
        self.messages.append(
            {"role": "user", "content": f"flakebot ran the tests; they are not green yet:\n{verdict.summary}"}
        )
        return False

    def _execute(self, call: ToolCall) -> tuple[str, bool, bool]:
        """Run one tool call; returns (text for the model, whether files may have changed, whether it was done)."""
        # the model client counts malformed calls in a row and ends the run as a model error (llm/chat.py)
        if call.error:
            return f"error: your tool call could not be parsed: {call.error}. Send valid JSON arguments.", False, False
        if call.name == "done":
            self.result.summary = str(call.arguments.get("summary", ""))
            return "flakebot is running the tests to check.", False, True
        if call.name in EDIT_TOOLS:
            self._note_edit(call)
        self.settle_tree()  # the tool may change the tree (or run cargo on it): the last good state is read first
        outcome = self.toolbox.call(call.name, call.arguments)
        text = outcome.text
        self.workspace.guard()  # a tool's cargo run executes model code: check before anything is committed
        self.events.record(
            "tool_call",
            iteration=self.result.iterations,
            name=call.name,
            arguments=call.arguments,
            ok=outcome.ok,
            result=text[:4000],
        )
        self.result.log.append({"iteration": self.result.iterations, "tool": call.name, "ok": outcome.ok})
        return text, call.name in EDIT_TOOLS and outcome.ok, False

    def _note_edit(self, call: ToolCall) -> None:
        digest = hashlib.sha256(json.dumps([call.name, call.arguments], sort_keys=True).encode()).hexdigest()
        self._recent_edits = (self._recent_edits + [digest])[-REPEAT_LIMIT:]
        if len(self._recent_edits) == REPEAT_LIMIT and len(set(self._recent_edits)) == 1:
            raise StopLoop("loop_detected", f"the same {call.name} was made {REPEAT_LIMIT} times in a row")

    def _judge(self, claimed: bool = False) -> Verdict:
        if self.workspace.verdict_runs_git:
            # the whole commit, not only its read: the verdict's own host git (a fork's changed files: `git diff`) may
            # refresh the index under .git/index.lock, and a `git commit` started meanwhile dies on that lock
            self.settle()
        else:  # the rest of the commit (index, objects, refs) goes on beside the verdict's sandboxed cargo, as beside
            self.settle_tree()  # a tool's; its read was waited for before the tool calls
        ahead: list[PendingCommit] = []
        message = f"flakebot: iteration {self.result.iterations}, {{}} failing"

        def on_tested() -> None:
            # the tests passed and cargo has ended: only flakebot's own run of the examples is left, which writes
            # nothing of the tree, so the tree is guarded and committed now, beside it, as a green verdict has it
            self.settle()  # never two commits at once (the one before is long made: cargo took longer)
            self.workspace.guard()
            ahead.append(PendingCommit(self.workspace.commit, message.format(0)))

        # `claimed`: the model called `done` this step. Never trusted for the verdict; it only tells the workspace
        # a green verdict is expected, so work that pays only then may start early (the examples beside the tests,
        # the commit beside the examples)
        try:
            verdict = self.workspace.verdict(claimed, on_tested) if claimed else self.workspace.verdict()
        except BaseException:
            for commit in ahead:  # no git left running beside what follows (a restore)
                commit.wait()
            raise
        self.settle()  # the commit before, made beside the verdict (if it was): its sha the best so far
        if not ahead:  # (on_tested guarded the tree the commit read, as cargo left it)
            self.workspace.guard()  # the verdict's cargo test ran build scripts: a green from a changed test means nothing
        self.events.record(
            "verdict", iteration=self.result.iterations, green=verdict.green, failures=verdict.failures, key=verdict.key
        )
        better = self.result.best_failures is None or verdict.failures <= self.result.best_failures
        if ahead and verdict.failures:  # the examples failed: the commit made says how many
            ahead[0].sha()  # made (or its failure raised) before its message changes
            sha = self.workspace.reword(message.format(0), message.format(verdict.failures))
            if better:
                self._remember(verdict, sha)
        elif ahead or better:
            # its read waited for before the tree changes
            self._pending = (
                ahead[0] if ahead else PendingCommit(self.workspace.commit, message.format(verdict.failures))
            )
            self._remember(verdict, self.result.best_commit)
        self._recent_failures = (self._recent_failures + [verdict.key])[-REPEAT_LIMIT:]
        if not verdict.green and len(self._recent_failures) == REPEAT_LIMIT and len(set(self._recent_failures)) == 1:
            raise StopLoop("loop_detected", f"the same failures {REPEAT_LIMIT} times in a row")
        return verdict

    def _remember(self, verdict: Verdict, commit: str) -> None:
        self.result.best_failures, self.result.best_commit = verdict.failures, commit
        self.result.verdict = {"green": verdict.green, "failures": verdict.failures, **verdict.data}
