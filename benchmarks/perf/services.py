"""S1-S3: a supervised service (tests/fixtures/kv-service, packaged offline into a scratch home): the time from
`flakebot up` to healthy, the time to healthy again after `kill -9` of the service, and a request's cost through the
pasta forward and through flakebot's request proxy (the MCP `service_request` path, in-process) against the same
request sent directly inside the service's own network namespace (nsenter, as root).

up: wall seconds of the whole `flakebot up NAME --json` command (CLI and supervisor start-up included). restart: from
the SIGKILL until a health check through the forward answers 200 from a new service process (the first restart's
backoff, a new sandbox and pasta, the first check); one kill per start, `down` between samples, as restarts within
a minute back off longer. Requests: one small client script times `requests`
sequential GETs of one key, run on the host against the forward's port and inside the namespace against the inner
port, in the same run one after the other; the proxy is timed in this process. Figures are medians, and the ratios
and differences are taken between those medians of the same run. kv-service's accept loop polls every 20 ms (a
std-only way to notice SIGTERM), which dominates every request path alike.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

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


def run(samples: int = 5, requests: int = 50) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-services-") as tmp:
        env = _home(Path(tmp))
        _cli(env, "package-service", str(KV_SERVICE), "--offline", "--stop-grace", "2")
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
    }


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


RESULT = ServicesResult
