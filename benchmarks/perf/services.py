"""S1-S3: a supervised service (tests/fixtures/kv-service, packaged offline into a scratch home twice: as
`kv-socket`, whose listening socket flakebot holds and hands in, and as `kv-service`, forwarded by pasta), against the
same binary started bare on the host (PORT, no sandbox) in the same run: the time from `flakebot up` to healthy, the time to healthy again after `kill -9` of the service, and a request's cost through the
pasta forward and through flakebot's request proxy (the MCP `service_request` path, in-process) against the same
request sent directly inside the service's own network namespace (nsenter, as root).

up: wall seconds of the whole `flakebot up NAME --json` command (CLI and supervisor start-up included). restart: from
the SIGKILL until a health check through the forward answers 200 from a new service process (the first restart's
backoff, a new sandbox and pasta, the first check); one kill per start, `down` between samples, as restarts within
a minute back off longer. Requests: one small client script times `requests`
sequential GETs of one key, run on the host against the forward's port and inside the namespace against the inner
port, in the same run one after the other; the proxy is timed in this process. Figures are medians, and the ratios
and differences are taken between those medians of the same run. The socket handoff: S1 is `up` of kv-socket less
the bare binary's start to its first healthy answer (both medians); S3 its requests through the socket flakebot holds
over the same requests to the bare binary on the host; concurrency: `clients` client processes at once, each
4 x `requests` GETs, requests per second through the handoff over the bare binary's (both up at once, measured in
three alternating turns, medians).

Memory (S5): with kv-socket up, the proportional set size (PSS, /proc/PID/smaps_rollup) and RSS of every process in
its supervisor's tree (the supervisor, bubblewrap, its init, the service: found by parent links from the supervisor's
pid, never by name), against the service process's own. Upgrade (S4): a client process loops GETs through kv-socket's
port while `flakebot up kv-socket@0.2.0` (a copy of the crate as 0.2.0, packaged the same way) upgrades it, and
0.5 s on after the upgrade returned; every request refused, reset, timed out or not answered 200 with the value
counts as lost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.reliability.services import set_version
from flakebot import config
from flakebot.services import proxy

REPO = Path(__file__).resolve().parents[2]
KV_SERVICE = REPO / "tests" / "fixtures" / "kv-service"
CLIENT = """
import http.client, json, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
times = []
for _ in range(count):
    began = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/kv/bench")
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read() == b"value", answer.status
    connection.close()
    times.append(time.perf_counter() - began)
print(json.dumps(times))
"""


def run(samples: int = 5, requests: int = 50, clients: int = 4) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-services-") as tmp:
        env = _home(Path(tmp))
        _cli(env, "package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2")
        packaged = _cli(env, "package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2", "--name",
                        SOCKET_NAME, "--socket", "handoff")  # fmt: skip
        handoff = _handoff_figures(env, Path(packaged["store_path"]) / "bin" / "kv-service", Path(tmp), samples,
                                   requests, clients)  # fmt: skip
        handoff.update(_upgrade_figures(env, Path(tmp)))
        ups: list[float] = []
        restarts: list[float] = []
        for _ in range(samples):  # a fresh start each: restarts within a minute back off longer (0.2 s doubling)
            began = time.perf_counter()
            started = _cli(env, "up", "kv-service")
            ups.append(time.perf_counter() - began)
            try:
                restarts.append(_restart_after_kill(env, started["port"]))
            finally:
                _cli(env, "down", "kv-service")
        _cli(env, "up", "kv-service")
        try:
            status = _cli(env, "services")["services"][0]
            port = status["port"]
            with httpx.Client(trust_env=False, timeout=5) as http:
                http.put(f"http://127.0.0.1:{port}/kv/bench", content=b"value").raise_for_status()
            forward = _client_times([], port, requests)
            direct = _client_times(["nsenter", f"--net=/proc/{status['service_pid']}/ns/net"],
                                   status["inner_port"], requests) if os.geteuid() == 0 else []  # fmt: skip
            proxied = _proxy_times(env, requests)
        finally:
            _cli(env, "down", "kv-service")
    forward_ms, proxy_ms = _median_ms(forward), _median_ms(proxied)
    direct_ms = _median_ms(direct) if direct else None
    return {
        "up_s": round(statistics.median(ups), 3),
        "up_samples_s": [round(s, 3) for s in ups],
        "restart_s": round(statistics.median(restarts), 3),
        "restart_samples_s": [round(s, 3) for s in restarts],
        "requests": requests,
        "direct_ms": direct_ms,
        "forward_ms": forward_ms,
        "proxy_ms": proxy_ms,
        "forward_over_direct": round(forward_ms / direct_ms, 3) if direct_ms else None,
        "forward_minus_direct_ms": round(forward_ms - direct_ms, 3) if direct_ms is not None else None,
        "proxy_minus_forward_ms": round(proxy_ms - forward_ms, 3),
        **handoff,
    }


SOCKET_NAME = "kv-socket"


def _handoff_figures(
    env: dict[str, str], binary: Path, tmp: Path, samples: int, requests: int, clients: int
) -> dict[str, Any]:
    """`up` of the handoff service and requests through its socket, against the bare binary on the host (same run)."""
    ups: list[float] = []
    for _ in range(samples):
        began = time.perf_counter()
        _cli(env, "up", SOCKET_NAME)
        ups.append(time.perf_counter() - began)
        _cli(env, "down", SOCKET_NAME)
    bare_starts: list[float] = []
    for n in range(samples):
        process, port, seconds = _bare(binary, tmp / f"bare-{n}")
        bare_starts.append(seconds)
        _end(process)
    process, bare_port, _ = _bare(binary, tmp / "bare")
    try:
        started = _cli(env, "up", SOCKET_NAME)
        port = started["port"]
        try:
            memory = _tree_memory(started["supervisor_pid"], started["service_pid"])
            _put(bare_port)
            _put(port)
            # both running at once, measured in turns: the machine's other load falls on both alike
            bare = _client_times([], bare_port, requests)
            socket_times = _client_times([], port, requests)
            rates = [(_throughput(port, 4 * requests, clients), _throughput(bare_port, 4 * requests, clients))
                     for _ in range(3)]  # fmt: skip
        finally:
            _cli(env, "down", SOCKET_NAME)
    finally:
        _end(process)
    socket_rps = statistics.median(rate for rate, _ in rates)
    bare_rps = statistics.median(rate for _, rate in rates)
    up_s, bare_s = statistics.median(ups), statistics.median(bare_starts)
    socket_ms, bare_ms = _median_ms(socket_times), _median_ms(bare)
    return {
        "socket_up_s": round(up_s, 3),
        "socket_up_samples_s": [round(x, 3) for x in ups],
        "bare_start_s": round(bare_s, 4),
        "socket_up_over_bare_s": round(up_s - bare_s, 3),
        "socket_ms": socket_ms,
        "bare_ms": bare_ms,
        "socket_over_bare": round(socket_ms / bare_ms, 3),
        "clients": clients,
        "socket_rps": round(socket_rps, 1),
        "bare_rps": round(bare_rps, 1),
        "socket_throughput_over_bare": round(socket_rps / bare_rps, 3),
        **memory,
    }


def _tree_memory(supervisor: int, service: int) -> dict[str, Any]:
    """PSS and RSS (MB) of the supervisor's whole process tree and of the service's own process; each process named
    by its command."""
    pids, seen = [supervisor], []
    while pids:
        pid = pids.pop()
        seen.append(pid)
        for task in Path(f"/proc/{pid}/task").iterdir():
            pids.extend(int(child) for child in (task / "children").read_text().split())
    tree: dict[str, dict[str, float]] = {}
    for pid in seen:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
        command = Path(f"/proc/{pid}/comm").read_text().strip()
        tree[f"{pid} {command}"] = {k: round(int(fields[k].split()[0]) / 1024, 2) for k in ("Pss", "Rss")}
    own = next(v for k, v in tree.items() if int(k.split()[0]) == service)
    return {
        "tree_pss_mb": round(sum(v["Pss"] for v in tree.values()), 2),
        "tree_rss_mb": round(sum(v["Rss"] for v in tree.values()), 2),
        "service_pss_mb": own["Pss"],
        "service_rss_mb": own["Rss"],
        "tree_mb": tree,
    }


LOOP = """
import http.client, json, os, sys
port, stop = int(sys.argv[1]), sys.argv[2]
ok, lost, why = 0, 0, []
while not os.path.exists(stop):
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/kv/bench")
        answer = connection.getresponse()
        body = answer.read()
        connection.close()
        if answer.status == 200 and body == b"value":
            ok += 1
            continue
        lost, why = lost + 1, why + [f"status {answer.status}"]
    except OSError as exc:
        lost, why = lost + 1, why + [type(exc).__name__]
print(json.dumps({"ok": ok, "lost": lost, "why": why[:5]}))
"""


def _upgrade_figures(env: dict[str, str], tmp: Path) -> dict[str, Any]:
    """kv-socket 0.1.0 upgraded to 0.2.0 while a client loops GETs through its port: requests answered, lost."""
    crate = tmp / "kv-0.2.0"
    shutil.copytree(KV_SERVICE, crate, ignore=shutil.ignore_patterns("target"))
    set_version(crate, "0.2.0")
    _cli(env, "package-service", str(crate), "--offline", "--stop-grace", "2", "--name", SOCKET_NAME, "--socket",
         "handoff")  # fmt: skip
    port = _cli(env, "up", f"{SOCKET_NAME}@0.1.0")["port"]
    stop = tmp / "stop-loop"
    try:
        _put(port)
        client = subprocess.Popen([sys.executable, "-c", LOOP, str(port), str(stop)], stdout=subprocess.PIPE,
                                  text=True)  # fmt: skip
        try:
            time.sleep(0.5)
            began = time.perf_counter()
            upgraded = _cli(env, "up", f"{SOCKET_NAME}@0.2.0")
            seconds = time.perf_counter() - began
            time.sleep(0.5)
        finally:
            stop.touch()
            out, _ = client.communicate(timeout=30)
    finally:
        _cli(env, "down", SOCKET_NAME)
    if upgraded["version"] != "0.2.0" or upgraded["port"] != port:
        raise RuntimeError(f"the upgrade ended at {upgraded['version']} on port {upgraded['port']}")
    counts = json.loads(out)
    return {"upgrade_s": round(seconds, 3), "upgrade_requests_ok": counts["ok"], "upgrade_requests_lost": counts["lost"],
            "upgrade_lost_why": counts["why"]}  # fmt: skip


def _bare(binary: Path, state: Path) -> tuple[subprocess.Popen[bytes], int, float]:
    """The binary started on the host (PORT, its own state directory): the process, its port, seconds to healthy."""
    state.mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    began = time.perf_counter()
    process = subprocess.Popen([str(binary)], env={"PORT": str(port), "STATE_DIRECTORY": str(state)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    with httpx.Client(trust_env=False, timeout=1) as http:
        while time.perf_counter() - began < 10:
            try:
                if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return process, port, time.perf_counter() - began
            except httpx.HTTPError:
                time.sleep(0.001)
    _end(process)
    raise RuntimeError("the bare kv-service was not healthy within 10 s")


def _end(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=10)


def _put(port: int) -> None:
    with httpx.Client(trust_env=False, timeout=5) as http:
        http.put(f"http://127.0.0.1:{port}/kv/bench", content=b"value").raise_for_status()


CONCURRENT = """
import http.client, json, sys, time
port, count, go = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
time.sleep(max(go - time.monotonic(), 0))
began = time.monotonic()
for _ in range(count):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/kv/bench")
    answer = connection.getresponse()
    assert answer.status == 200 and answer.read() == b"value", answer.status
    connection.close()
print(json.dumps([began, time.monotonic()]))
"""


def _throughput(port: int, requests: int, clients: int) -> float:
    """Requests per second of `clients` client processes at once, `requests` each: from the first one's first
    request to the last one's last answer (CLOCK_MONOTONIC, one clock for all), all set to begin at one moment after
    their interpreters started (their start-up is not the service's)."""
    go = time.monotonic() + 1.0
    argv = [sys.executable, "-c", CONCURRENT, str(port), str(requests), str(go)]
    running = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(clients)]
    spans: list[tuple[float, float]] = []
    for process in running:
        out, _ = process.communicate(timeout=300)
        if process.returncode != 0:
            raise RuntimeError("a concurrent client failed")
        began, ended = json.loads(out)
        spans.append((float(began), float(ended)))
    return clients * requests / (max(end for _, end in spans) - min(start for start, _ in spans))


def _home(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAKEBOT_")}
    for var, sub in (("XDG_CONFIG_HOME", "config"), ("XDG_DATA_HOME", "data"), ("XDG_STATE_HOME", "state")):
        (root / sub).mkdir()
        env[var] = str(root / sub)
    env["FLAKEBOT_WORKDIR"] = str(root / "work")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _cli(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "flakebot", *args, "--json"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"flakebot {' '.join(args)} exited {done.returncode}: {done.stderr[-500:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])["result"]
    return result


def _restart_after_kill(env: dict[str, str], port: int) -> float:
    """Seconds from SIGKILL of the service's process until the forward answers health from its successor."""
    status_file = Path(env["FLAKEBOT_WORKDIR"]) / "services" / "kv-service" / "status.json"
    before = json.loads(status_file.read_text())
    os.kill(before["service_pid"], signal.SIGKILL)
    began = time.perf_counter()
    with httpx.Client(trust_env=False, timeout=1) as http:
        while time.perf_counter() - began < 30:
            now = json.loads(status_file.read_text() or "{}")
            if now.get("service_pid") not in (None, before["service_pid"]):
                try:
                    if http.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                        return time.perf_counter() - began
                except httpx.HTTPError:
                    pass
            time.sleep(0.01)
    raise RuntimeError("kv-service was not healthy again within 30 s of kill -9")


def _client_times(prefix: list[str], port: int, count: int) -> list[float]:
    argv = [*prefix, sys.executable, "-c", CLIENT, str(port), str(count)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
    times: list[float] = json.loads(done.stdout)
    return times


def _proxy_times(env: dict[str, str], count: int) -> list[float]:
    settings = config.Settings(workdir=env["FLAKEBOT_WORKDIR"])
    times = []
    for _ in range(count):
        began = time.perf_counter()
        answer = proxy.request("kv-service", settings, "GET", "/kv/bench")
        if answer["status"] != 200:
            raise RuntimeError(f"the proxy's request answered {answer['status']}")
        times.append(time.perf_counter() - began)
    return times


def _median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1000, 3)


@dataclass(frozen=True, kw_only=True)
class ServicesResult:
    """run()'s result, as report.json holds it."""

    up_s: float
    up_samples_s: list[float]
    restart_s: float
    restart_samples_s: list[float]
    requests: int
    direct_ms: float | None
    forward_ms: float
    proxy_ms: float
    forward_over_direct: float | None
    forward_minus_direct_ms: float | None
    proxy_minus_forward_ms: float
    # the socket handoff (kv-socket) against the bare binary on the host; absent from reports made before it
    socket_up_s: float | None = None
    socket_up_samples_s: list[float] | None = None
    bare_start_s: float | None = None
    socket_up_over_bare_s: float | None = None
    socket_ms: float | None = None
    bare_ms: float | None = None
    socket_over_bare: float | None = None
    clients: int | None = None
    socket_rps: float | None = None
    bare_rps: float | None = None
    socket_throughput_over_bare: float | None = None
    # memory of the supervisor's whole tree against the service's own (kv-socket), MB; each process of the tree
    tree_pss_mb: float | None = None
    tree_rss_mb: float | None = None
    service_pss_mb: float | None = None
    service_rss_mb: float | None = None
    tree_mb: dict[str, dict[str, float]] | None = None
    # an upgrade of kv-socket (0.1.0 to 0.2.0) under a client looping GETs: its seconds, requests answered and lost
    upgrade_s: float | None = None
    upgrade_requests_ok: int | None = None
    upgrade_requests_lost: int | None = None
    upgrade_lost_why: list[str] | None = None


RESULT = ServicesResult
