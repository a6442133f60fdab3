"""Whose CPU a phase of a benchmark spent: every process on the machine, read from /proc, summed per owner.

A sampler thread reads /proc/PID/stat of every process (own user + system time, and its reaped children's) every
SAMPLE_SECONDS from a phase's start to its end. A process's CPU in the phase is its own time plus its reaped
children's at the end minus at the start (zero for one born in the phase); a process that ended in the phase shows
up in its parent's children's time with its whole life, so what it had spent before the phase is taken off again.
Each process is owned by the nearest ancestor that is a named root (the workers, PostgreSQL's postmaster, the
benchmark itself), else by the kernel (its threads) or "other" (every other process of the machine: other sessions'
work). The kernel's interrupt time (/proc/stat irq + softirq) is counted apart: it belongs to no process.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

SAMPLE_SECONDS = 0.5  # short-lived processes need no sample: their time reaches their parent's children's time
TICK = os.sysconf("SC_CLK_TCK")
KTHREADD = 2  # the parent of every kernel thread


@dataclass
class Seen:
    """One process as sampled: its parent, name, and its own and reaped children's CPU ticks, first and last."""

    ppid: int  # as first seen: an orphan's parent becomes pid 1, its owner stays its first parent's
    session: int  # an orphan first seen after its parent ended is owned by its session's leader, if a root
    comm: str
    first: int  # own + children ticks at the first sample that saw it
    last: int
    own_first: int
    own_last: int
    at_start: bool  # alive at the phase's start (its time before then is not the phase's)
    orphan: bool = False  # its parent ended first: pid 1 reaps it, and its time shows in pid 1's children's


def read_stat(pid: str) -> tuple[int, int, int, str, int, int] | None:
    """(start time, ppid, session, comm, own ticks, reaped children's ticks) of /proc/PID/stat, None if it ended."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return (
        int(fields[19]),
        int(fields[1]),
        int(fields[3]),
        comm,
        own,
        int(fields[13]) + int(fields[14]),
    )  # cutime, cstime (16, 17)


def pressure() -> dict[str, float]:
    """Seconds some task waited, since boot, for a CPU and for I/O (/proc/pressure: PSI's `some` totals)."""
    found = {}
    for kind in ("cpu", "io"):
        try:
            line = Path(f"/proc/pressure/{kind}").read_text().splitlines()[0]
        except OSError:
            continue
        found[kind] = int(line.rsplit("total=", 1)[1]) / 1e6
    return found


def interrupt_ticks() -> int:
    with open("/proc/stat") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:]]
    return ticks[5] + ticks[6]  # irq, softirq


class CpuOwners(threading.Thread):
    """Samples every process from start() to stop(); `owners(roots)` then says whose CPU-seconds the phase spent."""

    def __init__(self) -> None:
        super().__init__(name="cpu-owners", daemon=True)
        self.stopped = threading.Event()
        self.seen: dict[tuple[int, int], Seen] = {}
        self.alive: set[tuple[int, int]] = set()
        self.interrupts = 0

    def start(self) -> None:
        self.interrupts = interrupt_ticks()
        self.sample(first=True)
        super().start()

    def run(self) -> None:
        while not self.stopped.wait(SAMPLE_SECONDS):
            self.sample()

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.sample()
        self.interrupts = interrupt_ticks() - self.interrupts
        alive = {int(p) for p in os.listdir("/proc") if p.isdigit()}
        self.alive = {key for key in self.seen if key[0] in alive}

    def sample(self, first: bool = False) -> None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            stat = read_stat(pid)
            if stat is None:
                continue
            start, ppid, session, comm, own, children = stat
            key = (int(pid), start)
            was = self.seen.get(key)
            if was is None and not first and ppid == 1 and session != int(pid):  # orphaned before we saw it
                self.seen[key] = Seen(ppid, session, comm, 0, own + children, 0, own, False, orphan=True)
            elif was is None:
                self.seen[key] = Seen(ppid, session, comm, 0 if not first else own + children, own + children,
                                      0 if not first else own, own, first)  # fmt: skip
            else:
                was.last, was.own_last, was.orphan = own + children, own, was.orphan or ppid == 1 != was.ppid

    def spent(self, key: tuple[int, int]) -> tuple[int, int]:
        """A process's own and its reaped children's ticks in the phase (see the module's docstring)."""
        s = self.seen[key]
        if key in self.alive or s.orphan:  # an orphan's last sample is near its end: counted as seen
            return s.own_last - s.own_first, (s.last - s.own_last) - (s.first - s.own_first)
        # its life is in its parent's children's time: only its time before the phase comes off
        return (-s.own_first, -(s.first - s.own_first)) if s.at_start else (0, 0)

    def top(self, roots: dict[int, str], count: int = 8) -> list[str]:
        """The processes that spent the most in the phase (children included): 'owner: name pid seconds'."""
        parent = self.parents(roots)
        ranked = sorted(self.seen, key=lambda key: -sum(self.spent(key)))[:count]
        return [f"{_owner(k[0], parent, roots)}: {self.seen[k].comm} {k[0]} {sum(self.spent(k)) / TICK:.2f}"
                for k in ranked]  # fmt: skip

    def parents(self, roots: dict[int, str]) -> dict[int, int]:
        """Each process's parent as first seen; an orphan first seen with pid 1 for its parent: its session's
        leader when that is a root (the workers start their sessions), else pid 1."""
        parent = {pid: s.ppid for (pid, _), s in self.seen.items()}
        for (pid, _), s in self.seen.items():
            if s.orphan and s.ppid == 1 and s.session in roots and s.session != 1:
                parent[pid] = s.session
        return parent

    def owners(self, roots: dict[int, str], split: frozenset[str] = frozenset()) -> dict[str, float]:
        """CPU-seconds per owner; a root named in `split`: its own processes as '<name> itself', the descendants
        they reaped as "<name>' children", the others (orphans pid 1 reaped, those running at the end) apart."""
        parent = self.parents(roots)
        spent: dict[str, float] = {}
        for key, s in self.seen.items():
            own, children = self.spent(key)
            name = _owner(key[0], parent, roots)
            if key[0] in roots and name in split:
                _add(spent, f"{name} itself", own)
                _add(spent, f"{name}' children", children)
            elif name in split:  # an orphan pid 1 reaped, or one still running at the end
                _add(spent, f"{name}' processes no {name} reaped", own + children)
            else:
                _add(spent, name, own + children)
            if s.orphan and key not in self.alive:  # pid 1 reaped its whole life: the phase's part is counted
                _add(spent, _owner(1, parent, roots), -s.last)  # above, under its owner; before the phase, nobody's
        spent["kernel interrupts (irq, softirq)"] = self.interrupts
        return {k: round(v / TICK, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if round(v / TICK, 2)}


def _add(spent: dict[str, float], name: str, ticks: float) -> None:
    spent[name] = spent.get(name, 0) + ticks


def _owner(pid: int, parent: dict[int, int], roots: dict[int, str]) -> str:
    hops = 0
    while pid not in roots and hops < 64:
        if pid == KTHREADD or parent.get(pid) == KTHREADD:
            return "kernel threads"
        if pid not in parent or pid <= 1:
            return "other processes"
        pid, hops = parent[pid], hops + 1
    return roots.get(pid, "other processes")
