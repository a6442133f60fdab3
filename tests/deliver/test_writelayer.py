"""What a tool does to its staged copy cannot make flakebot remove the caller's files it never saw.

A directory of the copy the tool made unreadable cannot be listed on copy-back; its files must not count as
removed by the tool. Run as an ordinary user (as root every directory is readable): a child process as `nobody`
when the suite runs as root. Judged from outside: the caller's file is still there, and the warning names it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PROBE = """
import json, os, sys
from pathlib import Path
from flakebot.deliver import writelayer
host, staging = Path(sys.argv[1]), Path(sys.argv[2])
layer = writelayer.stage(host, staging, 0, 10**7)
os.chmod(layer.stage / "keep", 0)  # what the tool did to its copy
try:
    print(json.dumps(writelayer.copy_back(layer, 10**7)))
finally:
    os.chmod(layer.stage / "keep", 0o755)
"""


def test_a_directory_the_tool_made_unreadable_removes_nothing_on_the_host(tmp_path: Path) -> None:
    host = tmp_path / "host"
    (host / "keep").mkdir(parents=True)
    (host / "keep" / "mine.txt").write_text("the caller's\n")
    (tmp_path / "staging").mkdir()
    argv = [sys.executable, "-c", PROBE, str(host), str(tmp_path / "staging")]
    if os.geteuid() == 0:  # as root every directory is readable: drop the capabilities that make it so
        drop = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert (host / "keep" / "mine.txt").read_text() == "the caller's\n", "a file the tool never removed is gone"
    assert ["keep", "the tool made it unreadable"] in json.loads(done.stdout)
