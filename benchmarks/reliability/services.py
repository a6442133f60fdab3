"""Service faults: a supervised service (tests/fixtures/kv-service, packaged offline) hurt through the real commands,
each case in a flakebot home of its own, judged from outside (status.json, /proc, the port, the data it answers).

    kill -9          the service's own process: healthy again within seconds, its data kept
    SIGSTOP          the service hangs (listening, never answering): marked unhealthy, SIGKILLed, restarted
    crash loop       a service that exits at every start: failed after the restart limit, nothing left, port freed
    supervisor kill  kill -9 of the supervisor: nothing of the service left, `lost`, `up --all` restores it
    failing upgrade  `up NAME@0.3.0` of a version that cannot read 0.1.0's data: refused (exit 43), 0.1.0 serves on
    reused pid       the supervisor killed, its recorded pids now an unrelated process's: `down` leaves that alive
    memory hogs      8 processes of 16 MiB under a 64 MiB service: its cgroup holds them to 64 MiB, status says so
    disk quota       50 MiB of values under a 16 MiB quota: stopped, `failed: disk quota`, refused a start, data kept
    upgrade copy     a 1 GiB sparse file and 200 hard links in the state: the upgrade's copy stays within the quota
    replaced name    kv-service started with secrets (keys token, password, api_key), then its catalog name made to
                     mean a program that answers GET /cred with its credentials (as a craft --fresh of the same need
                     would); `restart`, a crash, `up --all`: each start runs the recorded program, none answers /cred
    secret keys      `up --secret` under the keys the redactor knows (token, password, api_key): each reaches the
                     service's credentials directory, none is written in a file of the home
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks import records
from benchmarks.reliability.env import REPO, Home, Scratch, wait_for
from benchmarks.reliability.table import table, yes

KV_SERVICE = REPO / "tests" / "fixtures" / "kv-service"
MIB = 1024 * 1024
# kv-service with GET /hog: 8 copies of itself, each holding 16 MiB (under a 64 MiB per-process limit, twice it together)
HOG_EDITS = {
    "fn main() {\n": """fn main() {
    if let Ok(mb) = std::env::var("HOG_MB") {
        let held: Vec<Vec<u8>> = (0..mb.parse::<usize>().unwrap_or(0)).map(|_| vec![7u8; 1 << 20]).collect();
        while !held.is_empty() {
            std::thread::sleep(Duration::from_secs(1));
        }
        return;
    }
""",
    '("GET", "/net") =>': """("GET", "/hog") => {
            for _ in 0..8 {
                let _ = std::process::Command::new("/proc/self/exe").env("HOG_MB", "16").spawn();
            }
            reply(&mut stream, 200, "hogging\\n")
        }
        ("GET", "/net") =>""",
}
SECRET = "s3cr3t-token-4711"
SECRET_KEYS = ("token", "password", "api_key")  # keys the redactor (flakebot/redact.py) blanks in a JSON record
THIEF_ROUTE = """        ("GET", "/cred") => {
            let mut out = String::new();
            if let Ok(dir) = std::env::var("CREDENTIALS_DIRECTORY") {
                if let Ok(entries) = std::fs::read_dir(&dir) {
                    for entry in entries.flatten() {
                        if let Ok(bytes) = std::fs::read(entry.path()) {
                            for b in bytes { out.push_str(&format!("{:02x}", b)); }
                            out.push('\\n');
                        }
                    }
                }
            }
            reply(&mut stream, 200, &out)
        }
"""
HEALTH_LINE = '        ("GET", "/health") if UNMIGRATED'


def set_version(crate: Path, version: str) -> None:
    """A copy of kv-service (crate version 0.1.0) made crate `version`, in Cargo.toml and in its Cargo.lock entry
    when it has one (builds are --locked; without one, flakebot makes it)."""
    cargo = crate / "Cargo.toml"
    cargo.write_text(cargo.read_text().replace('version = "0.1.0"', f'version = "{version}"', 1))
    lock = crate / "Cargo.lock"
    if not lock.exists():
        return
    entry = '[[package]]\nname = "kv-service"\nversion = "0.1.0"'
    if entry not in lock.read_text():
        raise RuntimeError("kv-service's Cargo.lock changed: its own entry is not where set_version looks")
    lock.write_text(lock.read_text().replace(entry, entry.replace("0.1.0", version), 1))


def thief_crate(root: Path, version: str) -> Path:
    """kv-service with a GET /cred route answering its credentials hex-encoded (log redaction never sees them), as
    crate `version`: what an agent would put behind a service's name."""
    crate = root / f"thief-{version}"
    if crate.exists():
        return crate
    shutil.copytree(KV_SERVICE, crate, ignore=shutil.ignore_patterns("target"))
    set_version(crate, version)
    source = crate / "src" / "main.rs"
    text = source.read_text()
    if HEALTH_LINE not in text:
        raise RuntimeError("kv-service's source changed: the thief's route has no place")
    source.write_text(text.replace(HEALTH_LINE, THIEF_ROUTE + HEALTH_LINE, 1))
    return crate


def leaked(text: str) -> bool:
    """Whether `text` holds the secret, plain or hex-encoded."""
    return SECRET in text or SECRET.encode().hex() in text


def credential(pid: int, key: str) -> str:
    """What the service's own process sees at $CREDENTIALS_DIRECTORY/KEY (its mount namespace)."""
    done = subprocess.run(["nsenter", f"--mount=/proc/{pid}/ns/mnt", "cat", f"/run/credentials/{key}"],
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout


@dataclass
class ServiceFaultRow:
    """One fault, what must hold after it, and what was seen."""

    case: str
    fault: str
    expected: str
    ok: bool
    outcome: str
    seconds: float
    strays: int = 0


class Kv:
    """kv-service packaged in `home`, started, asked and read back."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.status_file = home.workdir / "services" / "kv-service" / "status.json"

    def package(self, crate: Path = KV_SERVICE, *extra: str) -> None:
        done = self.home.cli("package-service", str(crate), "--offline", "--stop-grace", "2", "--name", "kv-service",
                             *extra, "--json")  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"package-service failed: {done.error_line}")

    def up(self, *args: str) -> dict[str, Any]:
        done = self.home.cli("up", *args, "--json", timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"up {' '.join(args)} exited {done.returncode}: {done.error_line}")
        return done.result()

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_file.read_text()))
        except (OSError, ValueError):
            return {}

    def get(self, port: int, path: str) -> tuple[int, bytes]:
        with httpx.Client(trust_env=False, timeout=3) as http:
            answer = http.get(f"http://127.0.0.1:{port}{path}")
            return answer.status_code, answer.content

    def put(self, port: int, path: str, value: bytes) -> None:
        with httpx.Client(trust_env=False, timeout=3) as http:
            http.put(f"http://127.0.0.1:{port}{path}", content=value).raise_for_status()

    def down(self) -> None:
        self.home.cli("down", "kv-service")


def _alive(pid: Any) -> bool:
    try:
        return isinstance(pid, int) and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kill_service(kv: Kv) -> tuple[bool, str]:
    started = kv.up("kv-service")
    kv.put(started["port"], "/kv/kept", b"across a kill")
    os.kill(started["service_pid"], signal.SIGKILL)
    began = time.monotonic()
    back = wait_for(lambda: (s := kv.status()).get("health") == "healthy" and s.get("restarts") == 1 and s, 15, 0.05)
    seconds = time.monotonic() - began
    kept = kv.get(started["port"], "/kv/kept") == (200, b"across a kill")
    ok = bool(back) and seconds < 5 and kept and back["port"] == started["port"]
    return ok, f"healthy again after {seconds:.2f} s on the same port; data kept: {kept}"


def _sigstop(kv: Kv) -> tuple[bool, str]:
    started = kv.up("kv-service")
    os.kill(started["service_pid"], signal.SIGSTOP)
    began = time.monotonic()
    unhealthy = wait_for(lambda: kv.status().get("health") == "unhealthy", 15, 0.05)
    back = wait_for(lambda: (s := kv.status()).get("health") == "healthy" and s.get("restarts") == 1 and s, 30, 0.05)
    seconds = time.monotonic() - began
    gone = not _alive(started["service_pid"])
    ok = bool(unhealthy) and bool(back) and gone
    return ok, f"marked unhealthy, restarted healthy after {seconds:.1f} s; the stopped process gone: {gone}"


def _crash_loop(kv: Kv) -> tuple[bool, str]:
    state = kv.home.workdir / "services" / "kv-service" / "state"
    state.mkdir(parents=True)
    (state / "kv").write_text("not a directory")  # kv-service refuses to start on it: exit 1, every time
    done = kv.home.cli("up", "kv-service", timeout=180)
    status = kv.status()
    port = status.get("port")
    free = isinstance(port, int) and _port_free(port)
    ok = done.returncode == 40 and status.get("state") == "failed" and status.get("restarts") == 5 and free
    return (
        ok,
        f"exit {done.returncode}, {status.get('state')} after {status.get('restarts')} restarts; port freed: {free}",
    )


def _supervisor_kill(kv: Kv) -> tuple[bool, str]:
    started = kv.up("kv-service")
    kv.put(started["port"], "/kv/before", b"the kill")
    os.kill(started["supervisor_pid"], signal.SIGKILL)
    gone = wait_for(lambda: not _alive(started["service_pid"]) and _port_free(started["port"]), 10, 0.05)
    listed = kv.home.cli("services", "--json").result()["services"][0]
    restored = kv.home.cli("up", "--all", "--json", timeout=180)
    again = (restored.result().get("services") or [{}])[0]
    kept = again.get("port") == started["port"] and kv.get(started["port"], "/kv/before") == (200, b"the kill")
    ok = bool(gone) and listed["state"] == "lost" and restored.returncode == 0 and kept
    return (
        ok,
        f"service and forward gone: {bool(gone)}; status {listed['state']}; up --all: same port, data kept: {kept}",
    )


def _failing_upgrade(kv: Kv) -> tuple[bool, str]:
    crate = kv.home.root / "kv-0.3.0"
    shutil.copytree(KV_SERVICE, crate, ignore=shutil.ignore_patterns("target"))
    set_version(crate, "0.3.0")
    source = crate / "src" / "main.rs"
    source.write_text(
        source.read_text().replace("const CHECK_FORMAT: bool = false;", "const CHECK_FORMAT: bool = true;")
    )
    kv.package(crate, "--start-timeout", "4")
    started = kv.up("kv-service@0.1.0")
    kv.put(started["port"], "/kv/kept", b"by 0.1.0")
    refused = kv.home.cli("up", "kv-service@0.3.0", timeout=180)
    after = kv.status()
    serving = after.get("service_pid") == started["service_pid"] and after.get("version") == "0.1.0"
    kept = kv.get(started["port"], "/kv/kept") == (200, b"by 0.1.0")
    ok = refused.returncode == 43 and serving and kept
    return ok, f"exit {refused.returncode}; 0.1.0's process still serving: {serving}; data kept: {kept}"


def kv_version(root: Path, version: str, edits: dict[str, str]) -> Path:
    """A copy of kv-service as crate `version`, its source edited (each edit must apply)."""
    crate = root / f"kv-{version}"
    shutil.copytree(KV_SERVICE, crate, ignore=shutil.ignore_patterns("target"))
    set_version(crate, version)
    source = crate / "src" / "main.rs"
    text = source.read_text()
    for old, new in edits.items():
        if old not in text:
            raise RuntimeError(f"kv-service changed: {old!r} is not in it")
        text = text.replace(old, new)
    source.write_text(text)
    return crate


def namespace_members(pid: int) -> list[int]:
    """The processes in the PID namespace of `pid` (the service's own, bubblewrap's init included)."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == ns:
                found.append(int(entry))
        except OSError:
            continue
    return found


def memory_bytes(pids: list[int]) -> int:
    """What the processes hold together: the sum of their proportional set sizes (a shared page counted once)."""
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        except OSError:
            continue
        total += sum(int(line.split()[1]) * 1024 for line in lines if line.startswith("Pss:"))
    return total


def allocated(path: Path) -> int:
    """What the tree under `path` takes on disk (du: allocated blocks, each inode once); 0 when it is gone."""
    done = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else 0


class Peak:
    """The largest value `measure` returns while the block runs, sampled every 20 ms in a thread."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self.measure, self.value, self.stop = measure, 0, threading.Event()
        self.thread = threading.Thread(target=self._sample)

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.value = max(self.value, self.measure())
            time.sleep(0.02)

    def __enter__(self) -> Peak:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def _reused_pid(kv: Kv) -> tuple[bool, str]:
    started = kv.up("kv-service")
    os.kill(started["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: not _alive(started["service_pid"]), 10, 0.05)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        recorded = kv.status()
        kv.status_file.write_text(json.dumps({**recorded, "service_pid": bystander.pid,
                                              "supervisor_pid": bystander.pid}))  # fmt: skip
        done = kv.home.cli("down", "kv-service")
        survived = bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    return (
        done.returncode == 0 and survived,
        f"down exit {done.returncode}; the process at the pids survived: {survived}",
    )


def _memory_hogs(kv: Kv) -> tuple[bool, str]:
    kv.package(kv_version(kv.home.root, "0.2.0", HOG_EDITS))
    done = kv.home.cli("up", "kv-service@0.2.0", "--json", env={"FLAKEBOT_SANDBOX_MEMORY_MB": "64"}, timeout=180)
    started = done.result()
    paths = (started.get("cgroup") or {}).get("paths") or ["/nonexistent"]
    usage = Path(paths[0]) / "memory.max_usage_in_bytes"

    def kernel() -> int:
        try:
            return int(usage.read_text())
        except (OSError, ValueError):
            return 0

    with Peak(lambda: memory_bytes(namespace_members(started["service_pid"]))) as held, Peak(kernel) as peak:
        kv.get(started["port"], "/hog")
        said = wait_for(lambda: "out of memory" in kv.status().get("last_end", "") or held.value > 80 * MIB, 20, 0.1)
    ok = bool(said) and held.value <= 80 * MIB and 0 < peak.value <= 64 * MIB
    return ok, (
        f"held together {held.value / MIB:.0f} MiB (PSS summed, sampled), kernel peak {peak.value / MIB:.0f} MiB; "
        f"{kv.status().get('last_end') or 'no out-of-memory report'}"[:300]
    )


def _disk_quota(kv: Kv) -> tuple[bool, str]:
    quota = {"FLAKEBOT_SANDBOX_DISK_MB": "16"}
    started = kv.home.cli("up", "kv-service", "--json", env=quota, timeout=180).result()
    value, accepted = os.urandom(64 * 1024), 0
    for key in range(800):
        try:
            kv.put(started["port"], f"/kv/k{key}", value)
        except httpx.HTTPError:
            break
        accepted += 1
    failed = wait_for(lambda: (s := kv.status()).get("state") == "failed" and s, 10, 0.05)
    state = kv.home.workdir / "services" / "kv-service" / "state"
    again = kv.home.cli("up", "kv-service", env=quota, timeout=180)
    refused = again.returncode != 0 and "disk quota" in again.stderr
    ok = accepted < 800 and bool(failed) and "disk quota" in failed["message"] and refused
    return ok, (
        f"{accepted} of 800 values of 64 KiB accepted, {allocated(state) / MIB:.0f} MiB kept; "
        f"{(failed or {}).get('state')}; up again refused: {refused}"
    )


def _upgrade_copy(kv: Kv) -> tuple[bool, str]:
    kv.package(kv_version(kv.home.root, "0.2.0", HOG_EDITS))
    quota = {"FLAKEBOT_SANDBOX_DISK_MB": "64"}
    kv.home.cli("up", "kv-service@0.1.0", "--json", env=quota, timeout=180).result()
    state = kv.home.workdir / "services" / "kv-service" / "state"
    with open(state / "sparse", "wb") as sparse:
        sparse.write(os.urandom(MIB))
        sparse.truncate(1024 * MIB)
    (state / "one").write_bytes(os.urandom(MIB))
    for n in range(200):
        os.link(state / "one", state / f"also-{n}")
    before = set(Path("/tmp").glob("flakebot-lifecycle-*"))
    scratch = kv.home.workdir / "lifecycle"

    def copies() -> int:
        return sum(allocated(p) for p in (scratch, *(set(Path("/tmp").glob("flakebot-lifecycle-*")) - before)))

    with Peak(copies) as peak:
        done = kv.home.cli("up", "kv-service@0.2.0", "--json", env=quota, timeout=180)
    ok = done.returncode == 0 and 0 < peak.value <= 64 * MIB
    return ok, f"upgrade exit {done.returncode}; its copy of 1.2 GiB apparent took at most {peak.value / MIB:.0f} MiB"


def _secret_args(kv: Kv) -> list[str]:
    args = []
    for key in SECRET_KEYS:
        path = kv.home.root / f"{key}.txt"
        path.write_text(f"{SECRET}-{key}\n")
        path.chmod(0o600)
        args += ["--secret", f"{key}={path}"]
    return args


def _replaced_name(kv: Kv) -> tuple[bool, str]:
    started = kv.up("kv-service", *_secret_args(kv))
    kv.package(thief_crate(kv.home.root, "0.1.0"))  # kv-service 0.1.0 now names the thief, replaced in place
    held: list[tuple[str, bool]] = []

    def check(step: str, status: dict[str, Any]) -> dict[str, Any]:
        """Whether what answers now is the recorded program, holding the secret (judged at once: the next step
        replaces the process)."""
        port, pid = status.get("port"), status.get("service_pid")
        answer = kv.get(port, "/cred") if isinstance(port, int) else (0, b"")
        ok = answer[0] == 404 and not leaked(answer[1].decode("utf-8", "replace")) and port == started["port"]
        held.append((step, ok and isinstance(pid, int) and credential(pid, "token") == f"{SECRET}-token\n"))
        return status

    restarted = check("restart", kv.home.cli("restart", "kv-service", "--json", timeout=180).result())
    os.kill(restarted["service_pid"], signal.SIGKILL)
    crashed = wait_for(lambda: (s := kv.status()).get("health") == "healthy" and s.get("restarts") == 1 and s, 15, 0.05)
    check("crash restart", crashed or {})
    os.kill(int((crashed or restarted)["supervisor_pid"]), signal.SIGKILL)
    wait_for(lambda: not _alive((crashed or restarted).get("service_pid")), 10, 0.05)
    check("up --all", (kv.home.cli("up", "--all", "--json", timeout=180).result().get("services") or [{}])[0])
    named = ", ".join(f"{step}: {'the recorded program' if ok else 'NOT the recorded program'}" for step, ok in held)
    return all(ok for _, ok in held), named


def _secret_keys(kv: Kv) -> tuple[bool, str]:
    started = kv.up("kv-service", *_secret_args(kv))
    reached = [key for key in SECRET_KEYS if credential(started["service_pid"], key) == f"{SECRET}-{key}\n"]
    kv.down()
    written = [p for root in (kv.home.root / "work", kv.home.root / "data") for p in root.rglob("*") if p.is_file()]
    found = [p.name for p in written if SECRET.encode() in p.read_bytes()]
    ok = len(reached) == len(SECRET_KEYS) and not found
    return ok, f"reached the service: {', '.join(reached) or 'none'}; files holding a secret: {len(found)}"


# (case, fault, what must hold after it, the scenario)
CASES: list[tuple[str, str, str, Callable[[Kv], tuple[bool, str]]]] = [
    ("kill -9", "SIGKILL of the service's own process", "healthy again within 5 s, same port, data kept", _kill_service),
    ("SIGSTOP", "the service stopped (listening, never answering)", "unhealthy, SIGKILLed, restarted healthy", _sigstop),
    ("crash loop", "a service that exits 1 at every start", "exit 40, failed after 5 restarts, port freed", _crash_loop),
    ("supervisor kill", "SIGKILL of the supervisor, then `up --all`",
     "nothing of the service left, status lost; restored on its port with its data", _supervisor_kill),
    ("failing upgrade", "`up kv-service@0.3.0`, a version that cannot read 0.1.0's data",
     "refused with exit 43; 0.1.0's process serves on with its data", _failing_upgrade),
    ("reused pid", "SIGKILL of the supervisor, its recorded pids an unrelated process's, then `down`",
     "the unrelated process lives", _reused_pid),
    ("memory hogs", "8 processes of 16 MiB each under sandbox_memory_mb = 64",
     "the whole service held to 64 MiB (cgroup), out of memory reported", _memory_hogs),
    ("disk quota", "50 MiB of values under sandbox_disk_mb = 16", "stopped, failed: disk quota, refused a start",
     _disk_quota),
    ("upgrade copy", "an upgrade over a 1 GiB sparse file and 200 hard links, quota 64 MiB",
     "upgraded; its copy of the state within 64 MiB", _upgrade_copy),
    ("replaced name", "kv-service's catalog name replaced by a program echoing its credentials, then `restart`, "
     "a crash, `up --all`", "each start runs the recorded program; the secret reaches no other", _replaced_name),
    ("secret keys", "`up --secret` under keys token, password, api_key",
     "each in the service's credentials directory, none in a file of the home", _secret_keys),
]  # fmt: skip
QUICK = ("kill -9",)


def run_cases(root: Path, cache: Path, names: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    rows = []
    for case, fault, expected, scenario in CASES:
        if names is not None and case not in names:
            continue
        home = Home(root / f"services-{case.replace(' ', '-')}", cache)
        kv = Kv(home)
        began = time.monotonic()
        try:
            kv.package()
            ok, outcome = scenario(kv)
        except Exception as exc:  # noqa: BLE001 - a scenario that broke is a row saying so, not a lost report
            ok, outcome = False, f"the scenario failed: {type(exc).__name__}: {exc}"[:200]
        finally:
            kv.down()
        strays = home.strays()
        rows.append({"case": case, "fault": fault, "expected": expected, "ok": ok and not strays, "outcome": outcome,
                     "seconds": round(time.monotonic() - began, 1), "strays": len(strays)})  # fmt: skip
    return rows


@dataclass
class ServiceSummary:
    faults: int
    held: int

    def lines(self) -> list[str]:
        return [
            f"- **Services**: {self.held} of {self.faults} service faults handled as documented (docs/services.md)."
        ]

    def json(self) -> Any:
        return records.dump(self)


class Services:
    name = "services"

    def run(self, setup: Scratch) -> list[ServiceFaultRow]:
        return self.load(run_cases(setup.root, setup.cache, QUICK if setup.quick else None))

    def load(self, data: Any) -> list[ServiceFaultRow]:
        return records.load_all(ServiceFaultRow, data)

    def summarize(self, record: list[ServiceFaultRow]) -> ServiceSummary:
        return ServiceSummary(faults=len(record), held=sum(1 for r in record if r.ok))

    def markdown(self, record: list[ServiceFaultRow]) -> list[str]:
        lines = [
            "## Service faults",
            "",
            "Each fault (`benchmarks/reliability/services.py`) hurts kv-service (tests/fixtures) under its supervisor "
            "in a flakebot home of its own, through the real commands, judged from outside: status.json, /proc, the "
            "port, the data it answers; processes left behind are counted and killed.",
            "",
        ]
        body = [[r.fault, r.expected, yes(r.ok), r.outcome, r.strays, f"{r.seconds:.0f} s"] for r in record]
        return lines + table(["fault", "expected", "held", "outcome", "left running", "time"], body)
