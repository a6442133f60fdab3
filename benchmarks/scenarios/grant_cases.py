"""Attacks on a tool's grants (issue 41): a caller names a directory some program reads configuration from as a
tool's writable path, or tries to widen the grant roots itself. Each runs the real `flakebot run` (or `flakebot mcp`
through the MCP SDK's client over stdio) in a child process, from a start directory inside the case, with a "save
stdin to a file" tool; hostfile_cases.py counts them as the door "tool grants", judged from outside: contained only
when flakebot refused (exit 2, one line naming grant_roots) and nothing landed outside the start directory.

Real system directories (/etc/nix, /etc/cron.d, ...) are named as they are: the probe a regression would let through
is a name nothing there reads (a '~', which cron, apt and run-parts skip), removed at once and recorded as a breach.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

PROBE = "flakebot-grant-probe~"
HOOK = "#!/bin/sh\necho pwned\n"
SAVE = '#!/bin/sh\ncat > "$1"; chmod +x "$1"\n'


class Case(Protocol):
    """What a grant attack gets of hostfile_cases.World."""

    root: Path

    @property
    def outside(self) -> Path: ...


def _catalogue_save(root: Path) -> None:
    """The `save` tool in this case's catalog (its directory stands in for the store path)."""
    from flakebot import config
    from flakebot.deliver.catalog import Catalog

    store = root / "store"
    (store / "bin").mkdir(parents=True)
    (store / "bin" / "save").write_text(SAVE)
    (store / "bin" / "save").chmod(0o755)
    (root / "flake").mkdir()
    manifest = {"name": "save", "main_program": "save", "store_path": str(store), "nix_run_argv": ["nix", "run", "x"]}
    Catalog.open(config.load()).add(
        "save", need="save stdin to a file", flake_dir=root / "flake", manifest=manifest, usage_md="# save\n",
        store_path=str(store), run_id="r1", origin={},
    )  # fmt: skip


def _start(w: Case) -> Path:
    start = w.root / "start"
    (start / "out").mkdir(parents=True)
    _catalogue_save(w.root)
    return start


def _judged(w: Case, target: Path, code: int, said: str) -> str:
    """What flakebot said; a probe that landed is removed and recorded outside (the case is then a breach)."""
    probe = target / PROBE
    if os.path.lexists(probe):
        probe.unlink()
        (w.outside / "probe-landed").write_text(str(probe))
    if code != 2 or "grant_roots" not in said:
        (w.outside / "not-refused").write_text(f"exit {code}: {said}")
    return f"refused: {said.removeprefix('error: ').split('. Fix:')[0]}" if code == 2 else said


def _cli(w: Case, target: Path, *options: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    start = _start(w)
    argv = [sys.executable, "-m", "flakebot", "run", "save", *options, "--writable", str(target), "--",
            str(target / PROBE)]  # fmt: skip
    done = subprocess.run(argv, input=HOOK, text=True, capture_output=True, cwd=cwd or start,
                          env={**os.environ, **(env or {})}, timeout=120)  # fmt: skip
    return _judged(w, target, done.returncode, done.stderr.strip())


def system_dir(directory: str) -> Callable[[Case], str]:
    def attack(w: Case) -> str:
        return _cli(w, Path(directory))

    return attack


def system_dir_as_root(w: Case) -> str:
    return _cli(w, Path("/etc/cron.d"), "--grant-root", "/etc")


def home_config(w: Case) -> str:
    home = w.root / "home"
    (home / ".config" / "git").mkdir(parents=True)
    return _cli(w, home / ".config" / "git", "--grant-root", str(home / ".config"), env={"HOME": str(home)})


def own_config(w: Case) -> str:
    from flakebot import config

    own = config.config_home()
    own.mkdir(parents=True, exist_ok=True)
    return _cli(w, own, "--grant-root", str(own))


def link_out(w: Case) -> str:
    start = w.root / "start"
    start.mkdir()
    (start / "away").symlink_to(w.outside)
    argv = [sys.executable, "-m", "flakebot", "run", "save", "--writable", "away", "--", f"away/{PROBE}"]
    _catalogue_save(w.root)
    done = subprocess.run(argv, input=HOOK, text=True, capture_output=True, cwd=start, timeout=120)
    return _judged(w, w.outside, done.returncode, done.stderr.strip())


def dot_dot(w: Case) -> str:
    return _cli(w, w.root / "start" / "out" / ".." / ".." / "outside")


def started_in_home(w: Case) -> str:
    home = w.root / "home"
    home.mkdir()
    _start(w)
    argv = [sys.executable, "-m", "flakebot", "run", "save", "--writable", ".", "--", PROBE]
    done = subprocess.run(argv, input=HOOK, text=True, capture_output=True, cwd=home,
                          env={**os.environ, "HOME": str(home)}, timeout=120)  # fmt: skip
    if os.path.lexists(home / PROBE):  # the home is outside the start directory: a landed probe is a breach
        (w.outside / "probe-landed").write_text(str(home / PROBE))
    return _judged(w, home, done.returncode, done.stderr.strip())


def local_toml(w: Case) -> str:
    start = _start(w)
    (start / "flakebot.toml").write_text(f'grant_roots = [".", "{w.outside}"]\n')
    argv = [sys.executable, "-m", "flakebot", "run", "save", "--writable", str(w.outside), "--",
            str(w.outside / PROBE)]  # fmt: skip
    done = subprocess.run(argv, input=HOOK, text=True, capture_output=True, cwd=start, timeout=120)
    said = done.stderr.strip()
    if done.returncode != 3 or "decides what flakebot trusts" not in said:
        (w.outside / "not-refused").write_text(f"exit {done.returncode}: {said}")
    return f"refused: {said.removeprefix('error: ').split(' (a repository')[0]}"


def _mcp(start: Path, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    async def call() -> dict[str, Any]:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        params = StdioServerParameters(command=sys.executable, args=["-m", "flakebot", "mcp"], env=dict(os.environ),
                                       cwd=str(start))  # fmt: skip
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(name, arguments)
            text = str(getattr(result.content[0], "text", "")) if result.content else ""
            try:
                return dict(json.loads(text))
            except json.JSONDecodeError:
                return {"ok": False, "error": text}

    return asyncio.run(call())


def mcp_writable(widen: bool) -> Callable[[Case], str]:
    def attack(w: Case) -> str:
        start = _start(w)
        arguments = {"tool": "save", "args": [str(w.outside / PROBE)], "stdin": HOOK, "writable": [str(w.outside)]}
        extra = {"grant_roots": [str(w.outside)], "grant_root": str(w.outside)} if widen else {}
        answer = _mcp(start, "run", {**arguments, **extra})
        said = str(answer.get("error") or answer)
        return _judged(w, w.outside, 2 if answer.get("ok") is False else 0, said)

    return attack


# (name, attempt, expected, attack): hostfile_cases.py makes each a Case of the door "tool grants".
REFUSED = "refused before the tool runs, one line naming grant_roots; nothing written"
GRANT_ATTACKS: list[tuple[str, str, str, Callable[[Case], str]]] = [
    ("grant-etc-nix", "a save-stdin tool granted /etc/nix (nix.conf, a post-build-hook)", REFUSED,
     system_dir("/etc/nix")),
    ("grant-etc-cron", "granted /etc/cron.d", REFUSED, system_dir("/etc/cron.d")),
    ("grant-etc-systemd", "granted /etc/systemd/system", REFUSED, system_dir("/etc/systemd/system")),
    ("grant-etc-profile", "granted /etc/profile.d", REFUSED, system_dir("/etc/profile.d")),
    ("grant-etc-apt", "granted /etc/apt/apt.conf.d", REFUSED, system_dir("/etc/apt/apt.conf.d")),
    ("grant-root-etc", "granted /etc/cron.d with --grant-root /etc", "the root refused: /etc is configuration",
     system_dir_as_root),
    ("grant-home-config", "granted ~/.config/git with --grant-root ~/.config", "the root refused: a home's dot directory",
     home_config),
    ("grant-own-config", "granted flakebot's own config dir, and as --grant-root", "the root refused: flakebot's own",
     own_config),
    ("grant-link-out", "granted a link inside the start directory pointing outside it", REFUSED, link_out),
    ("grant-dot-dot", "granted out/../../outside", REFUSED, dot_dot),
    ("grant-started-in-home", "started in $HOME, granted '.'", "no default root: the home is configuration",
     started_in_home),
    ("grant-local-toml", "a working directory's flakebot.toml sets grant_roots to a directory outside",
     "the file refused (exit 3): grant_roots is trusted", local_toml),
    ("grant-mcp-writable", "an MCP run call's writable names a directory outside the server's start directory",
     REFUSED, mcp_writable(widen=False)),
    ("grant-mcp-argument", "an MCP run call also passes grant_roots and grant_root arguments naming it", REFUSED,
     mcp_writable(widen=True)),
]  # fmt: skip
