"""The team front under many agents: `tokens` tokens (each made with `flakebot token add`), each an MCP SDK
Streamable HTTP client of its own, all at once against one `flakebot serve` on 127.0.0.1, each doing `rounds` rounds
of `list` and `show`; the figure is the p95 latency of those calls (goal <= 250 ms), beside one client alone's p95
in the same run (the same calls with nothing else waiting: what the load adds).

A bounded number of requests (tokens x rounds x 2 calls), to loopback only; the server is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class FrontResult:
    """run()'s result, as report.json holds it."""

    tokens: int
    rounds: int
    calls: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    alone_p95_ms: float
    p95_over_alone: float
    wall_s: float
    errors: int
    server_cpu_ms_per_call: float  # the serve process's own CPU (user + system) over the loaded calls, per call
    clients_cpu_ms_per_call: float  # the 50 clients' (this process's) CPU over the same calls, per call


RESULT = FrontResult


def flakebot(env: dict[str, str], *args: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "flakebot", *args, "--json"], env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])["result"]
    return result


@contextmanager
def serving(env: dict[str, str], home: Path) -> Iterator[tuple[str, int]]:
    """`flakebot serve --port 0` until the block ends: its URL and pid."""
    with (home / "serve.err").open("w") as errors:
        process = subprocess.Popen([sys.executable, "-m", "flakebot", "serve", "--port", "0"], env=env,
                                   stdout=subprocess.PIPE, stderr=errors, text=True, cwd=home)  # fmt: skip
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 120)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("flakebot serve: "):
            raise RuntimeError(f"flakebot serve did not start: {line}{(home / 'serve.err').read_text()[-2000:]}")
        yield line.split()[2], process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


async def agent(url: str, token: str, rounds: int, start: asyncio.Event) -> tuple[list[float], int]:
    """One agent's call latencies (seconds) and its failed calls: a session, then `rounds` of list and show."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    latencies, errors = [], 0
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:
            await start.wait()
            for _ in range(rounds):
                for name, arguments in (("list", {}), ("show", {"name": "no-such-tool"})):
                    began = time.perf_counter()
                    try:
                        answer = await client.call_tool(name, arguments)
                        errors += name == "list" and bool(answer.is_error)
                    except Exception:  # a failed call is counted, not timed
                        errors += 1
                        continue
                    latencies.append(time.perf_counter() - began)
    return latencies, errors


async def agents(url: str, tokens: list[str], rounds: int) -> tuple[list[float], int, float]:
    """Every token's agent at once (sessions opened first, then released together): latencies, errors, wall."""
    start = asyncio.Event()
    tasks = [asyncio.create_task(agent(url, token, rounds, start)) for token in tokens]
    await asyncio.sleep(0)
    began = time.perf_counter()
    start.set()
    done = await asyncio.gather(*tasks)
    wall = time.perf_counter() - began
    return [x for latencies, _ in done for x in latencies], sum(e for _, e in done), wall


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20, method="inclusive")[18] if len(samples) > 1 else samples[0]


def run(tokens: int = 50, rounds: int = 4) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-front-") as tmp:
        home = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKEBOT_")}
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME"):
            (home / var).mkdir()
            env[var] = str(home / var)
        env["FLAKEBOT_WORKDIR"] = str(home / "work")
        names = [f"agent-{i:03d}" for i in range(tokens)]
        with ThreadPoolExecutor(4) as pool:  # the store's lock orders them; four CLI processes at a time
            made = list(pool.map(lambda n: str(flakebot(env, "token", "add", n, "--calls-per-minute", "100000")["token"]), names))  # fmt: skip
        with serving(env, home) as (url, pid):
            alone, alone_errors, _ = asyncio.run(agents(url, made[:1], rounds * 5))
            cpu, clients = cpu_seconds(pid), time.process_time()
            latencies, errors, wall = asyncio.run(agents(url, made, rounds))
            cpu, clients = cpu_seconds(pid) - cpu, time.process_time() - clients  # the sessions' opening included
    if not latencies or not alone:
        raise RuntimeError(f"no call answered ({errors + alone_errors} failed)")
    ms = sorted(x * 1000 for x in latencies)
    alone_p95 = p95([x * 1000 for x in alone])
    return asdict(
        FrontResult(
            tokens=tokens,
            rounds=rounds,
            calls=len(latencies),
            p50_ms=round(statistics.median(ms), 1),
            p95_ms=round(p95(ms), 1),
            max_ms=round(ms[-1], 1),
            alone_p95_ms=round(alone_p95, 1),
            p95_over_alone=round(p95(ms) / alone_p95, 2),
            wall_s=round(wall, 2),
            errors=errors + alone_errors,
            server_cpu_ms_per_call=round(cpu * 1000 / len(latencies), 2),
            clients_cpu_ms_per_call=round(clients * 1000 / len(latencies), 2),
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=4)
    options = parser.parse_args()
    print(json.dumps(run(options.tokens, options.rounds), indent=1))
