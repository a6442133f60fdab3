"""P11-P13: calling crafted tools. `flakebot mcp` start-up (initialize + tools/list), one MCP tool call, and
`flakebot run TOOL`, each measured beside the bare binary in the same run.

The tool is a small binary (coreutils' echo) catalogued as a crafted tool, so the figures are flakebot's own cost:
the sandbox (bubblewrap, prlimit, setpriv), the catalog and the protocol. The MCP client speaks JSON-RPC over
the server's pipes directly, so no client library's cost is counted. Rounds are interleaved (each round runs
every measure once) so a burst of other work on the shared machine hits them alike; medians are the figures.
P11 ends at the tools/list answer, and the `initialize` answer (given at once from flakebot's cache, before the SDK is
imported: flakebot.mcp.start) is timed on the way, each beside `python -c pass` and with its spread; the time until the server's process ended after the client closed its stdin
(a client that starts a server per call waits for that) is measured beside it. What the SDK's own import costs is
measured beside start-up: whole (`import mcp.server.lowlevel, mcp.server.stdio`) and as the server imports it
(flakebot.mcp.server.load_sdk: the low-level server without the package's client, then gc.freeze as `flakebot mcp`
does).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOL = "hi"
START_GOAL_S = 0.25  # spawn to the tools/list answer
INITIALIZE_GOAL_S = 0.3  # spawn to the initialize answer, over `python -c pass` in the same run (hosts wait about 1 s)
CALL_GOAL_S = 0.020
RUN_GOAL_S = 0.15


def _home(root: Path) -> dict[str, str]:
    """A fresh flakebot home with the tool catalogued; the environment that points flakebot at it."""
    env = dict(os.environ)
    for sub in ("config", "data", "cache", "state"):
        (root / sub).mkdir(parents=True)
        env[f"XDG_{sub.upper()}_HOME"] = str(root / sub)
    # An installed flakebot has its bytecode compiled (pip does it): without it every start compiles the modules again.
    for name in [k for k in env if k.startswith("FLAKEBOT_") or k == "PYTHONDONTWRITEBYTECODE"]:
        del env[name]
    store = root / "store"
    (store / "bin").mkdir(parents=True)
    shutil.copy(shutil.which("echo") or "/bin/echo", store / "bin" / TOOL)
    code = (
        "import sys; from pathlib import Path; from flakebot import config; from flakebot.deliver.catalog import Catalog\n"
        "root = Path(sys.argv[1]); (root / 'flake').mkdir()\n"
        f"m = {{'name': '{TOOL}', 'main_program': '{TOOL}', 'store_path': str(root / 'store'), 'summary': 'echo',"
        " 'nix_run_argv': ['nix', 'run', 'unused']}\n"
        f"Catalog.open(config.load()).add('{TOOL}', need='echo', flake_dir=root / 'flake', manifest=m, usage_md='# {TOOL}',"
        " store_path=str(root / 'store'), run_id='bench', origin={})\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root)], env=env, check=True, capture_output=True)
    return env


class Server:
    """`flakebot mcp` driven over its pipes."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flakebot", "mcp"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
        )
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"flakebot mcp ended before answering {method}")
            message = json.loads(line)
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message["result"])

    def start(self, initialized: Any = None) -> list[str]:
        info = {"name": "bench", "version": "1"}
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info})
        if initialized is not None:
            initialized()
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return [tool["name"] for tool in self.request("tools/list", {})["tools"]]

    def _send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _timed(action: Any) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def run(repeat: int = 7, calls: int = 15) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-calls-") as tmp:
        env = _home(Path(tmp) / "home")
        work = Path(tmp) / "work"
        work.mkdir()
        binary = str(Path(tmp) / "home/store/bin" / TOOL)
        bare = [binary, "hello"]
        bwrap = ["bwrap", "--ro-bind", "/", "/", "--unshare-net", "--unshare-pid", "--die-with-parent", *bare]
        names = ("python", "sdk_import", "sdk_served", "mcp_initialize", "mcp_start", "mcp_closed", "bare", "run")
        samples: dict[str, list[float]] = {k: [] for k in names}

        def start() -> None:
            """One client's server: spawned, initialized, tools listed (P11), then closed and waited for."""
            began = time.perf_counter()
            server = Server(env, work)
            assert TOOL in server.start(lambda: samples["mcp_initialize"].append(time.perf_counter() - began))
            samples["mcp_start"].append(time.perf_counter() - began)
            server.close()
            samples["mcp_closed"].append(time.perf_counter() - began)

        def quiet(argv: list[str]) -> None:
            subprocess.run(argv, cwd=work, env=env, capture_output=True, check=True)

        sdk = [sys.executable, "-c", "import mcp.server.lowlevel, mcp.server.stdio"]
        served = [sys.executable, "-c", "from flakebot.mcp.server import load_sdk; load_sdk(); import gc; gc.freeze()"]
        start()  # warm-up, not counted: writes the bytecode, the initialize cache and the sandbox probe's record
        for name in ("mcp_initialize", "mcp_start", "mcp_closed"):
            samples[name].clear()
        quiet([sys.executable, "-m", "flakebot", "run", TOOL, "--", "hello"])
        for _ in range(repeat):
            samples["python"].append(_timed(lambda: quiet([sys.executable, "-c", "pass"])))
            samples["sdk_import"].append(_timed(lambda: quiet(sdk)))
            samples["sdk_served"].append(_timed(lambda: quiet(served)))
            start()
            samples["bare"].append(_timed(lambda: quiet(bare)))
            samples["run"].append(_timed(lambda: quiet([sys.executable, "-m", "flakebot", "run", TOOL, "--", "hello"])))

        call_samples: dict[str, list[float]] = {"call": [], "bare": [], "bwrap": []}
        server = Server(env, work)
        server.start()
        arguments = {"name": TOOL, "arguments": {"stdin": None, "writable": None}}
        answer = server.request("tools/call", arguments)  # the first call probes the sandbox
        if answer.get("isError"):
            raise RuntimeError(f"the tool call failed: {answer}")
        for _ in range(calls):
            call_samples["call"].append(_timed(lambda: server.request("tools/call", arguments)))
            call_samples["bare"].append(_timed(lambda: quiet(bare)))
            call_samples["bwrap"].append(_timed(lambda: quiet(bwrap)))
        server.close()

    med = {k: statistics.median(v) for k, v in samples.items()}
    spread = {k: [round(min(samples[k]), 4), round(med[k], 4), round(max(samples[k]), 4)] for k in
              ("python", "mcp_initialize", "mcp_start")}  # fmt: skip
    calls_med = {k: statistics.median(v) for k, v in call_samples.items()}
    return {
        "python_startup_s": round(med["python"], 4),
        "sdk_import_s": round(med["sdk_import"], 4),
        "sdk_import_as_served_s": round(med["sdk_served"], 4),
        "mcp_start_s": round(med["mcp_start"], 4),
        "mcp_start_goal_s": START_GOAL_S,
        "mcp_initialize_s": round(med["mcp_initialize"], 4),
        "mcp_initialize_goal_s": INITIALIZE_GOAL_S,
        "spread_s": spread,
        "mcp_closed_s": round(med["mcp_closed"], 4),
        "mcp_call_s": round(calls_med["call"], 4),
        "bare_call_s": round(calls_med["bare"], 4),
        "bwrap_call_s": round(calls_med["bwrap"], 4),
        "mcp_call_overhead_s": round(calls_med["call"] - calls_med["bare"], 4),
        "mcp_call_overhead_over_bwrap_s": round(calls_med["call"] - calls_med["bwrap"], 4),
        "mcp_call_goal_s": CALL_GOAL_S,
        "run_s": round(med["run"], 4),
        "bare_run_s": round(med["bare"], 4),
        "run_overhead_s": round(med["run"] - med["bare"], 4),
        "run_goal_s": RUN_GOAL_S,
        "repeat": repeat,
        "calls": calls,
    }


@dataclass(frozen=True, kw_only=True)
class CallsResult:
    """run()'s result, as report.json holds it (medians in seconds)."""

    python_startup_s: float
    sdk_import_s: float
    sdk_import_as_served_s: float
    mcp_start_s: float
    mcp_start_goal_s: float
    mcp_closed_s: float
    mcp_call_s: float
    bare_call_s: float
    bwrap_call_s: float
    mcp_call_overhead_s: float
    mcp_call_overhead_over_bwrap_s: float
    mcp_call_goal_s: float
    run_s: float
    bare_run_s: float
    run_overhead_s: float
    run_goal_s: float
    repeat: int
    calls: int
    # Since the early initialize answer (absent from reports before it): spawn to the initialize answer (median), its
    # goal over `python -c pass`, and [min, median, max] of python, mcp_initialize and mcp_start.
    mcp_initialize_s: float | None = None
    mcp_initialize_goal_s: float | None = None
    spread_s: dict[str, list[float]] | None = None


RESULT = CallsResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
