"""Attacks on the host's file access in trees someone else wrote, each judged from outside: a root-owned 0600 file
and a directory beyond the tree must keep their bytes, and flakebot must not hang.

A dependency's build script (run for real in the sandboxed dependency-cache build), a repository cloned over file://,
the crate the acceptance test is written into and a file:// shared cache whose owner planted links are each given
a link, a hard link, a FIFO or a link swapped in while flakebot works, where flakebot expects a plain file or
directory; a tool's caller names a configuration directory as its writable path, or tries to widen the grant roots
(grant_cases.py, the door "tool grants"). A deps derivation's store path (made with nix-store --add, as anyone who
may add to the store can) whose target/, a deeper part, or the path itself is a link to a host directory is named by
the loop's index, and a file:// cache's nar/ or nix-cache-info is a link when `publish` runs nix copy; there the
judge also looks in the tree the model's code reads (the loop's target dir) for the host's bytes or a link out.
`run_hostfile_cases(root, names)` runs each case in a child process with a timeout (a FIFO that blocks
flakebot would otherwise block the report) and returns one row per case; tests/test_safefs.py asserts every row and
the reliability report (benchmarks/reliability/hostfiles.py) counts them.

    python -m benchmarks.scenarios.hostfile_cases CASE DIR    one case in DIR, its row as JSON on stdout
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.scenarios.gitserve import bare_from, crate_manifest, git, library_source, write
from benchmarks.scenarios.grant_cases import GRANT_ATTACKS

CHECKOUT = Path(__file__).resolve().parents[2]

SECRET = b"root's own file: must never change\n"
AT_FDCWD, RENAME_EXCHANGE = -100, 2
CASE_TIMEOUT = 180.0  # seconds; the dependency-cache case builds a crate in the sandbox


@dataclass
class World:
    """One case's files: the victim outside every tree, a directory outside, and room for the tree itself."""

    root: Path

    @property
    def victim(self) -> Path:
        return self.root / "root-owned-0600"

    @property
    def outside(self) -> Path:
        return self.root / "outside"

    def make(self) -> World:
        self.victim.write_bytes(SECRET)
        self.victim.chmod(0o600)
        self.outside.mkdir()
        return self

    @property
    def read_by_others(self) -> Path:
        """A tree flakebot fills for someone else to read (the edit loop's target dir): the victim's bytes must not
        appear there."""
        return self.root / "read-by-others"

    def judge(self, said: str) -> tuple[bool, str]:
        """Contained when the victim kept its bytes, nothing appeared outside and no copy of the victim's bytes is in
        the tree others read; `said` is what flakebot answered."""
        changed = self.victim.read_bytes() != SECRET
        appeared = sorted(str(p.relative_to(self.outside)) for p in self.outside.rglob("*"))
        readers = self.read_by_others
        leaked = readers.exists() and any(
            (p.is_file() and not p.is_symlink() and p.read_bytes() == SECRET)
            or (p.is_symlink() and not p.resolve().is_relative_to(readers.resolve()))
            for p in readers.rglob("*")
        )
        if changed or appeared or leaked:
            what = "the root-owned file was rewritten" if changed else f"{', '.join(appeared)} appeared outside"
            what = "the host's files were copied (or linked) where the model's code reads" if leaked else what
            return False, f"{what} ({said or 'no error'})"
        return True, said or "done, nothing outside touched"


@dataclass(frozen=True)
class Case:
    name: str
    door: str
    attempt: str
    expected: str
    attack: Callable[[World], str]  # sets the tree up, runs flakebot's host step; what flakebot said ('' if nothing)
    needs: tuple[str, ...] = ()


def _said(step: Callable[[], object]) -> str:
    from flakebot.errors import FlakebotError

    try:
        step()
    except FlakebotError as exc:
        return f"refused: {exc.message}"
    return ""


# ---------------------------------------------------------------- the dependency cache

EVIL_BUILD_RS = """
use std::path::PathBuf;
fn main() {{
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let target = out.ancestors().nth(4).unwrap(); // target/debug/build/NAME-HASH/out
    std::os::unix::fs::symlink("{victim}", target.join("flakebot-deps.json")).unwrap();
    std::os::unix::fs::symlink("{victim}", target.join("debug/libdeps_skeleton-planted")).unwrap();
    println!("cargo:rerun-if-changed=build.rs");
}}
"""


def evil_registry(root: Path, victim: Path) -> Path:
    """A cargo directory source holding one crate whose build script plants links in the target dir it runs for."""
    crate = root / "registry" / "evil-build-0.1.0"
    write(
        crate,
        {
            "Cargo.toml": crate_manifest("evil-build", "0.1.0"),
            "build.rs": EVIL_BUILD_RS.format(victim=victim),
            "src/lib.rs": "pub fn f() {}\n",
            ".cargo-checksum.json": '{"files":{},"package":"Could not get crate checksum"}',
        },
    )
    return root / "registry"


def _dependency_cache(w: World) -> str:
    from flakebot.cargo.depcache import seed_target_dir
    from flakebot.cargo.runner import Cargo
    from flakebot.config import load

    registry = evil_registry(w.root, w.victim)
    crate = w.root / "tool"
    manifest = crate_manifest("tool", "0.1.0", 'evil-build = "0.1.0"\n')
    write(crate, {"Cargo.toml": manifest, "src/main.rs": "fn main() {}\n"})
    cargo = Cargo(target_dir=w.root / "t", offline=True, registry_dir=registry)
    locked = cargo.run(["generate-lockfile"], crate)
    if locked.returncode != 0:
        raise RuntimeError(f"cargo generate-lockfile failed: {locked.stderr[-500:]}")
    seeded = seed_target_dir(load(), cargo, crate, w.root / "t", isolated=True)
    return f"dependency cache {seeded.status}"


# ---------------------------------------------------------------- a forked repository, the acceptance test


def linked_repo(root: Path, outside: Path) -> str:
    """A bare repository (file://) of a crate whose `tests` is a link to a directory outside the tree."""
    work = root / "work-linked"
    write(work, {"Cargo.toml": crate_manifest("linked", "0.1.0"), "src/lib.rs": library_source("0.1.0")})
    (work / "tests").symlink_to(outside)
    git("init", "--quiet", "--initial-branch=main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "--quiet", "-m", "release 0.1.0", cwd=work)
    return bare_from(work, root / "linked.git").as_uri()


def _clone(w: World) -> str:
    from flakebot.config import Settings
    from flakebot.crates import CrateInfo
    from flakebot.source.acquisition import acquire

    url, dest = linked_repo(w.root, w.outside), w.root / "workspace"
    crate = CrateInfo(name="linked", version="0.1.0", repository=url)
    said = _said(lambda: acquire(crate, dest, branch="b", settings=Settings()))
    if not said:  # taken: what the next host step (the spec's acceptance test) does with it
        said = _said(lambda: _write_acceptance(dest)) or "acquired, and the acceptance test written"
    return said


def _write_acceptance(crate: Path) -> None:
    from flakebot.agent.acceptance import write_acceptance_test
    from flakebot.toolspec import Example, ToolSpec

    write_acceptance_test(ToolSpec(name="linked", summary="s", usage="linked", examples=[Example([], "")]), crate)


def _acceptance_at(plant: Callable[[World, Path], None]) -> Callable[[World], str]:
    def attack(w: World) -> str:
        from flakebot.agent.acceptance import ACCEPTANCE_TEST

        crate = w.root / "crate"
        (crate / "tests").mkdir(parents=True)
        plant(w, crate / ACCEPTANCE_TEST)
        return _said(lambda: _write_acceptance(crate))

    return attack


def _tests_link(w: World, path: Path) -> None:
    path.parent.rmdir()
    path.parent.symlink_to(w.outside)


def exchange(a: Path, b: Path) -> None:
    """Swap two names atomically (renameat2 RENAME_EXCHANGE): the path is always there, a directory or a link."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2", str(a))


def flipping(directory: Path, outside: Path) -> tuple[threading.Event, threading.Thread]:
    """A thread that swaps `directory` with a link to `outside` as fast as it can, until the event is set."""
    link, stop = directory.with_name(directory.name + ".link"), threading.Event()
    link.symlink_to(outside)

    def flip() -> None:
        while not stop.is_set():
            exchange(directory, link)

    thread = threading.Thread(target=flip)
    thread.start()
    return stop, thread


def _swapped_tests(w: World) -> str:
    """`tests` flips between a real directory and a link out, thousands of times, while flakebot writes into it."""
    crate = w.root / "crate"
    (crate / "tests").mkdir(parents=True)
    stop, flipper = flipping(crate / "tests", w.outside)
    refused = written = 0
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            if _said(lambda: _write_acceptance(crate)):
                refused += 1
            else:
                written += 1
    finally:
        stop.set()
        flipper.join()
    return f"{written} writes landed inside, {refused} refused"


# ---------------------------------------------------------------- a shared catalog directory


def _shared_at(rel: str, plant: Callable[[World, Path], None]) -> Callable[[World], str]:
    def attack(w: World) -> str:
        from flakebot.deliver import shared

        cache = w.root / "cache"
        path = cache / shared.PREFIX / rel
        path.parent.mkdir(parents=True)
        plant(w, path)
        entry = w.root / "entry"
        write(entry, {"manifest.json": '{"summary": "s"}', "USAGE.md": "# t\n", "flake/flake.nix": "{}\n"})
        record = {
            "store_path": "/nix/store/00000000000000000000000000000000-tool",
            "entry_path": "/nix/store/11111111111111111111111111111111-flakebot-entry-tool-0.1.0",
            "nar_hash": "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "paths": 1,
            "closure_size": 1,
            "published_at": 1.0,
        }
        tool = {"name": "tool", "version": "0.1.0", "need": "a tool", "dir": str(entry)}
        return _said(lambda: shared.add_entry(cache.as_uri(), tool, record, index_key()))

    return attack


def index_key() -> Any:
    """A publisher's key for a shared cache's signed index (a fresh Nix key pair), as `flakebot publish` makes one."""
    from flakebot.deliver import shared
    from flakebot.deliver.signatures import public_key
    from flakebot.nix import command

    argv = [command.nix_program(), *command.FEATURES, "key", "generate-secret", "--key-name", "hostfiles-1"]
    secret = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    return shared.IndexKey(secret, [public_key(secret)], 3600.0)


def _manifest_fifo(w: World) -> str:
    from flakebot.cargo.sources import lock_refusal

    crate = w.root / "crate"
    write(crate, {"Cargo.toml": crate_manifest("crate", "0.1.0")})
    os.mkfifo(crate / "Cargo.lock")
    return lock_refusal(crate / "Cargo.lock", ()) or "read"


def _link_to_victim(w: World, path: Path) -> None:
    path.symlink_to(w.victim)


def _link_outside(w: World, path: Path) -> None:
    path.symlink_to(w.outside)


def _hard_link(w: World, path: Path) -> None:
    os.link(w.victim, path)


def _fifo(_w: World, path: Path) -> None:
    os.mkfifo(path)


# ---------------------------------------------------------------- a deps derivation's store path (nix/loopdeps.py)


def _store_output(w: World, links: dict[str, str]) -> Path:
    """A store path named like a deps output (nix-store --add), holding `links` (path -> target) and a real file."""
    made = w.root / "made" / f"x{os.getpid()}-cargo-deps-0"
    (made / "target" / "release").mkdir(parents=True)
    (made / "target" / "release" / "ok").write_text("ok\n")
    for rel, target in links.items():
        (made / rel).parent.mkdir(parents=True, exist_ok=True)
        if (made / rel).is_dir():
            shutil.rmtree(made / rel)
        (made / rel).symlink_to(target)
    return _store_add(made)


def _store_add(path: Path) -> Path:
    done = subprocess.run(["nix-store", "--add", str(path)], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def _deps_index(make: Callable[[World, Path], Path]) -> Callable[[World], str]:
    """The index entry (cache_dir/deps-derivations/KEY) names the store path `make` returns; the loop seeds from it."""

    def attack(w: World) -> str:
        from flakebot.nix.loopdeps import copy_output, indexed

        host = w.root / "host-dir"  # a host directory holding a copy of the root-owned file, at every depth tried
        for rel in ("", "target", "target/release"):
            (host / rel).mkdir(parents=True, exist_ok=True)
            (host / rel / "planted").write_bytes(SECRET)
        root = w.root / "cache" / "deps-derivations" / "key"
        root.parent.mkdir(parents=True)
        root.symlink_to(make(w, host))
        output = indexed(root)
        if output is None:
            return "the index entry was not taken (it does not name a deps output in the store)"
        return _said(lambda: copy_output(output, w.read_by_others)) or "copied"

    return attack


def _store_path_itself_a_link(w: World, host: Path) -> Path:
    made = w.root / "made" / f"x{os.getpid()}-cargo-deps-0"
    made.parent.mkdir(parents=True)
    made.symlink_to(host)
    return _store_add(made)


# ---------------------------------------------------------------- nix copy into a file:// cache (deliver/publish.py)


def _publish_into(plant: Callable[[World, Path], None]) -> Callable[[World], str]:
    """`flakebot publish` (the library call the CLI makes) of a small catalogued tool into a cache with `plant`."""

    def attack(w: World) -> str:
        from flakebot import config
        from flakebot.deliver.catalog import Catalog
        from flakebot.deliver.publish import publish

        note = w.root / "note.txt"
        note.write_text(f"a note {os.getpid()} {time.time()}\n")
        store_path = str(_store_add(note))
        (w.root / "flake").mkdir()
        manifest = {"name": "note", "summary": "a note", "main_program": "note", "store_path": store_path}
        settings = config.load()
        Catalog.open(settings).add(
            "note", need="need a note", flake_dir=w.root / "flake", manifest=manifest, usage_md="# note\n",
            store_path=store_path, run_id="reliability", origin={},
        )  # fmt: skip
        cache = w.root / "cache"
        cache.mkdir()
        plant(w, cache)
        return _said(lambda: publish("note", cache.as_uri(), settings)) or "published"

    return attack


REFUSED = "refused with one line naming the path; the file outside unchanged"
REPLACED = "the planted entry replaced (never written through); the file outside unchanged"
CASES = [
    Case(
        "depcache-info-link",
        "dependency cache",
        "a dependency's build script (sandboxed) makes target/flakebot-deps.json a link to a root-owned file",
        "the entry's info file replaces the link; the root-owned file unchanged",
        _dependency_cache,
        needs=("bwrap", "cargo"),
    ),
    Case(
        "clone-tests-link",
        "forked repository",
        "a repository (file://) whose tests/ is a link to a directory outside",
        "acquisition refuses the link; nothing written outside",
        _clone,
    ),
    Case(
        "acceptance-tests-link",
        "workspace",
        "the crate's tests/ is a link out when the acceptance test is written",
        REFUSED,
        _acceptance_at(_tests_link),
    ),
    Case(
        "acceptance-file-link",
        "workspace",
        "the acceptance test's own name is a link to a root-owned file",
        REPLACED,
        _acceptance_at(_link_to_victim),
    ),
    Case(
        "acceptance-hard-link",
        "workspace",
        "the acceptance test's name is a hard link to a root-owned file",
        REPLACED,
        _acceptance_at(_hard_link),
    ),
    Case(
        "acceptance-fifo",
        "workspace",
        "the acceptance test's name is a FIFO (a blocking write would hang flakebot)",
        REPLACED,
        _acceptance_at(_fifo),
    ),
    Case(
        "acceptance-swapped-link",
        "workspace",
        "tests/ flips between a directory and a link out while the acceptance test is written (check-then-use)",
        "every write lands inside or is refused",
        _swapped_tests,
    ),
    Case(
        "manifest-fifo",
        "workspace",
        "Cargo.lock is a FIFO when the host checks the lock's sources",
        "refused at once, no hang",
        _manifest_fifo,
    ),
    Case(
        "publish-lock-link",
        "shared cache",
        "the cache's flakebot/.lock is a link to a root-owned file",
        REFUSED,
        _shared_at(".lock", _link_to_victim),
        needs=("nix",),
    ),
    Case(
        "publish-lock-hard-link",
        "shared cache",
        "the cache's flakebot/.lock is a hard link to a root-owned file",
        "locked, never truncated; the file outside unchanged",
        _shared_at(".lock", _hard_link),
        needs=("nix",),
    ),
    Case(
        "publish-tools-link",
        "shared cache",
        "the cache's flakebot/tools is a link to a directory outside",
        REFUSED,
        _shared_at("tools", _link_outside),
        needs=("nix",),
    ),
    Case(
        "publish-tool-dir-link",
        "shared cache",
        "the cache's flakebot/tools/NAME is a link to a directory outside",
        REFUSED,
        _shared_at("tools/tool", _link_outside),
        needs=("nix",),
    ),
    Case(
        "publish-index-fifo",
        "shared cache",
        "the cache's flakebot/index.json is a FIFO (a blocking read would hang publish)",
        "refused at once, no hang",
        _shared_at("index.json", _fifo),
        needs=("nix",),
    ),
]
CASES += [
    Case(
        "deps-index-target-link",
        "deps derivation index",
        "the index names a store path whose target/ is a link to a host directory",
        "not taken, or refused; nothing of the host directory in the loop's target dir",
        _deps_index(lambda w, host: _store_output(w, {"target": str(host)})),
        needs=("nix-store",),
    ),
    Case(
        "deps-index-deep-link",
        "deps derivation index",
        "the store path's target/release/x is a link to a host directory",
        "refused; nothing of the host directory in the loop's target dir",
        _deps_index(lambda w, host: _store_output(w, {"target/release/x": str(host)})),
        needs=("nix-store",),
    ),
    Case(
        "deps-index-store-path-link",
        "deps derivation index",
        "the store path itself is a link to a host directory",
        "not taken; nothing of the host directory in the loop's target dir",
        _deps_index(_store_path_itself_a_link),
        needs=("nix-store",),
    ),
    Case(
        "publish-nar-link",
        "shared cache (nix copy)",
        "the cache's nar/ is a link to a directory outside when nix copy runs",
        REFUSED,
        _publish_into(lambda w, cache: (cache / "nar").symlink_to(w.outside)),
        needs=("nix",),
    ),
    Case(
        "publish-cache-info-link",
        "shared cache (nix copy)",
        "the cache's nix-cache-info is a dangling link to a file outside",
        REPLACED,
        _publish_into(lambda w, cache: (cache / "nix-cache-info").symlink_to(w.outside / "made-by-nix")),
        needs=("nix",),
    ),
]
CASES += [Case(name, "tool grants", attempt, expected, attack) for name, attempt, expected, attack in GRANT_ATTACKS]
QUICK = [
    "clone-tests-link",
    "acceptance-file-link",
    "publish-lock-link",
    "publish-index-fifo",
    "deps-index-target-link",
    "grant-etc-nix",
    "grant-mcp-argument",
]


def run_hostfile_cases(root: Path, names: list[str] | None = None) -> list[dict[str, Any]]:
    """Each case (or those named) in its own directory under `root`, in a child process; one row each."""
    rows = []
    for case in CASES:
        if names is not None and case.name not in names:
            continue
        missing = [program for program in case.needs if shutil.which(program) is None]
        if missing:
            continue
        rows.append(_run_child(root / case.name, case))
    return rows


def _run_child(directory: Path, case: Case) -> dict[str, Any]:
    directory.mkdir(parents=True)
    home = {f"XDG_{k}_HOME": str(directory / "home" / k.lower()) for k in ("CONFIG", "DATA", "CACHE", "STATE")}
    env = {**os.environ, **home, "FLAKEBOT_WORKDIR": str(directory / "home/work")}
    started = time.monotonic()
    argv = [sys.executable, "-m", "benchmarks.scenarios.hostfile_cases", case.name, str(directory)]
    try:
        # from the checkout: `benchmarks` is importable there whatever the caller's working directory
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CASE_TIMEOUT, env=env, cwd=CHECKOUT)
        last = done.stdout.strip().splitlines()[-1:] or [""]
        result = json.loads(last[0]) if done.returncode == 0 and last[0] else None
        if result is None:
            result = {"contained": False, "outcome": f"the case failed to run: {done.stderr.strip()[-300:]}"}
    except subprocess.TimeoutExpired:
        result = {"contained": False, "outcome": f"flakebot hung (killed after {CASE_TIMEOUT:g} s)"}
    row = {"case": case.name, "door": case.door, "attempt": case.attempt, "expected": case.expected}
    return {**row, **result, "seconds": round(time.monotonic() - started, 2)}


def main(name: str, directory: Path) -> None:
    case = next(c for c in CASES if c.name == name)
    world = World(directory).make()
    said = case.attack(world)
    contained, outcome = world.judge(said)
    outcome = outcome.replace(str(directory), "CASE_DIR")  # the row reads the same on every run
    print(json.dumps({"contained": contained, "outcome": outcome[:400]}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
