"""The lifecycle check on real programs in the real sandbox: a small Python key-value service that does it right,
and the same service without its health endpoint, ignoring SIGTERM, or keeping its state in memory."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from flakebot import config
from flakebot.services.declaration import ServiceSpec
from flakebot.services.lifecycle import Examples, check_lifecycle, header_mismatch
from tests.conftest import REPO, require
from tests.fakes.service_sessions import LINKS_SPEC, build_links

SERVICE = """#!/usr/bin/python3
import http.server, os, pathlib, signal, sys
MODE = "{mode}"
state = pathlib.Path(os.environ["STATE_DIRECTORY"])
memory = {{}}

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.answer(404 if MODE == "no-health" else 200, b"ok")
        if self.path == "/go/greeting":  # a redirect, its Location in the case HTTP/1.0 servers often use
            self.send_response(302)
            self.send_header("Content-Length", "0")
            self.send_header("content-type", "text/plain; charset=utf-8")
            if MODE != "no-location":
                self.send_header("location", "/kv/greeting")
            self.end_headers()
            return
        if self.path == "/whoami":
            return self.answer(200, self.headers.get("X-User", "nobody").encode())
        if MODE == "endless":
            self.send_response(200)
            self.end_headers()
            while True:
                self.wfile.write(b"x" * 65536)
        key = self.path.rsplit("/", 1)[-1]
        value = memory.get(key) if MODE == "forgets" else (state / key).read_bytes() if (state / key).exists() else None
        self.answer(404) if value is None else self.answer(200, value)

    def do_PUT(self):
        key, value = self.path.rsplit("/", 1)[-1], self.rfile.read(int(self.headers["Content-Length"]))
        memory[key] = value
        if MODE != "forgets":
            (state / key).write_bytes(value)
        self.answer(200, b"stored\\n")

    def log_message(self, *args):
        pass

signal.signal(signal.SIGTERM, signal.SIG_IGN if MODE == "ignores-term" else lambda *a: sys.exit(0))
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def service(tmp_path: Path, mode: str) -> Path:
    """The service as a program the sandbox's unprivileged uid may read and run."""
    require("bwrap", "pasta")
    program = tmp_path / mode / "bin" / "service"
    program.parent.mkdir(parents=True)
    program.write_text(SERVICE.format(mode=mode))
    for path in (program, program.parent, program.parent.parent):
        path.chmod(0o755)
    return program


EXAMPLES = Examples.load(REPO / "tests" / "fixtures" / "kv-service" / "examples.json")
SPEC = ServiceSpec(stop_grace_s=1, start_s=4)


def test_a_service_that_does_it_right_passes_every_step(tmp_path: Path) -> None:
    report = check_lifecycle(service(tmp_path, "good"), SPEC, config.load(), EXAMPLES)
    assert report.ok, json.dumps(report.to_dict(), indent=1)
    steps = [s["step"] for s in report.steps]
    assert steps[-1] == "second start: SIGTERM, clean exit" and "second start: GET /kv/greeting" in steps


@pytest.mark.parametrize(
    ("mode", "failed_step", "problem"),
    [
        ("no-health", "first start: healthy", "not healthy within 4 s"),
        ("ignores-term", "first start: SIGTERM, clean exit", "not 0 within 1 s of SIGTERM"),
        ("forgets", "second start: GET /kv/greeting", "status 404, expected 200"),
        ("endless", "first start: GET /kv/greeting", "answer over 1024 KiB"),
    ],
)
def test_a_service_that_breaks_its_lifecycle_stays_red(
    tmp_path: Path, mode: str, failed_step: str, problem: str
) -> None:
    report = check_lifecycle(service(tmp_path, mode), SPEC, config.load(), EXAMPLES)
    assert not report.ok
    failed = [s for s in report.steps if not s["ok"]]
    assert failed[0]["step"] == failed_step and problem in failed[0]["problem"], report.steps


def test_an_upgrade_check_runs_on_a_copy_of_the_live_state_and_leaves_it_alone(tmp_path: Path) -> None:
    """`seed` (what an upgrade passes: the running version's state directory) is copied, sockets left out; the
    examples read the copied values and their writes go to the copy only."""
    import socket

    live = tmp_path / "live"
    live.mkdir()
    (live / "seeded").write_text("from the live state")
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(live / "control.sock"))  # a running service's socket: copying it would fail
    before = sorted((p.name, p.stat().st_mtime_ns) for p in live.iterdir())
    examples = Examples.from_dict(
        {"first": [{"method": "GET", "path": "/kv/seeded", "body_out": "from the live state"},
                   {"method": "PUT", "path": "/kv/written", "body": "by the check"}],
         "after_restart": [{"method": "GET", "path": "/kv/written", "body_out": "by the check"}]}
    )  # fmt: skip
    report = check_lifecycle(service(tmp_path, "good"), SPEC, config.load(), examples, seed=live)
    listening.close()
    assert report.ok, report.steps
    assert report.steps[0]["step"] == "copy of the state" and report.steps[0]["ok"]
    assert sorted((p.name, p.stat().st_mtime_ns) for p in live.iterdir()) == before  # nothing written to it
    assert not (live / "written").exists()


def test_an_upgrade_check_copies_a_link_in_the_state_as_a_link_not_the_host_file_it_names(tmp_path: Path) -> None:
    """A service writes a symbolic link into its state directory naming a host file it cannot see; the copy for
    an upgrade check is made on the host (as root here): it must not read the file into the new version's state."""
    host_secret = tmp_path / "host-only" / "secret"
    host_secret.parent.mkdir()
    host_secret.write_text("host secret")
    live = tmp_path / "live"
    live.mkdir()
    (live / "stolen").symlink_to(host_secret)
    examples = Examples.from_dict({"first": [{"method": "GET", "path": "/kv/stolen", "status": 404}]})
    report = check_lifecycle(service(tmp_path, "good"), SPEC, config.load(), examples, seed=live)
    assert report.ok, report.steps  # inside the sandbox the link leads nowhere: 404, never the host file's bytes


def test_the_state_copy_drops_setuid_and_setgid_bits(tmp_path: Path) -> None:
    """The copy is made as root: a file the service marked setuid would otherwise become a setuid-root file on the
    host, with the service's content."""
    import stat as stat_module

    from flakebot.services.lifecycle import _copy_state

    live = tmp_path / "live"
    (live / "sub").mkdir(parents=True)
    program = live / "sub" / "program"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o6755)
    assert _copy_state(live, tmp_path / "copy", 64) == ""
    copied = (tmp_path / "copy" / "sub" / "program").stat()
    assert (
        stat_module.S_IMODE(copied.st_mode) == 0o755
        and (tmp_path / "copy" / "sub" / "program").read_text() == "#!/bin/sh\n"
    )


def test_a_directory_swapped_for_a_link_during_the_state_copy_copies_no_host_file(tmp_path: Path) -> None:
    """The live service keeps writing while its state is copied for an upgrade check: one that swaps a directory
    of its state for a link to a host directory between the copy's listing and its descent had the copy (made as
    root) read host files into the state the new version reads. Against shutil.copytree this race leaked the host
    file in 11 of 300 copies; through safefs a swap ends the copy (tried again) and never enters the link."""
    import os
    import threading
    import time

    from flakebot.services.lifecycle import _copy_state

    secret = tmp_path / "host-only"
    secret.mkdir()
    (secret / "s").write_text("host secret")
    live = tmp_path / "live"
    (live / "d").mkdir(parents=True)
    for i in range(50):
        (live / "d" / f"f{i}").write_text("state")
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            try:
                os.rename(live / "d", live / "d.real")
                os.symlink(secret, live / "d")
                time.sleep(0.0005)
                os.unlink(live / "d")
                os.rename(live / "d.real", live / "d")
            except OSError:
                pass

    racer = threading.Thread(target=swap)
    racer.start()
    leaked, copied = 0, 0
    try:
        for _ in range(300):
            copy = tmp_path / "copy"
            copied += _copy_state(live, copy, 64) == ""
            leaked += any(
                p.is_file() and not p.is_symlink() and p.read_text() == "host secret" for p in copy.rglob("*")
            )
    finally:
        stop.set()
        racer.join()
    assert leaked == 0 and copied > 0, (leaked, copied)


# ------------------------------------------------------------------ headers

REDIRECT = {"method": "GET", "path": "/go/greeting", "status": 302}


@pytest.mark.parametrize(
    ("mode", "expected", "problem"),
    [
        # the name in any case; the service also sends Server, Date and Content-Type: extra headers are fine
        ("good", {"Location": "/kv/greeting"}, ""),
        ("good", {"LOCATION": "/kv/greeting", "Content-Type": "text/plain; charset=utf-8"}, ""),
        ("no-location", {"Location": "/kv/greeting"}, "header Location: none, expected '/kv/greeting'"),
        ("good", {"Location": "/KV/greeting"}, "header Location: '/kv/greeting', expected '/KV/greeting'"),
        (
            "good",
            {"Content-Type": "text/plain"},
            "header Content-Type: 'text/plain; charset=utf-8', expected 'text/plain'",
        ),
    ],
)
def test_the_check_holds_an_answer_to_the_headers_its_example_names(
    tmp_path: Path, mode: str, expected: dict[str, str], problem: str
) -> None:
    """Before headers, a redirect without its Location passed: an example could say only status and body."""
    examples = Examples.from_dict({"first": [{**REDIRECT, "headers_out": expected}], "after_restart": []})
    report = check_lifecycle(service(tmp_path, mode), SPEC, config.load(), examples)
    failed = [s for s in report.steps if not s["ok"]]
    if not problem:
        assert report.ok, report.steps
    else:
        assert failed[0]["step"] == "first start: GET /go/greeting" and failed[0]["problem"] == problem, failed


def test_the_check_sends_an_examples_request_headers(tmp_path: Path) -> None:
    asked = {"method": "GET", "path": "/whoami", "headers": {"X-User": "ada"}, "body_out": "ada"}
    report = check_lifecycle(service(tmp_path, "good"), SPEC, config.load(), Examples.from_dict({"first": [asked]}))
    assert report.ok, report.steps


def test_a_built_service_whose_redirect_has_no_location_fails_the_check_and_one_with_it_passes(tmp_path: Path) -> None:
    """The links service made from flakebot's template, built by cargo, checked as `up` runs it."""
    require("cargo", "bwrap", "pasta")
    spec, examples = ServiceSpec(stop_grace_s=2, start_s=5), Examples.from_dict(LINKS_SPEC)
    with_it = check_lifecycle(build_links(tmp_path), spec, config.load(), examples)
    assert with_it.ok, with_it.steps
    assert "second start: GET /docs" in [s["step"] for s in with_it.steps]  # asked for as `location` there
    without = check_lifecycle(build_links(tmp_path, "no-location"), spec, config.load(), examples)
    assert without.first_problem() == (
        "first start: GET /docs: header Location: none, expected 'https://example.org/docs'"
    )


@pytest.mark.parametrize(
    ("sent", "expected", "problem"),
    [
        ([("Location", "/a")], {"location": "/a"}, ""),
        ([("location", "/a")], {"LoCaTiOn": "/a"}, ""),
        ([("Location", "/a"), ("Server", "x")], {"Location": "/a"}, ""),
        ([("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")], {"Set-Cookie": "b=2"}, ""),  # one of its values
        ([], {"Location": "/a"}, "header Location: none, expected '/a'"),
        ([("Location", "/a/")], {"Location": "/a"}, "header Location: '/a/', expected '/a'"),
        ([("Location", "/A")], {"Location": "/a"}, "header Location: '/A', expected '/a'"),
        ([("Location", "/a, /b")], {"Location": "/a"}, "header Location: '/a, /b', expected '/a'"),
        ([("X-Location", "/a")], {"Location": "/a"}, "header Location: none, expected '/a'"),
    ],
)
def test_header_names_compare_in_any_case_and_values_exactly(
    sent: list[tuple[str, str]], expected: dict[str, str], problem: str
) -> None:
    assert header_mismatch(httpx.Headers(sent), expected) == problem
