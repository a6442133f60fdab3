"""A catalogued tool is model-written code: `flakebot run`, `run --json` and the MCP server run it in the sandbox.

The tool here is a shell script standing in for a crafted binary (catalogued with its directory as the store
path), so the test is about the run, not the build: what it may read and write, and what it never sees."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog
from flakebot.deliver.toolrun import named_paths
from tests.conftest import REPO, require, run_cli
from tests.fakes.mcp_call import mcp_call

KEY = "gsk_" + "q" * 40  # shaped like a Groq key: present in flakebot's environment, never in the tool's


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory outside /tmp (whose sandbox view is a private tmpfs anyway) and outside the working directory."""
    (REPO / "scratch").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / "scratch", prefix="toolrun-") as directory:
        yield Path(directory)


@pytest.fixture
def peek(tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Catalogue `peek`, a tool that reports what it can read, write and see; returns its working directory."""
    (outside / "secret.txt").write_text("the secret\n")
    (outside / "named.txt").write_text("named content\n")
    (outside / "elsewhere").mkdir()
    store = tmp_path / "store"
    (store / "bin").mkdir(parents=True)
    script = store / "bin" / "peek"
    script.write_text(
        "#!/bin/sh\n"
        'read line; echo "stdin: $line"\n'
        'echo "named: $(cat "$1" 2>&1)"\n'
        f'echo "secret: $(cat {outside}/secret.txt 2>&1)"\n'
        'echo "key: ${GROQ_API_KEY:-none}"\n'
        "echo made > made-here.txt\n"
        f'(echo escaped > {outside}/elsewhere/escaped.txt) 2>/dev/null || echo "outside: refused"\n'
    )
    script.chmod(0o755)
    (tmp_path / "flake").mkdir()
    manifest = {"name": "peek", "main_program": "peek", "store_path": str(store), "nix_run_argv": ["nix", "run", "x"]}
    Catalog.open(config.load()).add(
        "peek", need="peek around", flake_dir=tmp_path / "flake", manifest=manifest, usage_md="",
        store_path=str(store), run_id="r1", origin={},
    )  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_a_tool_runs_sandboxed_from_the_cli_and_over_mcp(peek: Path, outside: Path) -> None:
    require("bwrap")
    named = str(outside / "named.txt")
    ran = run_cli("run", "peek", "--", named, input="hello\n", env={"GROQ_API_KEY": KEY})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        "stdin: hello",
        "named: named content",  # a path its arguments name is readable
        f"secret: cat: {outside}/secret.txt: No such file or directory",  # nothing else outside the directory is
        "key: none",  # flakebot's environment does not reach it
        "outside: refused",
    ]
    assert (peek / "made-here.txt").read_text() == "made\n"  # the working directory is writable
    assert not (outside / "elsewhere" / "escaped.txt").exists()

    captured = run_cli("run", "peek", "--json", "--", named, input="hi\n", env={"GROQ_API_KEY": KEY})
    call = json.loads(captured.stdout.splitlines()[-1])["result"]
    assert call["exit_code"] == 0 and call["stdout"].splitlines()[:4] == [
        "stdin: hi",
        "named: named content",
        f"secret: cat: {outside}/secret.txt: No such file or directory",
        "key: none",
    ]
    # The contrast: with the sandbox off by request, the same tool reads the secret and sees the key.
    unsafe = run_cli("run", "peek", "--sandbox", "off", "--", named, input="x\n", env={"GROQ_API_KEY": KEY})
    assert "secret: the secret" in unsafe.stdout and "sandbox off" in unsafe.stderr
    by_mcp = mcp_call("run", {"tool": "peek", "args": [named], "stdin": "x\n"})
    assert (
        by_mcp["ok"] is True
        and by_mcp["exit_code"] == 0
        and "secret: cat:" in by_mcp["stdout"]
        and "named: named content" in by_mcp["stdout"]
    )


def test_the_paths_an_argument_names_outside_the_directory(tmp_path: Path) -> None:
    work, other = tmp_path / "work", tmp_path / "other.csv"
    work.mkdir()
    (work / "inside.csv").write_text("")
    other.write_text("")
    assert named_paths(["--key", "id", "inside.csv", "../other.csv", f"--in={other}", "missing.csv"], work) == [
        other.resolve(),
        other.resolve(),
    ]
