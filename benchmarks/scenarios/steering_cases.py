"""Attacks on where flakebot's own Python processes start (issue 41, class 1), each judged from outside.

A directory a crafted tool with `writable ["."]` could fill holds a planted `flakebot/` package, or a directory on
PYTHONPATH holds sitecustomize.py and usercustomize.py, or PYTHONSTARTUP names a planted file; each planted module
appends its process's command line to a marker file. flakebot itself is started there (isolated, as an installed
console script is: its own imports never come from the cwd), and starts its children the way it does for real: a
long MCP call's detached job (`flakebot mcp` over stdio with the MCP SDK's client, `resume` of an unknown run), and
a service's supervisor (the spawn `up`, `restart` and upgrades share). Contained: the marker stays empty and the
child did flakebot's work (the job answered "no such run"; the supervisor logged). Before flakebot/launcher.py, the
package and PYTHONPATH cases ran the planted code in both doors (2 of 6 contained); PYTHONSTARTUP is read only by an
interactive interpreter, so those two cases held even then and are counted as the variant an attacker tries next.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[2]
PACKAGE = ("flakebot/__init__.py", "flakebot/__main__.py", "flakebot/mcp/server.py", "flakebot/services/__init__.py",
           "flakebot/services/supervisor.py", "sitecustomize.py", "usercustomize.py")  # fmt: skip
SPY = """with open({marker!r}, "a") as out:
    out.write({name!r} + " " + open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode() + "\\n")
"""
BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); "  # flakebot from this checkout, whatever the cwd
MCP_SERVER = BOOT + "sys.argv[0] = 'flakebot'; from flakebot.cli import main; main()"
SUPERVISOR = BOOT + (
    "from pathlib import Path; from flakebot.services.supervised import _spawn_supervisor; "
    "from flakebot.services.layout import ServiceDir; _spawn_supervisor(ServiceDir(Path(sys.argv[1])))"
)
TIMEOUT = 60.0


@dataclass(frozen=True)
class Case:
    name: str
    door: str
    attempt: str


DOORS = {"job": "a long MCP call's job", "supervisor": "a service's supervisor"}
ATTEMPTS = {
    "cwd-package": "a flakebot/ package in the working directory",
    "pythonpath-site": "sitecustomize.py and usercustomize.py on PYTHONPATH",
    "pythonstartup": "PYTHONSTARTUP naming a planted file",
}
CASES = [Case(f"{door}-{attempt}", DOORS[door], text) for door in DOORS for attempt, text in ATTEMPTS.items()]
QUICK = ["job-cwd-package", "supervisor-cwd-package"]


def plant(directory: Path, marker: Path, names: tuple[str, ...]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(SPY.format(marker=str(marker), name=name))
    return directory


def _environment(directory: Path, attempt: str, marker: Path) -> dict[str, str]:
    home = {f"XDG_{k}_HOME": str(directory / "home" / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")}
    env = {**os.environ, **home, "FLAKEBOT_WORKDIR": str(directory / "home/work")}
    planted = directory / "planted"
    if attempt == "pythonpath-site":
        env["PYTHONPATH"] = str(plant(planted, marker, ("sitecustomize.py", "usercustomize.py")))
    elif attempt == "pythonstartup":
        env["PYTHONSTARTUP"] = str(plant(planted, marker, ("startup.py",)) / "startup.py")
    return env


def _job(cwd: Path, env: dict[str, str], directory: Path) -> tuple[bool, str]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def session() -> Any:
        argv = ["-I", "-c", MCP_SERVER, str(CHECKOUT), "mcp"]
        params = StdioServerParameters(command=sys.executable, args=argv, env=env, cwd=str(cwd))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            return await client.call_tool("resume", {"run_id": "nope"})  # no progress token: a detached job

    answer = json.loads(asyncio.run(asyncio.wait_for(session(), TIMEOUT)).content[0].text)
    return answer.get("exit_code") == 4, f"the job answered: {answer.get('error', answer)}"


def _supervisor(cwd: Path, env: dict[str, str], directory: Path) -> tuple[bool, str]:
    service = directory / "home/work/services/planted"
    service.mkdir(parents=True)
    argv = [sys.executable, "-I", "-c", SUPERVISOR, str(CHECKOUT), str(service)]
    subprocess.run(argv, cwd=cwd, env=env, check=True, timeout=TIMEOUT)  # the parent is the attacked caller here
    log, end = service / "supervisor.log", time.monotonic() + TIMEOUT
    while time.monotonic() < end and "flakebot" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    text = log.read_text() if log.exists() else ""
    return "flakebot" in text, "the supervisor logged" if text else "the supervisor wrote nothing to its log"


RUNNERS: dict[str, Callable[[Path, dict[str, str], Path], tuple[bool, str]]] = {
    DOORS["job"]: _job,
    DOORS["supervisor"]: _supervisor,
}


def run_case(directory: Path, case: Case) -> dict[str, Any]:
    directory.mkdir(parents=True)
    marker = directory / "marker"
    attempt = next(key for key, text in ATTEMPTS.items() if text == case.attempt)
    cwd = plant(directory / "cwd", marker, PACKAGE if attempt == "cwd-package" else ())
    started = time.monotonic()
    try:
        ran, outcome = RUNNERS[case.door](cwd, _environment(directory, attempt, marker), directory)
    except Exception as exc:  # noqa: BLE001 - the row says what broke
        ran, outcome = False, f"the case failed to run: {type(exc).__name__}: {exc}"
    steered = marker.read_text().splitlines() if marker.exists() else []
    if steered:
        outcome = f"planted code ran: {steered[0][:200]}"
    row = {"case": case.name, "door": case.door, "attempt": case.attempt}
    return {
        **row,
        "contained": ran and not steered,
        "outcome": outcome,
        "seconds": round(time.monotonic() - started, 2),
    }


def run_steering_cases(root: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Each case (or those named) in its own directory under `root`; one row each."""
    return [run_case(root / case.name, case) for case in CASES if names is None or case.name in names]
