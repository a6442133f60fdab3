"""A caller grants a tool only what lies beneath a root the user allowed (issue 41: grants as an allow list).

The attack: a harmless "save stdin to a file" tool (it also marks what it wrote executable) granted a directory some
program reads configuration from; over MCP it wrote a nix.conf with a post-build-hook and the hook itself, and the
next `nix build` ran it as root. Every case goes through the real `flakebot run` or `flakebot mcp` (the MCP SDK's
client over stdio) and is judged from outside: what is on the host afterwards. Real configuration directories
(/etc/nix, /etc/cron.d, ...) are named as they are: the fix refuses them before anything is written, and the probe
a regression would let through is a name nothing there reads, removed after the test."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from tests.conftest import REPO, require, run_cli
from tests.deliver.test_tool_writes import tool

HOOK = "#!/bin/sh\necho pwned > /tmp/flakebot-grant-hook-ran\n"
# The file name each attack tries to make: one cron, apt and run-parts skip (a '~'), not nix.conf and no unit or
# profile.d suffix, so if a regression lets an attack through, the real /etc it lands in still reads nothing new.
PROBE = "flakebot-grant-probe~"
SYSTEM_CONFIG = ["/etc/nix", "/etc/cron.d", "/etc/systemd/system", "/etc/profile.d", "/etc/apt/apt.conf.d"]
SAVE = 'cat > "$1"; chmod +x "$1"\n'  # save stdin to the file $1, executable, as the tool did


@pytest.fixture
def outside() -> Iterator[Path]:
    """Outside /tmp (the sandbox's /tmp is private) and outside the test's home: a stand-in user's world."""
    (REPO / "scratch").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / "scratch", prefix="grants-") as directory:
        yield Path(directory)


@pytest.fixture
def caller(outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The directory flakebot starts in (the default grant root), beside a directory outside it; `save` catalogued.
    Afterwards any probe a regression let through into the real /etc is removed (the test has failed by then)."""
    work = outside / "caller"
    (work / "out").mkdir(parents=True)
    (outside / "elsewhere").mkdir()
    monkeypatch.chdir(work)
    tool(tmp_path, "save", SAVE)
    yield work
    for directory in SYSTEM_CONFIG:
        Path(directory, PROBE).unlink(missing_ok=True)


def save(target: str, *options: str, env: dict[str, str] | None = None) -> Any:
    """`flakebot run save --writable TARGET -- TARGET/PROBE` with the hook as stdin."""
    return run_cli("run", "save", *options, "--writable", target, "--", f"{target}/{PROBE}", input=HOOK, env=env)


def refused(ran: Any, says: str) -> bool:
    """Exit 2, one line naming the setting and the fix, no traceback."""
    lines = ran.stderr.strip().splitlines()
    return (
        ran.returncode == 2
        and len(lines) == 1
        and says in ran.stderr
        and "grant_roots" in ran.stderr
        and "--grant-root DIR" in ran.stderr
    )


@pytest.mark.parametrize("directory", SYSTEM_CONFIG)
def test_a_system_configuration_directory_cannot_be_granted(caller: Path, directory: str) -> None:
    require("bwrap")
    before = sorted(os.listdir(directory))
    ran = save(directory)
    assert refused(ran, "outside every grant root"), ran.stderr
    assert sorted(os.listdir(directory)) == before and not os.path.lexists(f"{directory}/{PROBE}")
    # nor made a root: /etc and / are configuration, whatever the flag says
    for root in (directory, "/etc", "/"):
        widened = save(directory, "--grant-root", root)
        assert refused(widened, "a directory programs read configuration from"), (root, widened.stderr)
    assert sorted(os.listdir(directory)) == before


def test_home_configuration_and_flakebots_own_directories_cannot_be_granted(caller: Path, outside: Path) -> None:
    """~/.config/git, the home itself, flakebot's own config dir: refused as paths and as roots."""
    require("bwrap")
    home = outside / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / "projects").mkdir()
    env = {"HOME": str(home)}
    own = config.config_home()
    own.mkdir(parents=True, exist_ok=True)
    for target in (home / ".config" / "git", home, own):
        assert refused(save(str(target), env=env), "outside every grant root"), target
        for root in (target, target.parent):
            widened = save(str(target), "--grant-root", str(root), env=env)
            assert widened.returncode == 2 and "refused: it" in widened.stderr, (target, root, widened.stderr)
    assert not list(home.rglob(PROBE)) and not list(own.rglob(PROBE))
    # a directory in the home that is not a dot directory is a fine root
    allowed = save(str(home / "projects"), "--grant-root", str(home / "projects"), env=env)
    assert allowed.returncode == 0 and (home / "projects" / PROBE).read_text() == HOOK, allowed.stderr


def test_links_and_dot_dots_out_of_the_root_are_refused(caller: Path, outside: Path) -> None:
    require("bwrap")
    (caller / "cron").symlink_to("/etc/cron.d")
    (caller / "out" / "away").symlink_to(outside / "elsewhere")
    for target in ("cron", "out/away", "..", "../elsewhere", "out/../../elsewhere", str(caller / ".." / "elsewhere")):
        ran = save(target)
        assert refused(ran, "outside every grant root"), (target, ran.stderr)
    assert not os.path.lexists(f"/etc/cron.d/{PROBE}") and list((outside / "elsewhere").iterdir()) == []


def test_a_grant_beneath_the_root_lands_as_data_never_executable(caller: Path) -> None:
    require("bwrap")
    ran = save("out")
    assert ran.returncode == 0, ran.stderr
    written = caller / "out" / PROBE
    assert written.read_text() == HOOK and written.stat().st_mode & 0o111 == 0  # the tool's chmod +x did not land
    # a file that was executable keeps its mode: the tool rewrites its content, not its permissions
    written.write_text("old\n")
    written.chmod(0o755)
    again = save("out")  # its chmod of a file it did not make fails (exit 1); what it wrote is copied back
    assert written.read_text() == HOOK and written.stat().st_mode & 0o777 == 0o755, again.stderr


def test_the_user_widens_the_roots_a_working_directory_file_cannot(caller: Path, outside: Path) -> None:
    require("bwrap")
    elsewhere = str(outside / "elsewhere")
    assert refused(save(elsewhere), "outside every grant root")
    flagged = save(elsewhere, "--grant-root", elsewhere)
    assert flagged.returncode == 0 and (outside / "elsewhere" / PROBE).is_file(), flagged.stderr
    (outside / "elsewhere" / PROBE).unlink()
    by_env = save(elsewhere, env={"FLAKEBOT_GRANT_ROOTS": f".{os.pathsep}{elsewhere}"})
    assert by_env.returncode == 0 and (outside / "elsewhere" / PROBE).is_file(), by_env.stderr
    (outside / "elsewhere" / PROBE).unlink()
    # a working directory's flakebot.toml (a repository's, or one a tool wrote) may not set it
    (caller / "flakebot.toml").write_text(f'grant_roots = [".", "{elsewhere}"]\n')
    planted = save(elsewhere)
    assert planted.returncode == 3 and "decides what flakebot trusts" in planted.stderr, planted.stderr
    assert not (outside / "elsewhere" / PROBE).exists()
    (caller / "flakebot.toml").unlink()
    # the user's own file may; an empty list grants nothing, not even here
    run_cli("config", "set", "grant_roots", elsewhere, check=True)
    assert save(elsewhere).returncode == 0 and refused(save("out"), "outside every grant root")


@pytest.mark.parametrize("start", ["home", "/"])
def test_a_configuration_directory_started_in_is_no_root(caller: Path, outside: Path, start: str) -> None:
    """Started in $HOME or /, there is no default root: `--writable .` grants nothing rather than everything."""
    require("bwrap")
    home = outside / "home"
    home.mkdir()
    where = home if start == "home" else Path("/")
    os.chdir(where)
    try:
        ran = save(".", env={"HOME": str(home)})
        assert refused(ran, "refused: it"), ran.stderr
        assert not (where / PROBE).exists()
    finally:
        (where / PROBE).unlink(missing_ok=True)


# ---------------------------------------------------------------- over MCP, judged from outside


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def mcp_session(calls: list[tuple[str, dict[str, Any]]], *server_args: str) -> list[dict[str, Any]]:
    """Start `flakebot mcp SERVER_ARGS` in the working directory, make the calls, return each answer (or the error)."""
    return asyncio.run(_session(calls, list(server_args)))


async def _session(calls: list[tuple[str, dict[str, Any]]], server_args: list[str]) -> list[dict[str, Any]]:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    argv = ["-m", "flakebot", "mcp", *server_args]
    params = StdioServerParameters(command=sys.executable, args=argv, env=dict(os.environ), cwd=os.getcwd())
    answers = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for name, arguments in calls:
            result = await session.call_tool(name, arguments)
            text = result.content[0].text if result.content else ""
            try:
                answer = json.loads(text)
            except json.JSONDecodeError:  # the SDK's own refusal (a schema check), not flakebot's error object
                answer = {"ok": False, "error": text}
            answers.append({"isError": result.is_error, **answer})
    return answers


def test_an_mcp_caller_grants_only_beneath_the_servers_start_directory(caller: Path, outside: Path) -> None:
    require("bwrap")
    elsewhere = str(outside / "elsewhere")
    attempts = [
        ("run", {"tool": "save", "args": [f"/etc/nix/{PROBE}"], "stdin": "post-build-hook = /etc/nix/hook\n",
                 "writable": ["/etc/nix"]}),
        ("run", {"tool": "save", "args": [f"{elsewhere}/{PROBE}"], "stdin": HOOK, "writable": [elsewhere]}),
        ("run", {"tool": "save", "args": [f"../elsewhere/{PROBE}"], "stdin": HOOK, "writable": ["../elsewhere"]}),
        # arguments that try to widen the roots themselves
        ("run", {"tool": "save", "args": [f"{elsewhere}/{PROBE}"], "stdin": HOOK, "writable": [elsewhere],
                 "grant_roots": [elsewhere], "grant_root": elsewhere}),
        ("save", {"stdin": HOOK, "writable": [elsewhere], "grant_roots": [elsewhere]}),
        ("run", {"tool": "save", "args": [f"out/{PROBE}"], "stdin": HOOK, "writable": ["out"]}),
    ]  # fmt: skip
    nix_before = _snapshot(Path("/etc/nix"))
    answers = mcp_session(attempts)
    for answer in answers[:5]:
        assert answer["isError"] and answer["ok"] is False, answer
    assert all("outside every grant root" in a["error"] for a in answers[:3]), answers
    assert "run takes no argument grant_root, grant_roots" in answers[3]["error"]  # refused as arguments it lacks
    assert _snapshot(Path("/etc/nix")) == nix_before and list((outside / "elsewhere").iterdir()) == []
    assert not answers[5]["isError"] and (caller / "out" / PROBE).read_text() == HOOK, answers[5]
    assert (caller / "out" / PROBE).stat().st_mode & 0o111 == 0
    # the user who starts the server widens the roots; /etc stays refused even then, before the server starts
    etc = run_cli("mcp", "--grant-root", elsewhere, "--grant-root", "/etc/nix", input="")
    assert refused(etc, "refused: it is, holds or lies in /etc"), etc.stderr
    for door in ("mcp", "serve"):  # a root that is no directory: refused before a host or agent is answered
        missing = run_cli(door, "--grant-root", str(outside / "nowhere"), input="")
        assert refused(missing, "refused: it is not an existing directory"), (door, missing.stderr)
    widened = mcp_session(attempts[:2], "--grant-root", elsewhere)
    assert widened[0]["isError"] and "outside every grant root" in widened[0]["error"], widened
    assert not widened[1]["isError"] and (outside / "elsewhere" / PROBE).read_text() == HOOK, widened


@pytest.mark.parametrize(
    ("root", "refused_as"),
    [
        ("/", "/etc"),
        ("/etc", "/etc"),
        ("/etc/nix", "/etc"),
        ("/var", "/var/lib"),
        ("/usr/local", "/usr"),
        ("/nix/store", "/nix"),
        ("HOME", "HOME"),  # it is a home, and holds ~/.cargo
        ("HOME/.config", "a home's configuration"),
        ("HOME/.ssh/keys", "a home's configuration"),
        ("OWN", "a directory programs read configuration from"),
        ("OUTSIDE/repo/.git", "read as configuration by git"),
        ("HOME/projects", ""),
        ("OUTSIDE/repo", ""),
    ],
)
def test_which_directories_can_be_roots(
    outside: Path, monkeypatch: pytest.MonkeyPatch, root: str, refused_as: str
) -> None:
    """The rule on real directories: a root may not be, hold or lie in configuration; data directories may."""
    from flakebot.deliver import grants

    home = outside / "home"
    monkeypatch.setenv("HOME", str(home))
    grants._homes.cache_clear()
    for made in ("projects", ".config", ".ssh/keys"):
        (home / made).mkdir(parents=True)
    (outside / "repo" / ".git").mkdir(parents=True)
    settings = config.load()
    named = root.replace("HOME", str(home)).replace("OWN", str(config.config_home())).replace("OUTSIDE", str(outside))
    why = grants.root_refusal(Path(os.path.realpath(named)), settings)
    expected = refused_as.replace("HOME", str(home))
    assert (expected in why) if expected else why == "", why
    grants._homes.cache_clear()


def test_a_directory_swapped_for_a_link_out_during_the_run_is_not_written_through(
    caller: Path, outside: Path, tmp_path: Path
) -> None:
    """Checked, then swapped: while the tool runs, `out` (between the root and the granted out/sub) becomes a link to
    a directory outside. The copy-back opens the host side at the root and follows no link below it."""
    import subprocess
    import time

    require("bwrap")
    (caller / "out" / "sub").mkdir()
    (outside / "victim" / "sub").mkdir(parents=True)
    tool(tmp_path, "slow", "sleep 4; echo tool > out/sub/new.txt\n")
    started = subprocess.Popen(
        [sys.executable, "-m", "flakebot", "run", "slow", "--writable", "out/sub"],
        cwd=caller, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2)  # checked and copied; the tool sleeps
    (caller / "out").rename(caller / "out-moved")
    (caller / "out").symlink_to(outside / "victim")
    _, stderr = started.communicate(timeout=60)
    assert not (outside / "victim" / "sub" / "new.txt").exists(), stderr
    assert "not copied back" in stderr and "link or another kind of file in its way" in " ".join(stderr.split())


@pytest.fixture
def mounted(caller: Path) -> Iterator[Path]:
    """caller/out/cron: a bind mount of /etc/cron.d beneath the default root (a mount only root makes, as a container
    or a user's fstab does); unmounted afterwards. Skipped where this process cannot mount."""
    point = caller / "out" / "cron"
    point.mkdir()
    if subprocess.run(["mount", "--bind", "/etc/cron.d", str(point)], capture_output=True).returncode != 0:
        pytest.skip("cannot make a bind mount here")
    try:
        yield point
    finally:
        subprocess.run(["umount", str(point)], capture_output=True, check=False)
        Path("/etc/cron.d", PROBE).unlink(missing_ok=True)


def test_a_mount_beneath_the_root_is_another_tree_not_the_roots(caller: Path, mounted: Path) -> None:
    """A path beneath the root that crosses a mount point names the mounted tree (here /etc/cron.d), whatever its
    spelling: neither it, nor a directory holding it, is granted; nothing lands in /etc/cron.d."""
    require("bwrap")
    before = sorted(os.listdir("/etc/cron.d"))
    for target in ("out/cron", "out"):
        ran = (
            save(target)
            if target != "out"
            else run_cli("run", "save", "--writable", "out", "--", f"out/cron/{PROBE}", input=HOOK)
        )
        assert sorted(os.listdir("/etc/cron.d")) == before and not os.path.lexists(f"/etc/cron.d/{PROBE}"), target
        assert ran.returncode == 2 and "mount" in ran.stderr, (target, ran.stderr)
    # a path beside the mount is still granted
    beside = save(".")
    assert beside.returncode == 2 and "holds the mount point" in beside.stderr, beside.stderr  # `.` holds it too
    (caller / "data").mkdir()
    fine = save("data")
    assert fine.returncode == 0 and (caller / "data" / PROBE).is_file(), fine.stderr


@pytest.mark.parametrize(
    "target",
    ["//etc/cron.d", "/etc/cron.d/", "/etc//cron.d", "/proc/self/root/etc/cron.d", "/proc/self/cwd/../elsewhere"],
)
def test_other_spellings_of_a_path_outside_the_roots_are_refused(caller: Path, target: str) -> None:
    """A doubled slash (POSIX's implementation-defined `//`), a trailing slash, /proc/self/root and /proc/self/cwd:
    the grant resolves them all to the one directory they name."""
    require("bwrap")
    ran = save(target)
    assert refused(ran, "outside every grant root"), (target, ran.stderr)
    for root in ("//etc", "/proc/self/root/etc", "/etc/", "/proc/self/cwd/../../../../../../../../etc"):
        widened = save(target, "--grant-root", root)
        assert widened.returncode == 2 and "refused" in widened.stderr, (target, root, widened.stderr)
    assert not os.path.lexists(f"/etc/cron.d/{PROBE}")


@pytest.mark.usefixtures("flakebot_home")
def test_a_grant_root_the_system_cannot_even_look_up_is_refused_in_one_line() -> None:
    """A --grant-root too long for the kernel (ENAMETOOLONG) or naming a user who does not exist (~nobody-here) is
    refused as any other unusable root, one line, not an OSError or RuntimeError traceback."""
    for root, says in (
        ("a" * 5000, "cannot be looked up"),
        ("a/" * 3000, "cannot be looked up"),
        ("~no-such-user-here/x", "cannot be looked up"),
    ):
        for door in ("mcp", "run"):
            argv = ["mcp", "--grant-root", root] if door == "mcp" else ["run", "t", "--grant-root", root, "--", "x"]
            ran = run_cli(*argv, input="")
            assert refused(ran, says), (door, root[:20], ran.stderr[-400:])


def test_a_grant_roots_setting_the_system_cannot_look_up_is_a_refused_root_not_a_traceback(
    flakebot_home: Path,
) -> None:
    """The grant_roots setting (here FLAKEBOT_GRANT_ROOTS) holding a name too long for the kernel or ~no-such-user:
    a call that asks to write is refused in one line naming that root, not an OSError/RuntimeError traceback."""
    from benchmarks.scenarios.many_tools import Tools, store_path

    Tools(flakebot_home, store_path(flakebot_home, nix=False)).grow(1)
    (flakebot_home / "out").mkdir()
    for root in ("c" * 5000, "~no-such-user-here/x"):
        ran = run_cli("run", "t00001", "--writable", str(flakebot_home / "out"), "--", "x",
                      env={"FLAKEBOT_GRANT_ROOTS": root})  # fmt: skip
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr[-400:]
        [line] = ran.stderr.strip().splitlines()
        assert "cannot be looked up" in line, line
