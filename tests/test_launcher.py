"""Every process flakebot starts goes through flakebot.launcher: no other module spawns one itself."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flakebot import launcher

PACKAGE = Path(__file__).resolve().parent.parent / "flakebot"
SUBPROCESS_SPAWNS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}
MODULE_SPAWNS = {
    "subprocess": SUBPROCESS_SPAWNS,
    "pty": {"spawn"},
    "multiprocessing": {"Process"},
    "anyio": {"run_process", "open_process"},
}
OS_SPAWNS = {"system", "popen", "posix_spawn", "posix_spawnp", "fork", "forkpty"}


def _is_spawn(module: str, name: str) -> bool:
    if module == "os":
        return name in OS_SPAWNS or name.startswith(("exec", "spawn"))
    if module == "asyncio":
        return name.startswith("create_subprocess")
    return name in MODULE_SPAWNS.get(module, set())


def spawns(source: str) -> list[str]:
    """'line: module.name' of every call that starts a process: module.name(...), or a name imported from such a
    module and called bare. Annotations (subprocess.Popen[bytes]) and exceptions are not calls, so not counted."""
    tree = ast.parse(source)
    imported = {  # from subprocess import run as r -> {'r': ('subprocess', 'run')}
        alias.asname or alias.name: (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    modules = {  # import subprocess as sp -> {'sp': 'subprocess'}
        alias.asname or alias.name: alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module = modules.get(func.value.id, func.value.id)
            if _is_spawn(module, func.attr):
                found.append(f"{node.lineno}: {module}.{func.attr}")
        elif isinstance(func, ast.Name) and func.id in imported and _is_spawn(*imported[func.id]):
            found.append(f"{node.lineno}: {'.'.join(imported[func.id])}")
    return found


def test_processes_are_started_only_through_the_launcher() -> None:
    raw = [
        f"{path.relative_to(PACKAGE)}:{where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "launcher.py"
        for where in spawns(path.read_text())
    ]
    assert raw == [], "start processes with flakebot.launcher.run/popen (its cwd, environment and interpreter)"


def test_the_launcher_itself_is_seen_spawning() -> None:
    """The scan finds the launcher's own calls: it would find a raw call anywhere else."""
    assert [line.split(": ")[1] for line in spawns((PACKAGE / "launcher.py").read_text())] == [
        "subprocess.run",
        "subprocess.Popen",
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import subprocess\nsubprocess.run(['x'])",
        "import subprocess as sp\nsp.Popen(['x'])",
        "from subprocess import check_output\ncheck_output(['x'])",
        "from subprocess import call as c\nc(['x'])",
        "import os\nos.execvp('x', ['x'])",
        "import os\nos.spawnlp(os.P_WAIT, 'x', 'x')",
        "import os\nos.system('x')",
        "import os\nos.popen('x')",
        "import os\nos.posix_spawn('x', ['x'], {})",
        "import asyncio\nasyncio.create_subprocess_exec('x')",
        "from asyncio import create_subprocess_shell\ncreate_subprocess_shell('x')",
        "import pty\npty.spawn('x')",
        "import anyio\nanyio.run_process(['x'])",
    ],
)
def test_the_scan_sees_each_kind_of_spawn(source: str) -> None:
    assert len(spawns(source)) == 1, source


def test_types_and_exceptions_are_not_spawns() -> None:
    source = (
        "import subprocess\n"
        "def f(p: subprocess.Popen[bytes]) -> subprocess.CompletedProcess[str]:\n"
        "    try:\n        pass\n    except subprocess.TimeoutExpired:\n        pass\n"
        "    return subprocess.CompletedProcess(['x'], 0)\n"
    )
    assert spawns(source) == []


def test_a_child_starts_in_flakebot_s_empty_directory_with_only_the_passed_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent.so")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-nix")
    shown = launcher.run(["sh", "-c", "pwd; env"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown[0] == launcher.neutral_dir() != str(tmp_path)
    assert os.listdir(launcher.neutral_dir()) == []
    names = {line.split("=", 1)[0] for line in shown[1:] if "=" in line}
    assert not names & {"PYTHONPATH", "LD_PRELOAD", "OPENAI_API_KEY"}
    assert "PATH" in names
    keyed = launcher.flakebot_env(keys=True)
    assert keyed["OPENAI_API_KEY"] == "sk-not-for-nix" and "PYTHONPATH" not in keyed
    assert "OPENAI_API_KEY" not in launcher.flakebot_env()


def test_a_python_child_imports_this_flakebot_whatever_its_cwd_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = tmp_path / "flakebot"
    planted.mkdir()
    (planted / "__init__.py").write_text(f"open({str(tmp_path / 'steered')!r}, 'w').close()\n")
    (tmp_path / "sitecustomize.py").write_text(f"open({str(tmp_path / 'steered')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONSTARTUP": str(tmp_path / "sitecustomize.py")}
    code = "import flakebot; print(flakebot.__file__); print(sys.argv[1:])"
    done = launcher.run(
        launcher.python_code(code, "a", "b"), cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [str(PACKAGE / "__init__.py"), "['a', 'b']"]
    assert not (tmp_path / "steered").exists()
    module = launcher.run(
        launcher.python_module("flakebot", "--version"), cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert module.returncode == 0, module.stderr
    assert not (tmp_path / "steered").exists()


def test_the_plain_interpreter_would_have_been_steered(tmp_path: Path) -> None:
    """The attack the launcher stops, seen working without it: `python -c` puts the cwd first on sys.path."""
    planted = tmp_path / "flakebot"
    planted.mkdir()
    (planted / "__init__.py").write_text("print('planted')\n")
    done = subprocess.run(  # the raw call is the point here
        [sys.executable, "-c", "import flakebot"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout == "planted\n"


def test_fds_puts_each_descriptor_at_its_number_whatever_sits_there_in_the_parent(tmp_path: Path) -> None:
    """The socket handoff's fd 3: the child finds our descriptor there, whether 3 is free here or another's, and a
    source sitting at another's target is not lost in the shuffle; pass_fds keep their own numbers."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_text("first")
    second.write_text("second")
    a, b = os.open(first, os.O_RDONLY), os.open(second, os.O_RDONLY)
    kept_r, kept_w = os.pipe()
    try:
        # b's content at 3 and a's at 4; a sits at a low number itself (maybe 3)
        script = "import os,sys; print(os.pread(3, 9, 0).decode(), os.pread(4, 9, 0).decode(), os.read(int(sys.argv[1]), 4).decode())"
        os.write(kept_w, b"kept")
        done = launcher.popen(
            [sys.executable, "-I", "-c", script, str(kept_r)], fds={3: b, 4: a}, pass_fds=(kept_r,),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        out, _ = done.communicate(timeout=30)
        assert done.returncode == 0
        assert out.split() == ["second", "first", "kept"]
        with pytest.raises(ValueError):
            launcher.popen(["true"], fds={kept_r: a}, pass_fds=(kept_r,))  # a kept number cannot also be a target
        with pytest.raises(ValueError):
            launcher.popen(["true"], fds={2: a})
    finally:
        for fd in (a, b, kept_r, kept_w):
            os.close(fd)


def test_flakebot_s_children_never_get_the_team_database_s_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """A front's detached job and a service's supervisor get flakebot's settings (FLAKEBOT_*), but not the team
    database's URL and its password (flakebot.team.dburl): no child talks to the database."""
    monkeypatch.setenv("FLAKEBOT_DATABASE_URL", "postgresql://flakebot:pw-of-the-team@db/flakebot")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "true")
    for env in (launcher.flakebot_env(), launcher.flakebot_env(keys=True)):
        shown = launcher.run(["sh", "-c", "env"], capture_output=True, text=True, check=True, env=env).stdout
        assert "FLAKEBOT_OFFLINE=true" in shown and "pw-of-the-team" not in shown, shown


# In a child of its own (a subreaper is a process-wide setting): the CPU-seconds of a shell loop run plainly, then
# the same loop run in the real bubblewrap sandbox, each as RUSAGE_CHILDREN counts it.
COUNTED = """
import json, resource, sys
from pathlib import Path
from flakebot import launcher
from flakebot.sandbox import open_sandbox

def children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime

if sys.argv[2] == "subreaper":
    assert launcher.become_subreaper()
loop = ["sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done"]
ws = Path(sys.argv[1])
before = children()
launcher.run(loop, check=True)
plain = children() - before
sandbox = open_sandbox("required", workspace=ws, writable=[ws], timeout=120)
before = children()
assert sandbox.run(loop, cwd=ws).returncode == 0
reaped = launcher.reap_orphans()
print(json.dumps({"plain": plain, "sandboxed": children() - before, "reaped": reaped}))
"""


@pytest.mark.parametrize("mode", ["subreaper", "plain"])
def test_a_subreaper_counts_the_cpu_of_a_sandboxed_command(tmp_path: Path, mode: str) -> None:
    """bubblewrap's monitor exits without waiting for the sandbox's init, which the machine's init then reaps: the
    CPU-seconds of everything the command ran reach no RUSAGE_CHILDREN of ours (a worker counted ~40% of a craft's
    CPU as nobody's). A subreaper that reaps its orphans counts them."""
    done = launcher.run(launcher.python_code(COUNTED, str(tmp_path), mode), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = json.loads(done.stdout.splitlines()[-1])
    assert counted["plain"] > 0.1  # the loop spends enough CPU for the comparison to mean something
    if mode == "subreaper":
        assert counted["reaped"] >= 1 and counted["sandboxed"] >= 0.7 * counted["plain"]
    else:  # what the worker counted before: the sandboxed loop's CPU missing
        assert counted["reaped"] == 0 and counted["sandboxed"] < 0.3 * counted["plain"]
