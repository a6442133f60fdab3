"""The team front under many agents: `tokens` tokens (each made with `flakebot token add`), each an MCP SDK
Streamable HTTP client of its own, all at once against one `flakebot serve` on 127.0.0.1, each doing `rounds` rounds
of `list` and `show`; the figure is the p95 latency of those calls (goal <= 250 ms), beside one client alone's p95
in the same run (the same calls with nothing else waiting: what the load adds). Each agent lists the tools once on
connecting, before the common start, as hosts do (the SDK client would otherwise send that tools/list inside its first
timed call_tool: 50 lists in the first round's burst, the tail of the figure).

The agents run in `processes` client processes (ten tokens each by default), not all in this one: an MCP SDK client
costs more CPU per call than the server's answer (about 4 ms against 1-3 ms), so fifty of them behind one Python
process's lock measured that lock's queue as much as the front (each call waited for 49 others' client-side work).
Fifty agents are fifty programs, usually on other machines; here they still share this machine's cores with the
server, so the figure stays a pessimistic one. clients_cpu_ms_per_call is the client processes' CPU over the loaded
calls (each measures its own, from the common start to its last answer).

A bounded number of requests (tokens x rounds x 2 calls), to loopback only; the server is stopped by its pid, the
client processes end with their last call (joined).
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
from typing import Any


@dataclass(frozen=True, kw_only=True)
class FrontResult:
    """run()'s result, as report.json holds it."""

    tokens: int
    rounds: int
    processes: int = 1  # client processes the tokens' agents are spread over (reports before it: one)
    calls: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    alone_p95_ms: float
    p95_over_alone: float
    wall_s: float
    errors: int
    server_cpu_ms_per_call: float  # the serve process's own CPU (user + system) over the loaded calls, per call
    clients_cpu_ms_per_call: float  # the client processes' CPU over the same calls, per call


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


async def agent(
    url: str, token: str, rounds: int, start: asyncio.Event, connected: asyncio.Event | None = None
) -> tuple[list[float], int]:
    """One agent's call latencies (seconds) and its failed calls: a session, then `rounds` of list and show."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    latencies, errors = [], 0
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client:
            await client.list_tools()  # as a host lists tools on connecting (else the SDK lists before a first call)
            if connected is not None:
                connected.set()
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
    connected = [asyncio.Event() for _ in tokens]
    tasks = [
        asyncio.create_task(agent(url, token, rounds, start, c)) for token, c in zip(tokens, connected, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 120)
    began = time.perf_counter()
    start.set()
    done = await asyncio.gather(*tasks)
    wall = time.perf_counter() - began
    return [x for latencies, _ in done for x in latencies], sum(e for _, e in done), wall


def agents_process(url: str, tokens: list[str], rounds: int, ready: Any, start: Any, results: Any) -> None:
    """A client process: its tokens' agents with their sessions open, then `ready` (a barrier every process and the
    parent wait on), then their calls once `start` is set; puts (latencies, errors, its CPU seconds) on `results`."""

    async def main() -> tuple[list[float], int, float]:
        go = asyncio.Event()
        connected = [asyncio.Event() for _ in tokens]
        tasks = [
            asyncio.create_task(agent(url, token, rounds, go, c)) for token, c in zip(tokens, connected, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(c.wait() for c in connected)), 120)  # connected, tools listed
        await asyncio.to_thread(ready.wait)
        await asyncio.to_thread(start.wait)
        cpu = time.process_time()
        go.set()
        done = await asyncio.gather(*tasks)
        return [x for latencies, _ in done for x in latencies], sum(e for _, e in done), time.process_time() - cpu

    results.put(asyncio.run(main()))


def spread(url: str, tokens: list[str], rounds: int, processes: int) -> tuple[list[float], int, float, float]:
    """Every token's agent at once, over `processes` client processes: latencies, errors, wall, the clients' CPU."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of this process's loop inherited
    groups = [tokens[i::processes] for i in range(processes) if tokens[i::processes]]
    ready, start, results = context.Barrier(len(groups) + 1), context.Event(), context.Queue()
    children = [context.Process(target=agents_process, args=(url, group, rounds, ready, start, results))
                for group in groups]  # fmt: skip
    for child in children:
        child.start()
    try:
        ready.wait(timeout=120)  # a client process that died breaks it: BrokenBarrierError
        began = time.perf_counter()
        start.set()
        done = [results.get(timeout=600) for _ in children]
        wall = time.perf_counter() - began
    finally:
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
                child.join()
    latencies = [x for part, _, _ in done for x in part]
    return latencies, sum(e for _, e, _ in done), wall, sum(cpu for _, _, cpu in done)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20, method="inclusive")[18] if len(samples) > 1 else samples[0]


def run(tokens: int = 50, rounds: int = 4, processes: int = 5) -> dict[str, object]:
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
            cpu = cpu_seconds(pid)
            latencies, errors, wall, clients = spread(url, made, rounds, processes)
            cpu = cpu_seconds(pid) - cpu  # the sessions' opening included
    if not latencies or not alone:
        raise RuntimeError(f"no call answered ({errors + alone_errors} failed)")
    ms = sorted(x * 1000 for x in latencies)
    alone_p95 = p95([x * 1000 for x in alone])
    return asdict(
        FrontResult(
            tokens=tokens,
            rounds=rounds,
            processes=processes,
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
    parser.add_argument("--processes", type=int, default=5)
    options = parser.parse_args()
    print(json.dumps(run(options.tokens, options.rounds, options.processes), indent=1))
