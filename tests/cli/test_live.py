"""The CLI's live progress (flakebot.cli.live) as a person's terminal shows it: rich's live table, drawn as on a
terminal (FORCE_COLOR), read from the real CLI's stderr."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from flakebot.llm.stub_server import StubServer
from flakebot.pipeline.heartbeat import HEARTBEAT_SECONDS


def test_the_live_line_says_it_waits_on_the_model_at_once_and_ticks_each_second(flakebot_home: Path) -> None:
    """A model reply of 4 s (the chat-completions stub through the real openai SDK): the spec row says it waits on
    the model's reply from the start and counts the seconds, long before the first heartbeat (HEARTBEAT_SECONDS)."""
    slow = [{"fault": {"kind": "slow", "seconds": 4}, "content": "no spec here"}]
    with StubServer(slow) as server:
        env = {**os.environ, "OPENAI_API_KEY": "k", "OPENAI_BASE_URL": server.openai_url, "FORCE_COLOR": "1",
               "COLUMNS": "120", "TERM": "xterm"}  # fmt: skip
        argv = ["craft", "need a CSV deduper", "--model", "openai:stub-model", "--registry", "local"]
        done = subprocess.run(
            [sys.executable, "-m", "flakebot", *argv, "--stop-after", "spec"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stderr)
    ticks = {
        int(s) for s in re.findall(r"spec +[\d.]+s +waiting on the model's reply \(stub-model\) \((\d+) s\)", drawn)
    }
    assert {0, 1, 2, 3} <= ticks, drawn[-3000:]
    assert HEARTBEAT_SECONDS > 4  # so none of it came from a heartbeat event
