"""Attacks on the host step `craft --service` adds to the edit loop: flakebot's own lifecycle check of the binary
cargo built (flakebot.stages.edit.service_check), run on real programs in the real sandbox (bubblewrap, pasta).

- cargo's JSON names the binary, and a test's output can forge it: a link out of the target dir is refused, never run;
- a service that forks a daemon in a new session: nothing of it outlives the check;
- a service that binds a port on the host: it binds in its own network namespace, never the host's;
- a build that swaps the service's file after cargo reported it: the lifecycle runs on the copy taken then, as the
  examples of a tool do, and the swap turns the verdict red.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from pathlib import Path

from flakebot import config
from flakebot.agent.acceptance import ACCEPTANCE_TEST, SERVICE_TEST
from flakebot.agent.loop import Verdict
from flakebot.agent.verdict import make_verdict
from flakebot.cargo.diagnostics import parse_output
from flakebot.sandbox import CommandResult
from flakebot.services.crafting import from_answer
from flakebot.stages.edit import example_runner, service_check
from flakebot.toolspec import ToolSpec
from tests.conftest import require
from tests.fakes.processes import Listing, own_processes

MARK = "31337"  # the daemon's `sleep` argument: how the test finds it among its own processes

SERVICE = """#!/usr/bin/python3
import http.server, os, pathlib, signal, socket, subprocess, sys
state = pathlib.Path(os.environ["STATE_DIRECTORY"])
{prelude}
if {daemon}:
    subprocess.Popen(["sleep", "{mark}"], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if {host_port}:
    grab = socket.socket()
    grab.bind(("127.0.0.1", {host_port}))  # taken on the host: only a namespace of its own lets this succeed
    grab.listen()

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.answer(200, b"ok")
        key = state / self.path.rsplit("/", 1)[-1]
        self.answer(200, key.read_bytes()) if key.exists() else self.answer(404)

    def do_PUT(self):
        (state / self.path.rsplit("/", 1)[-1]).write_bytes(self.rfile.read(int(self.headers["Content-Length"])))
        self.answer(200, b"stored\\n")

    def log_message(self, *args):
        pass

signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
if os.environ.get("LISTEN_FDS") == "1" and os.environ.get("LISTEN_PID") == str(os.getpid()):  # as the template
    server = http.server.HTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
    server.socket = socket.socket(fileno=3)  # the socket flakebot holds, handed in
else:
    server = http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler)
server.serve_forever()
"""

SPEC = ToolSpec.from_dict(
    {
        "name": "kv-store",
        "summary": "a key-value store",
        "usage": "",
        "examples": [],
        "service": from_answer(
            {
                "stop_grace_s": 2,
                "start_s": 5,
                "first": [{"method": "PUT", "path": "/kv/a", "body": "1", "status": 200, "body_out": "stored\n"}],
                "after_restart": [{"method": "GET", "path": "/kv/a", "status": 200, "body_out": "1"}],
            }
        ),
    }
)


def built(target: Path, *, daemon: bool = False, host_port: int = 0, prelude: str = "") -> Path:
    """The service as cargo would leave it in the run's target dir, readable and runnable by the sandbox's uid;
    `prelude`: code it runs first, at each start."""
    require("bwrap", "pasta")
    program = target / "debug" / "kv-store"
    program.parent.mkdir(parents=True)
    program.write_text(SERVICE.format(daemon=daemon, host_port=host_port, mark=MARK, prelude=prelude))
    for path in (program, program.parent, target):
        path.chmod(0o755)
    return program


def daemons(ours: Listing) -> list[int]:
    return [pid for pid, argv in ours() if argv[:2] == ["sleep", MARK]]


def test_a_forged_binary_path_out_of_the_target_dir_is_refused_not_run(tmp_path: Path) -> None:
    outside = built(tmp_path / "elsewhere")  # a working service: if it ran, the check would pass
    target = tmp_path / "target"
    (target / "debug").mkdir(parents=True)
    (target / "debug" / "kv-store").symlink_to(outside)
    check = service_check(config.load(), example_runner(config.load(), target), SPEC)
    assert check is not None
    for named in (target / "debug" / "kv-store", outside):  # a link in the target dir, or a path beside it
        failures = check(named)
        assert len(failures) == 1 and "refused to run the built binary" in failures[0], failures


def test_a_daemon_the_service_forks_does_not_outlive_the_check(tmp_path: Path) -> None:
    target = tmp_path / "target"
    check = service_check(config.load(), example_runner(config.load(), target), SPEC)
    assert check is not None
    with own_processes() as ours:  # this test's processes: another run's sleep 31337 is not its daemon
        assert check(built(target, daemon=True)) == []  # a correct service otherwise: green
        assert not daemons(ours), "the service's daemon outlived flakebot's lifecycle check"


def test_a_service_binds_its_ports_in_its_own_namespace_not_the_hosts(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        target = tmp_path / "target"
        check = service_check(config.load(), example_runner(config.load(), target), SPEC)
        assert check is not None
        failures = check(built(target, host_port=port))
        assert failures == [], json.dumps(failures)  # its bind of the host's taken port succeeded: not the host's
        with socket.create_connection(("127.0.0.1", port), timeout=2):  # and the host's listener is still ours
            pass


def swapped(service: str) -> str:
    """A working service with other bytes than the one cargo built."""
    return service + "# swapped after cargo reported it\n"


def claimed_verdict(
    run: Path,
    swap: bool,
    *,
    prelude: str = "",
    forged_first: str = "",
    seen: Callable[[Path], None] | None = None,
    checked: list[Path] | None = None,
) -> tuple[Verdict, list[Path]]:
    """The loop's verdict once the model said done, on a `cargo test` whose artifact message names the service in the
    target dir, and the files the lifecycle check ran; `swap`: something the build left running rewrites that file
    after the message (with a service that passes its lifecycle as well: only the copy taken at the message tells the
    two apart). `forged_first`: a proc macro prints that message first (it runs before rustc writes the bin), while
    the file it names is a "link" to the service, or holds what the swap writes ("planted"). `seen(binary)`: called
    after each check; `checked`: where the files checked are listed (as they start)."""
    target = run / "target"
    program = built(target, prelude=prelude)
    line = json.dumps({"reason": "compiler-artifact", "target": {"kind": ["bin"], "name": SPEC.name},
                       "profile": {"test": False}, "executable": str(program), "fresh": False})  # fmt: skip
    stdout = f"{line}\ntest {SERVICE_TEST} ... ok\n\ntest result: ok. 1 passed; 0 failed; 0 ignored\n"
    ran = f"     Running {ACCEPTANCE_TEST} (target/debug/deps/flakebot_acceptance-0)\n"
    report = parse_output("test", CommandResult(["cargo", "test"], 0, stdout, ran, 1.0))

    def cargo_test(extra: list[str], on_line: object = None) -> object:
        real = program.read_text()
        if forged_first and callable(on_line):
            held = program.rename(program.with_name("held"))
            if forged_first == "link":
                program.symlink_to(held)
            else:
                program.write_text(swapped(real))
                program.chmod(0o755)
            on_line(line)
            program.unlink()
            held.rename(program)  # rustc writes the bin: its real message, the same line, follows
        for each in stdout.splitlines() if callable(on_line) else []:
            on_line(each)
        if swap:
            program.write_text(swapped(real))
        return report

    settings = config.load()
    runner = example_runner(settings, target)
    check, checked = service_check(settings, runner, SPEC), [] if checked is None else checked
    assert check is not None

    def lifecycle(binary: Path) -> list[str]:
        checked.append(binary)
        failures = check(binary)
        if seen:
            seen(binary)
        return failures

    verdict = make_verdict(cargo_test, SPEC, run, runner, lifecycle=lifecycle, snapshot=runner.snapshot)
    return verdict(True), checked


def test_the_lifecycle_check_runs_on_the_copy_taken_when_cargo_reported_the_service(tmp_path: Path) -> None:
    verdict, checked = claimed_verdict(tmp_path, swap=False)
    assert verdict.green, verdict.summary
    assert len(checked) == 1 and checked[0].name == SPEC.name and checked[0].parent != tmp_path / "target" / "debug"
    assert not checked[0].exists(), "the copy outlived the verdict"


def test_a_service_swapped_after_cargo_reported_it_turns_the_verdict_red(tmp_path: Path) -> None:
    """Checked on the file in the target dir, the swapped service (a working one) passed: the verdict was green."""
    verdict, _ = claimed_verdict(tmp_path, swap=True)
    assert not verdict.green and "was replaced after cargo reported it" in verdict.summary, verdict.summary
    assert "flakebot runs its lifecycle on what cargo built" in verdict.summary


def test_a_forged_message_before_the_real_one_does_not_hand_the_check_the_swapped_file(tmp_path: Path) -> None:
    """A proc macro prints the bin's artifact message while the file is a link (no copy can be taken then); the real
    message, the same line, follows. Judged on the target dir's file after cargo, the swapped service passed."""
    verdict, checked = claimed_verdict(tmp_path, swap=True, forged_first="link")
    assert not verdict.green, f"the lifecycle judged the file a test rewrote after cargo reported it: {checked}"
    assert "was replaced after cargo reported it" in verdict.summary, verdict.summary


def test_a_forged_message_naming_a_planted_file_and_a_test_putting_it_back_turn_the_verdict_red(
    tmp_path: Path,
) -> None:
    """The macro plants a working service at the bin's path and prints its message: the copy taken then is the
    macro's file. rustc writes the bin over it (the real message, the same line), and a test writes the planted file
    back: after cargo the file cargo named holds the copy's bytes again, and the copy passed."""
    verdict, checked = claimed_verdict(tmp_path, swap=True, forged_first="planted")
    assert not verdict.green, f"the lifecycle judged a file a macro planted, not what rustc wrote: {checked}"
    assert "was replaced after cargo reported it" in verdict.summary, verdict.summary


WRITES_ITS_COPY = """me = pathlib.Path(__file__)  # the file flakebot runs: the copy taken at cargo's message
for attempt in (lambda: me.open("a").write("# rewritten by its first life\\n"), lambda: os.chmod(me, 0o777),
                lambda: (me.parent / "planted").write_text("x"), lambda: os.rename(me, me.with_name("moved")),
                lambda: me.unlink(), lambda: os.utime(me, (0, 0))):
    try:
        attempt()
    except OSError:
        pass
"""


def test_the_service_cannot_change_the_copy_it_runs_from(tmp_path: Path) -> None:
    """Its first life writes over its own file (the second start would run what it wrote), plants a file beside it,
    renames, removes and touches it: every attempt fails, and the copy is what cargo built."""
    import hashlib

    before: dict[str, object] = {}

    def seen(binary: Path) -> None:
        program = tmp_path / "target" / "debug" / "kv-store"
        before["copy"] = (
            binary.read_bytes(),
            binary.stat().st_mode,
            binary.stat().st_mtime,
            sorted(binary.parent.iterdir()),
        )
        before["built"] = (hashlib.sha256(program.read_bytes()).hexdigest(), [binary])

    verdict, checked = claimed_verdict(tmp_path, swap=False, prelude=WRITES_ITS_COPY, seen=seen)
    assert verdict.green, verdict.summary
    program = tmp_path / "target" / "debug" / "kv-store"
    data, mode, mtime, listing = before["copy"]  # type: ignore[misc]
    assert data == program.read_bytes(), "the service rewrote the copy it runs from"
    assert mode & 0o777 == 0o755 and mtime > 0 and listing == [checked[0]], (oct(mode), mtime, listing)


NEVER_HEALTHY = f"""import signal, subprocess, time
subprocess.Popen(["sleep", "{MARK}"], start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # killed only when its grace is over
while True:
    time.sleep(1)  # never answers its health check
"""


def left_behind(ours: Listing, workdir: Path, checked: list[Path]) -> list[object]:
    """What a lifecycle check on a copy left: the copy, its scratch state, a process of this test's tree."""
    scratch = sorted((workdir / "lifecycle").iterdir()) if (workdir / "lifecycle").exists() else []
    return [*(copy for copy in checked if copy.parent.exists()), *scratch, *ours()]


def test_a_service_never_healthy_that_ignores_sigterm_leaves_nothing(tmp_path: Path, workdir: Path) -> None:
    """Red by its start timeout, killed after its grace: no copy, no scratch, no process of it (its daemon either)."""
    with own_processes() as ours:
        verdict, checked = claimed_verdict(tmp_path, swap=False, prelude=NEVER_HEALTHY)
        assert not verdict.green and "not healthy within" in verdict.summary, verdict.summary
        assert left_behind(ours, workdir, checked) == []


def test_a_ctrl_c_while_the_lifecycle_runs_on_the_copy_leaves_nothing(tmp_path: Path, workdir: Path) -> None:
    """Ctrl-C lands while the service runs (its daemon is up): the check stops it and the copy goes too."""
    import os
    import signal
    import threading

    import pytest

    with own_processes() as ours:

        def interrupt_once_up() -> None:
            for _ in range(600):
                if daemons(ours):
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                threading.Event().wait(0.05)

        watcher = threading.Thread(target=interrupt_once_up)
        watcher.start()
        checked: list[Path] = []
        try:
            with pytest.raises(KeyboardInterrupt):
                claimed_verdict(tmp_path, swap=False, prelude=NEVER_HEALTHY, checked=checked)
        finally:
            watcher.join()
        assert len(checked) == 1, checked
        assert left_behind(ours, workdir, checked) == []


# The service's own process forks and ends at once (exit 0); its child, in a session of its own, holds the socket
# flakebot handed in and answers every request, health included.
CHILD_ANSWERS = """if os.fork():
    os._exit(0)
os.setsid()
os.environ["LISTEN_PID"] = str(os.getpid())
"""

# The service's own process answers nothing and exits 0 on SIGTERM; a child it forked holds the socket and answers.
CHILD_ANSWERS_PARENT_WAITS = """if os.fork():
    import signal, time
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    while True:
        time.sleep(1)
os.environ["LISTEN_PID"] = str(os.getpid())
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the service's own process is the one flakebot stops
"""


def test_a_service_that_exits_leaving_a_child_holding_its_port_is_red_and_leaves_nothing(
    tmp_path: Path, workdir: Path
) -> None:
    """flakebot watches the process it started, not whoever answers on the port: that one's exit ends the check."""
    with own_processes() as ours:
        verdict, checked = claimed_verdict(tmp_path, swap=False, prelude=CHILD_ANSWERS)
        assert not verdict.green, "a service whose own process exited at once passed its lifecycle"
        assert left_behind(ours, workdir, checked) == []


def test_a_child_answering_for_the_service_dies_with_it(tmp_path: Path, workdir: Path) -> None:
    """Answers from a child pass the check (what a client sees is right), but the child (SIGTERM ignored) is gone
    with the service: nothing of it outlives the check."""
    with own_processes() as ours:
        verdict, checked = claimed_verdict(tmp_path, swap=False, prelude=CHILD_ANSWERS_PARENT_WAITS)
        assert verdict.green, verdict.summary
        assert left_behind(ours, workdir, checked) == []
