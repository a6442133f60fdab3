"""P2: one edit-loop iteration against the raw `cargo test` it runs, after the same one-line edit, warm target dir.

The crate is the demo's own tool, as the hand-written session (flakebot/data/sessions/csv-dedup.json) builds it:
a new binary crate depending on csv and clap (flakebot's new_crate, then `cargo add clap`), the acceptance
test flakebot writes from the session's spec, and src/main.rs as the model wrote it in the session's first
edit (red: --key is missing, two acceptance tests fail) or its second (green). A binary crate has no doc-test
phase, so `cargo test` and the verdict's `cargo test --tests` build and run the same tests.
Everything runs in the bubblewrap sandbox with one warm target dir, cargo called as the edit stage calls it (offline:
release, the stand-in's --target, the crate incremental and unoptimised, the registry where Nix builds see it;
nix/loopdeps.py). The iteration pays what the stage's does around cargo: the sandbox opened as the stage opens it
(as root, flakebot's trees handed to the sandbox's uid before each command), the dependency set looked at before each
`cargo test` (the target dir seeded from the flake's deps derivation first), the stage's guard (frozen test, disk
total) after each tool call and verdict.

Each sample, raw and iteration interleaved:
  raw        Python writes a one-line edit into src/main.rs, then `cargo test --no-fail-fast` runs in the same sandbox
  iteration  `EditLoop.step()`: the scripted model (behind the stub server, through the real groq SDK the session names) sends
             edit_file with the same kind of one-line edit; the toolbox applies it and checks the frozen test;
             flakebot's verdict (`judge` of the edit stage: `cargo test --tests` as JSON, then the full `cargo test`
             once green) runs; the state is committed (the edit stage's WorkspaceGit, on the loop's thread beside the
             step's report and the next model call); the run's state.json is saved. As in a run, a red iteration's
             tool call waits for the commit the iteration before it left running to have read the tree, its verdict
             for the whole of it (the verdict's host git may lock the index; two steps in one loop, the second
             timed), and the green one, a run's last, for the whole of its own (started, as the model said done, once
             the tests passed, beside the examples)
Two kinds of iteration, as a craft has them:
  red    a test still fails after the edit (every iteration but the last): the verdict runs cargo once
  green  everything passes (the last iteration): the verdict then runs every example on the built binary (a crate
         with a library would also run the full `cargo test` for its doc tests; this binary crate has none, so
         verdict_cargo_runs is 1). Its model turn also calls `done`, as a model sure of
         its edit does: the verdict then starts the examples beside the tests (agent/verdict.py Early); a red
         iteration's turn does not, and a model that says done too early pays for them in that red iteration

Ratio (goal <= 1.05, the green iteration's <= 1.1): per iteration, its seconds against the seconds of the (first) cargo test it ran, measured in the same
moment (on a shared machine consecutive `cargo test` runs differ by more than flakebot's overhead, so two separate
medians cannot resolve it); the median over the samples. The median sample's seconds are split into model call,
tools, cargo, the wait for the git commit (and the commit's own seconds beside) and the rest, so the overhead has a name. The raw `cargo test` after the same edit
is set beside the verdict's cargo (median and range): it checks that the verdict's cargo is the same work.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot.agent.acceptance import Frozen, write_acceptance_test
from flakebot.agent.loop import EditLoop, LoopLimits, Verdict
from flakebot.agent.tools import Toolbox
from flakebot.agent.verdict import make_verdict
from flakebot.agent.workspace import DiskTotal, WorkspaceGit, guard_trees
from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates.registries import local_registry
from flakebot.llm.providers import resolve_model
from flakebot.llm.transcript import Transcript
from flakebot.nix.loopdeps import NoStoreDeps, Plan, StoreSeeder, crate_name, plan
from flakebot.pipeline.run import Run
from flakebot.sandbox import Sandbox, limits_for, open_sandbox
from flakebot.source.newcrate import new_crate
from flakebot.stages.edit import example_runner
from flakebot.toolspec import ToolSpec

GOAL_RATIO = 1.05
GOAL_GREEN = 1.1  # the last iteration also runs every example on the built binary (issue 45: P2g at most 1.1)
SESSION = Path(__file__).resolve().parents[2] / "flakebot/data/sessions/csv-dedup.json"


def session_parts() -> tuple[ToolSpec, str, str]:
    """The session's spec, and src/main.rs after its first (red) and second (green) edit."""
    stages = json.loads(SESSION.read_text())["stages"]
    spec = ToolSpec.from_dict(stages["spec"][0]["tool_calls"][0]["arguments"])
    writes = [
        c["arguments"]["content"] for turn in stages["edit"] for c in turn["tool_calls"] if c["name"] == "write_file"
    ]
    return spec, writes[0], writes[1]


class Timed:
    """A proxy that adds the seconds spent in one method of the object it wraps to `spent[key]`."""

    def __init__(self, inner: Any, method: str, spent: dict[str, float], key: str) -> None:
        self._inner, self._method, self._spent, self._key = inner, method, spent, key

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != self._method:
            return attribute

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return attribute(*args, **kwargs)
            finally:
                self._spent[self._key] = self._spent.get(self._key, 0.0) + time.perf_counter() - start

        return timed


class BenchWorkspace:
    """The loop's workspace here: the bench's commit, the edit stage's verdict and guard (the frozen test checked,
    the disk limit totalled), no restore."""

    verdict_runs_git = False  # the edit stage's make_verdict (not a fork's): no host git in the tree

    def __init__(
        self, commit: Callable[..., str], verdict: Callable[..., Verdict], git: WorkspaceGit, guard: Callable[[], None]
    ) -> None:
        self.commit, self._verdict, self.reword, self.guard = commit, verdict, git.reword, guard

    def verdict(self, claimed: bool = False, on_tested: Callable[[], None] | None = None) -> Verdict:
        return self._verdict(claimed, on_tested)

    def restore(self, sha: str) -> None:
        pass


class BenchEvents:
    """Records go to the transcript; each step saves the run's state.json, as the edit stage does (stages/edit.py
    _on_step: Run.checkpoint, its bytes synced, not its rename, on a thread of its own)."""

    def __init__(self, run: Run, transcript: Transcript) -> None:
        self.run, self.record = run, transcript.record

    def step(self, *_: Any) -> None:
        self.run.checkpoint()


class TimedLoop(EditLoop):
    """The edit stage's loop, the seconds it waits for a commit made on its thread (whole, or its read of the tree)
    added to `spent["commit"]`."""

    spent: dict[str, float]

    def settle(self) -> None:
        with self._waiting():
            super().settle()

    def settle_tree(self) -> None:
        with self._waiting():
            super().settle_tree()

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spent["commit"] = self.spent.get("commit", 0.0) + time.perf_counter() - start


class Bench:
    """One workspace, sandbox, cargo and run, shared by every sample."""

    def __init__(self, root: Path) -> None:
        self.spec, self.red_main, self.green_main = session_parts()
        self.anchor = self.red_main.splitlines()[0]  # the same first line in both versions
        self.crate, self.target = root / "workspace", root / "target"
        self.run = Run.create(root / "work", "bench")
        self.script = root / "script.json"
        self.settings = Settings(offline=True, registry="local", cache_dir=str(root / "cache"))
        self.edits = 0
        self.disk = DiskTotal([self.crate, self.target], self.settings.sandbox_disk_mb)  # the stage's, one per loop

    def create(self) -> None:
        """The session's crate: new binary crate on csv, clap added as the model asked, the frozen acceptance test."""
        new_crate(self.spec.name, self.crate, library=local_registry(self.settings).get("csv"), settings=self.settings)
        self.git = WorkspaceGit(self.crate)
        self.cargo = Cargo.for_run(self.settings, self.target)
        store = loop_plan(self.settings, self.cargo)  # the edit stage's profile and registry path, when it has them
        registry = self.cargo.registry_dir
        self.frozen = write_acceptance_test(self.spec, self.crate)  # rel path -> digest, as the edit stage freezes it
        self.frozen_files = Frozen(self.crate, self.frozen)  # one for the loop, as the edit stage makes it
        # as the edit stage opens it (stages/edit.py): as root, flakebot's trees handed to the sandbox's own uid
        # before each command (adopt), the frozen test left alone, the stage's limits
        self.sandbox: Sandbox = open_sandbox(
            "required", workspace=self.crate, writable=[self.crate, self.target], adopt=True,
            frozen=self.frozen_files.paths(), limits=limits_for(self.settings, timeout=600),
            binds=[(False, registry, store.registry)] if store and registry else [],
        )  # fmt: skip
        self.seeder: StoreSeeder | None = None
        if store:
            self.cargo.sandbox_registry, self.cargo.profile = store.registry, store.profile(crate_name(self.crate))
            self.seeder = StoreSeeder(self.settings, self.crate, self.target, self.run.dir / "loop-deps", store)
        added = Toolbox(self.crate, self.sandbox, self.cargo).call("add_dependency", {"name": "clap"})
        if not added.ok:
            raise RuntimeError(f"cargo add clap failed: {added.text}")

    def before_test(self) -> None:
        """What the edit stage does before each `cargo test` (stages/edit.py _seed_dependencies): the target dir
        seeded from the flake's deps derivation the first time, after that the dependency set looked at again."""
        if self.seeder is not None:
            self.seeder.refresh()

    def guard(self) -> None:
        """The edit stage's guard after every tool call and verdict (agent/workspace.py guard_trees)."""
        guard_trees(self.frozen_files, self.disk)

    def use(self, main_rs: str) -> None:
        """src/main.rs as the model wrote it, committed, and the target dir warmed by a first `cargo test`."""
        (self.crate / "src/main.rs").write_text(main_rs)
        self.commit("bench: the model's version")
        self.before_test()
        run_cargo(self.sandbox, self.cargo, "test", cwd=self.crate)

    def commit(self, message: str, staged: Callable[[], None] = lambda: None) -> str:
        """The edit stage's commit (WorkspaceGit): everything, only when something changed."""
        return self.git.commit(message, staged)

    def next_edit(self) -> tuple[str, str]:
        self.edits += 1
        return self.anchor, f"{self.anchor}\n// edit {self.edits}: the agent's one-line change"

    def raw(self) -> float:
        search, replace = self.next_edit()
        main = self.crate / "src/main.rs"
        main.write_text(main.read_text().replace(search, replace, 1))
        result = self.sandbox.run(self.cargo.argv("test", "--no-fail-fast"), cwd=self.crate, env=self.cargo.env())
        seconds = result.seconds  # the process's, as the verdict's cargo is timed (not flakebot's steps before it)
        if result.timed_out or "test result" not in result.stdout:
            raise RuntimeError(f"raw cargo test did not run the tests:\n{result.stderr[-2000:]}")
        # as in a loop, where every sandboxed command is followed by the guard (a verdict's cargo by its own): the
        # iteration's first guard then finds no command since, as a run's does after the verdict before it (without
        # this, the green iteration, the only step of its loop, totalled the trees again for the bench's own run)
        self.guard()
        return seconds

    def verdict(self, spent: dict[str, float]) -> Callable[..., Verdict]:
        """The edit stage's own verdict (make_verdict), its cargo runs timed."""
        runner = example_runner(self.settings, self.cargo.target_dir)

        lock = threading.Lock()

        def run_example(binary: Any, example: Any) -> Any:  # a green verdict runs every example on the built binary
            start = time.perf_counter()
            try:
                return runner(binary, example)
            finally:  # several run at once: the examples' part is from the first start to the last end
                with lock:
                    first = min(spent.get("examples_start", start), start)
                    spent["examples_start"] = first
                    spent["examples"] = time.perf_counter() - first

        return make_verdict(
            lambda extra, on_line=None: self._cargo_test(spent, extra, on_line),
            self.spec, self.crate, run_example, snapshot=runner.snapshot,
        )  # fmt: skip

    def _cargo_test(self, spent: dict[str, float], extra: list[str], on_line: Any = None) -> Any:
        self.before_test()
        report = run_cargo(self.sandbox, self.cargo, "test", cwd=self.crate, extra=extra, on_line=on_line)
        # the one `cargo test` a person would run; a second run is flakebot's choice
        spent.setdefault("cargo_first", report.seconds)
        spent["cargo"] = spent.get("cargo", 0.0) + report.seconds
        spent["cargo_runs"] = spent.get("cargo_runs", 0) + 1
        return report

    def iteration(self, steps: int, claims: bool = False) -> dict[str, Any]:
        """`steps` real EditLoop steps in one loop, as a run makes them, the last one timed: a red step waits for the
        commit the step before it left running beside its model call, not for its own (the next model call hides
        that); the green one, a run's last, waits for its own too. Its wall seconds and where they went."""
        transcript = Transcript(self.run.transcript_path)
        spent: dict[str, float] = {}
        commits: list[float] = []  # each commit's own seconds, on the loop's thread
        # `claims`: the last turn also calls `done` (a model sure of its edit), which lets the verdict start the
        # examples beside the tests (agent/verdict.py Early); a red iteration's turn does not
        # one model for the loop, as the edit stage has one (its client's connection kept between the steps' calls),
        # its stub server started beforehand
        model = self._model(transcript, steps, claims)
        try:
            toolbox = Toolbox(self.crate, self.sandbox, self.cargo, frozen=self.frozen_files)
            workspace = BenchWorkspace(self._timed_commit(commits), self.verdict(spent), self.git, self.guard)
            loop = TimedLoop(
                model, Timed(toolbox, "call", spent, "tools"), workspace, LoopLimits(5, 600),
                BenchEvents(self.run, transcript),
            )  # fmt: skip
            loop.spent = spent
            loop.messages = [
                {"role": "system", "content": "Edit the crate."},
                {"role": "user", "content": "Make the tests pass."},
            ]
            for _ in range(steps):
                spent.clear()
                loop.model = Timed(model, "complete", spent, "model")
                start = time.perf_counter()
                green = loop.step()
                if green:
                    loop.settle()  # the end of a run waits for its last commit
                seconds = time.perf_counter() - start
            timed = {"seconds": seconds, "green": green, **spent, "commit_thread": commits[0]}
            loop.settle()  # the raw run next edits the tree
        finally:
            model.close()
        return timed

    def _model(self, transcript: Transcript, turns: int, done: bool = False) -> Any:
        """A scripted model each of whose `turns` makes the next one-line edit (edit_file); with `done`, its last says
        so."""
        script: list[dict[str, Any]] = []
        for n in range(turns):
            search, replace = self.next_edit()
            call = {"name": "edit_file", "arguments": {"path": "src/main.rs", "search": search, "replace": replace}}
            said = [{"name": "done", "arguments": {"summary": "the tests pass"}}] if done and n == turns - 1 else []
            script.append({"tool_calls": [call, *said], "usage": {"prompt_tokens": 900, "completion_tokens": 60}})
        self.script.write_text(json.dumps({"format": 1, "stages": {"edit": script}}))
        return resolve_model(f"scripted:{self.script}", self.settings, stage="edit", transcript=transcript)

    def _timed_commit(self, commits: list[float]) -> Callable[..., str]:
        def commit(message: str, staged: Callable[[], None] = lambda: None) -> str:
            start = time.perf_counter()
            try:
                return self.commit(message, staged)
            finally:
                commits.append(time.perf_counter() - start)

        return commit


def _phase(bench: Bench, main_rs: str, samples: int, want_green: bool) -> dict[str, Any]:
    bench.use(main_rs)
    raws, iterations = [], []
    for _ in range(samples):
        raws.append(bench.raw())
        iterations.append(bench.iteration(1, claims=True) if want_green else bench.iteration(2))
        if iterations[-1]["green"] != want_green:
            raise RuntimeError(f"expected a {'green' if want_green else 'red'} iteration, got {iterations[-1]}")
    return _figures(raws, iterations)


def _figures(raws: list[float], iterations: list[dict[str, Any]]) -> dict[str, Any]:
    """Per iteration, its seconds against the seconds of the cargo tests it ran (same moment, same machine load);
    the raw `cargo test` after the same edit beside it (a separate run: its spread shows the machine's noise)."""
    ratios = [i["seconds"] / i["cargo_first"] for i in iterations]
    # the median sample (odd counts)
    middle = sorted(iterations, key=lambda i: i["seconds"] / i["cargo_first"])[len(iterations) // 2]
    parts = {key: round(middle.get(key, 0.0), 4) for key in ("model", "tools", "cargo", "commit", "examples")}
    parts["other"] = round(middle["seconds"] - sum(parts.values()), 4)
    parts["commit_thread"] = round(middle.get("commit_thread", 0.0), 4)  # the commit's own seconds, mostly overlapped
    return {
        "iteration_s": round(statistics.median(i["seconds"] for i in iterations), 3),
        "verdict_cargo_s": round(statistics.median(i["cargo_first"] for i in iterations), 3),
        "ratio": round(statistics.median(ratios), 3),
        "overhead_s": round(statistics.median(i["seconds"] - i["cargo_first"] for i in iterations), 4),
        "second_cargo_s": round(statistics.median(i["cargo"] - i["cargo_first"] for i in iterations), 4),
        "verdict_cargo_runs": middle.get("cargo_runs", 0),
        "iteration_parts_s": parts,
        "raw_cargo_test_s": round(statistics.median(raws), 3),
        "raw_range_s": [round(min(raws), 3), round(max(raws), 3)],
        "iteration_over_raw": round(statistics.median(i["seconds"] for i in iterations) / statistics.median(raws), 3),
        "samples": len(raws),
        "raw_samples_s": [round(r, 3) for r in raws],
        "iteration_samples_s": [round(i["seconds"], 3) for i in iterations],
    }


def loop_plan(settings: Settings, cargo: Cargo) -> Plan | None:
    """How the edit stage runs cargo offline (nix/loopdeps.py: release, --target, incremental crate), or None."""
    try:
        return plan(settings, cargo)
    except NoStoreDeps:
        return None


def run(samples: int = 7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-loop-") as tmp:
        bench = Bench(Path(tmp))
        bench.create()
        red = _phase(bench, bench.red_main, samples, want_green=False)
        green = _phase(bench, bench.green_main, samples, want_green=True)
    return {
        "crate": f"{bench.spec.name} (the hand-written session's tool, on csv and clap)",
        "red": red,
        "green": green,
        "ratio": red["ratio"],
        "goal_ratio": GOAL_RATIO,
        "goal_green": GOAL_GREEN,
        "met": red["ratio"] <= GOAL_RATIO and green["ratio"] <= GOAL_GREEN,
    }


@dataclass(frozen=True, kw_only=True)
class Iterations:
    """The medians of one phase's iterations (red: tests still fail; green: the last one)."""

    iteration_s: float
    verdict_cargo_s: float
    ratio: float
    overhead_s: float
    second_cargo_s: float
    verdict_cargo_runs: int
    iteration_parts_s: dict[str, float]
    raw_cargo_test_s: float
    raw_range_s: list[float]
    iteration_over_raw: float
    samples: int
    raw_samples_s: list[float]
    iteration_samples_s: list[float]


@dataclass(frozen=True, kw_only=True)
class LoopResult:
    """run()'s result, as report.json holds it."""

    crate: str
    red: Iterations
    green: Iterations
    ratio: float
    goal_ratio: float
    met: bool
    goal_green: float = GOAL_GREEN


RESULT = LoopResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
