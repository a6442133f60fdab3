"""A Run: one directory holding everything one craft (or package) produced.

<workdir>/runs/<id>/
    state.json        versioned; rewritten atomically after every stage
    events.jsonl      every event the pipeline emitted
    run.log           the library's log records for this run
    transcript.jsonl  every model request/reply and tool call (secrets redacted)
    workspace/        the crate being edited (removed by clean)
    target/           the run's one cargo target directory (removed by clean)
    flake/            the generated flake (kept)
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flakebot import processid
from flakebot.errors import RunError
from flakebot.fsutil import atomic_write_json, json_record_text
from flakebot.pipeline import checkpoint as checkpoints
from flakebot.pipeline.request import RunRequest

logger = logging.getLogger(__name__)

# 2: stage outputs are typed (flakebot.stages.outputs); acquire stores crate_dir at the top
# 3: the caller's input is a typed RunRequest under "request" (was a dict under "options", whose "settings" are now
#    the top-level "settings" the stages pinned); the package pipeline's first stage is "locate" (was "source")
STATE_FORMAT = 3
# A run id (or a prefix of one) is a name, never a path: RUN/flake or ../x would load a state.json the model wrote.
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def runs_dir(workdir: Path) -> Path:
    return Path(workdir) / "runs"


def new_run_id() -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


class Run:
    """A run's directory and its state.json, loaded or created."""

    def __init__(self, directory: Path, state: dict[str, Any]) -> None:
        self.dir = directory
        self.state = state
        # HEAD of a workspace this process's acquire stage made and committed whole, untouched since ('' otherwise:
        # another process's, or unknown): the edit stage's first start has nothing of it to restore. Never saved.
        self.workspace_committed = ""

    @property
    def id(self) -> str:
        return str(self.state["id"])

    @property
    def workspace(self) -> Path:
        return self.dir / "workspace"

    @property
    def target_dir(self) -> Path:
        return self.dir / "target"

    @property
    def flake_dir(self) -> Path:
        return self.dir / "flake"

    @property
    def transcript_path(self) -> Path:
        return self.dir / "transcript.jsonl"

    @property
    def log_path(self) -> Path:
        return self.dir / "run.log"

    @property
    def events_path(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def request(self) -> RunRequest:
        """What the caller asked of this run."""
        return RunRequest.from_dict(self.state["request"])

    @property
    def status(self) -> str:
        status = str(self.state.get("status", "unknown"))
        if status == "running" and not _alive(self.state.get("pid"), self.state.get("pid_start")):
            return "interrupted"
        return status

    @classmethod
    def create(cls, workdir: Path, pipeline: str, request: RunRequest | None = None, tenant: str = "") -> Run:
        """A new run; `tenant` is whose catalog it works for (team mode; "" the organisation's or a lone user's)."""
        root = runs_dir(workdir)
        try:
            root.mkdir(parents=True, exist_ok=True)
            directory = root / new_run_id()
            directory.mkdir()
        except OSError as exc:
            raise RunError(
                f"work directory {workdir} is not writable ({exc.strerror})",
                fix="pass --workdir DIR with a writable directory or fix its permissions",
            ) from None
        request = request or RunRequest()
        now = time.time()
        state = {
            "format": STATE_FORMAT,
            "id": directory.name,
            "pipeline": pipeline,
            "need": request.need,
            "tenant": tenant,
            "request": request.to_dict(),
            "settings": {},
            "created": now,
            "updated": now,
            "status": "created",
            **own_process(),
            "stages": {},
            "outputs": {},
            "resources": [],
        }
        run = cls(directory, state)
        run.save()
        return run

    @classmethod
    def load(cls, workdir: Path, run_id: str) -> Run:
        directory = find_run_dir(workdir, run_id)
        path = directory / "state.json"
        checkpoints.flush(path)  # this process's last checkpoint of it, written first
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise RunError(
                f"run {run_id} has no state.json", fix=f"remove {directory} with 'flakebot clean {run_id}'"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:  # json's decoder recurses per level
            raise RunError(
                f"state.json of run {run_id} is corrupt ({exc})",
                fix=f"restore {path} or start a new run; 'flakebot clean {run_id}' removes it",
            ) from None
        _check_state(state, path)
        state = migrate_state(state)
        if not isinstance(state.get("request"), dict) or not isinstance(state.get("settings"), dict):
            raise RunError(
                f"{path} is corrupt: missing or wrong request, settings",
                fix="restore the file from its last good copy or start a new run",
            )
        if state["id"] != directory.name:
            raise RunError(
                f"{path} names run {state['id']!r}, not {directory.name!r}: it was not written for this run",
                fix=f"remove the run with 'flakebot clean {directory.name}'",
            )
        return cls(directory, state)

    def save(self, *, durable: bool = True) -> None:
        """Write state.json atomically (temp file, fsync, rename). Not `durable`: a checkpoint whose loss to a machine's
        crash changes nothing a resume does (a stage marked running: the previous state has it pending, and it is
        run again either way), its rename not synced (its bytes are: never an empty state.json after a crash)."""
        self.state["updated"] = time.time()
        checkpoints.flush(self.dir / "state.json")  # a checkpoint still being written never lands after this
        atomic_write_json(self.dir / "state.json", self.state, durable=durable)

    def checkpoint(self) -> None:
        """save(durable=False) written on a thread of its own (pipeline/checkpoint.py), for a state saved at every
        step of a loop: the next step does not wait for its fsync. The next save() waits for it."""
        self.state["updated"] = time.time()
        checkpoints.put(self.dir / "state.json", json_record_text(self.state))

    def output(self, stage: str) -> dict[str, Any]:
        """What a finished stage produced; {} if it has not run."""
        return dict(self.state["outputs"].get(stage) or {})

    def register(self, kind: str, **data: Any) -> None:
        """Remember something this run created (a path, a process, a fork) so clean can remove it."""
        entry = {"kind": kind, **data}
        if entry not in self.state["resources"]:
            self.state["resources"].append(entry)
            self.save()

    def stage_status(self, stage: str) -> str:
        return str(self.state["stages"].get(stage, {}).get("status", "pending"))

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the run's lock: two processes never drive one run at once."""
        try:
            handle = open(self.dir / ".lock", "w")
        except FileNotFoundError:  # cleaned since it was loaded (flakebot clean holds this lock as it removes it)
            raise RunError(
                f"run {self.id} was removed (flakebot clean) since it was read", fix="start a new run"
            ) from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunError(
                f"run {self.id} is being driven by another process", fix="wait for it to finish, or stop it first"
            ) from None
        try:
            yield
        finally:
            handle.close()

    def driven(self) -> bool:
        """Whether a process holds the run's lock now (it is being driven, not merely marked running)."""
        path = self.dir / ".lock"
        if not path.exists():
            return False
        with open(path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
        return False


def _check_state(state: Any, path: Path) -> None:
    required = {"format": int, "id": str, "pipeline": str, "stages": dict, "outputs": dict, "resources": list}
    problems = [
        key for key, kind in required.items() if not isinstance(state, dict) or not isinstance(state.get(key), kind)
    ]
    if problems:
        raise RunError(
            f"{path} is corrupt: missing or wrong {', '.join(problems)}",
            fix="restore the file from its last good copy or start a new run",
        )
    if state["format"] > STATE_FORMAT:
        raise RunError(f"{path} was written by a newer flakebot (format {state['format']})", fix="upgrade flakebot")


def migrate_state(state: dict[str, Any]) -> dict[str, Any]:
    """A state.json of an earlier format, in the current one (written back on the next save)."""
    if state["format"] < 3:
        options = dict(state.pop("options", None) or {})
        pinned = options.pop("settings", None)
        state["settings"] = dict(pinned) if isinstance(pinned, dict) else {}
        state["request"] = RunRequest.from_options(str(state.get("need") or ""), options).to_dict()
        if state["pipeline"] == "package":
            for key in ("stages", "outputs"):
                if "source" in state[key]:
                    state[key]["locate"] = state[key].pop("source")
    state["format"] = STATE_FORMAT
    return state


def check_run_id(run_id: str) -> str:
    """`run_id` when it is a run id or a prefix of one (a name: letters, digits, '-', '_'); RunError otherwise."""
    if not RUN_ID.fullmatch(run_id or ""):
        raise RunError(
            f"{run_id!r} is not a run id: a run id is a name such as 20260101-120000-abc123, not a path",
            fix="give an id (or a unique prefix) that 'flakebot runs' lists",
            reason="bad_id",
        )
    return run_id


def _is_run_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def find_run_dir(workdir: Path, run_id: str) -> Path:
    """The directory of a run, given its id or a unique prefix of it: always a direct child of runs/."""
    root = runs_dir(workdir)
    check_run_id(run_id)
    if _is_run_dir(root / run_id):
        return root / run_id
    matches = [p for p in root.iterdir() if p.name.startswith(run_id) and _is_run_dir(p)] if root.is_dir() else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise RunError(f"run id '{run_id}' is ambiguous ({len(matches)} runs match)", fix="give more of the id")
    raise RunError(
        f"no run '{run_id}' in {root}",
        fix="list runs with 'flakebot runs' (or pass the --workdir the run used)",
        reason="not_found",
    )


def list_runs(workdir: Path) -> list[Run]:
    """All readable runs, newest first; unreadable ones are logged and skipped."""
    runs = []
    root = runs_dir(workdir)
    for directory in sorted(root.iterdir(), reverse=True) if root.is_dir() else []:
        if not _is_run_dir(directory) or not RUN_ID.fullmatch(directory.name):
            continue
        try:
            runs.append(Run.load(workdir, directory.name))
        except RunError as exc:
            logger.warning("skipping %s: %s", directory, exc.message)
    return runs


def own_process() -> dict[str, Any]:
    """The state.json fields naming the process driving a run: its pid, and that process's start time (pid_start)."""
    return {"pid": os.getpid(), "pid_start": processid.start_time(os.getpid())}


def running_pid(directory: Path) -> Any:
    """The pid of the process still running the run in `directory`, as its state.json says, read as it is: a state
    Run.load refuses (written by a newer flakebot, damaged by hand) may still be a live run's, whose tree is not to be
    removed under it. None when nothing readable there says a live process runs it."""
    try:
        state = json.loads((directory / "state.json").read_text())
    except (OSError, ValueError, RecursionError):  # unreadable: nothing says a process runs it
        return None
    if not isinstance(state, dict) or state.get("status") != "running":
        return None
    pid = state.get("pid")
    return pid if _alive(pid, state.get("pid_start")) else None


def _alive(pid: Any, started: Any) -> bool:
    """Whether the run's process still runs: its pid with the start time kept beside it (a pid alone may be another
    process's by now, or a kernel thread's). A state.json from before start times were kept: any process but a
    kernel thread or a zombie."""
    if started is not None:
        return processid.is_running(pid, started)
    return isinstance(pid, int) and processid.is_running(pid, processid.start_time(pid))
