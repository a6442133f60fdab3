"""Time every child process a flakebot command starts, to set a command's wall time against the raw work it ran.

    python -m benchmarks.perf.proctrace LOG.json ARGS...   runs `flakebot ARGS...`; LOG.json: {"processes": [...], "main_returned": time}

How: before flakebot (or GitPython, which binds Popen at import) is imported, `subprocess.Popen` is replaced by
a subclass that notes the wall-clock time a process was spawned and the time it was reaped (its wait()/poll()
first saw an exit status). Nothing of flakebot is changed; the cost is two clock reads per process.
A process's seconds are therefore spawn-to-reap, as its caller experienced them. Its CPU seconds (`cpu_s`, user +
system) are the kernel's count for it and every descendant it reaped, read from wait4 as it is reaped: a measure the
machine's other load moves far less than wall time.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RECORDS: list[dict[str, Any]] = []
# sandbox layers in front of the real command (each ends its options with --)
WRAPPERS = {
    "bwrap",
    "prlimit",
    "setpriv",
}


class TimedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """Popen that records argv, spawn time and seconds until reaped."""

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        self._started = time.perf_counter()
        self._record: dict[str, Any] = {
            "argv": _argv(args), "start": time.time(), "seconds": None, "returncode": None, "cpu_s": None,
        }  # fmt: skip
        super().__init__(args, *rest, **kwargs)
        RECORDS.append(self._record)

    def _note_exit(self) -> None:
        if self.returncode is not None and self._record["seconds"] is None:
            self._record.update(seconds=time.perf_counter() - self._started, returncode=self.returncode)

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        """Popen's own reaping (its waitpid), through wait4 to keep the process tree's CPU seconds."""
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored): no status, no usage
            return self.pid, 0
        if pid == self.pid:
            self._record["cpu_s"] = usage.ru_utime + usage.ru_stime
        return pid, status

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._note_exit()
        return code

    def poll(self) -> int | None:
        code = super().poll()
        self._note_exit()
        return code


def _argv(args: Any) -> list[str]:
    if isinstance(args, str | bytes | os.PathLike):
        return [os.fsdecode(args)]
    return [os.fsdecode(a) for a in args]


def install() -> None:
    """Replace subprocess.Popen (call before importing flakebot or git)."""
    subprocess.Popen = TimedPopen  # type: ignore[misc]


def command_of(argv: list[str]) -> list[str]:
    """The command itself, without the sandbox layers (bwrap ... -- prlimit ... -- setpriv ... -- CMD)."""
    while argv and Path(argv[0]).name in WRAPPERS and "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    return argv


def classify(argv: list[str]) -> str:
    """A process's kind: 'cargo <subcommand>', 'nix <subcommand>', 'git', 'sandbox probe', or the program's name."""
    sandboxed = bool(argv) and Path(argv[0]).name == "bwrap"
    command = command_of(argv)
    program = Path(command[0]).name if command else "?"
    if program in ("cargo", "nix"):
        return f"{program} {_subcommand(command[1:])}"
    if sandboxed and command == ["true"]:
        return "sandbox probe"
    return program


def _subcommand(args: list[str]) -> str:
    """The first word that is neither an option nor an option's value (cargo --config X, nix --option K V)."""
    takes_value = {"--config": 1, "--extra-experimental-features": 1, "--option": 2, "--override-input": 2, "-Z": 1}
    i = 0
    while i < len(args):
        if args[i] in takes_value:
            i += 1 + takes_value[args[i]]
        elif args[i].startswith("-"):
            i += 1
        else:
            return args[i]
    return "?"


def main() -> None:
    log, args = Path(sys.argv[1]), sys.argv[2:]
    install()
    sys.argv = ["flakebot", *args]
    returned: list[float] = []

    def write() -> None:  # registered first, so the last exit handler: flakebot's entry leaves without teardown
        main_returned = returned[0] if returned else time.time()
        log.write_text(json.dumps({"processes": RECORDS, "main_returned": main_returned}))

    atexit.register(write)
    from flakebot.cli.entry import main as cli_main  # the console script's entry, as a user runs it

    try:
        cli_main()
    except SystemExit:  # what follows is the interpreter's own shutdown
        returned.append(time.time())
        raise


if __name__ == "__main__":
    main()
