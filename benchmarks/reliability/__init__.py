"""`make reliability`: faults, sandbox escapes, host file access in untrusted trees, processes steered by where they start, bad input, crash points, concurrent crafts, shared catalogs, others' text, limits and service faults, run for real.

One module per section (each a `benchmarks.section.Section`: run, load, summarize, markdown over typed rows);
report.py puts them together as bench/reliability.{json,md} and the README's Reliability section; env.py gives
each scenario its own flakebot home. May import flakebot and benchmarks.scenarios; never tests/.
"""

from __future__ import annotations

from typing import Any

from benchmarks.reliability import (
    catalogs,
    concurrency,
    crashes,
    escapes,
    faults,
    hostfiles,
    inputs,
    limits,
    services,
    steering,
    text,
)
from benchmarks.reliability.env import Scratch
from benchmarks.section import Section, Summary

# The sections, in report order.
SECTIONS: tuple[Section[Scratch, Any, Summary], ...] = (
    faults.Faults(),
    escapes.Escapes(),
    hostfiles.HostFiles(),
    steering.Steering(),
    inputs.Inputs(),
    crashes.Crashes(),
    concurrency.Concurrency(),
    catalogs.Catalogs(),
    text.Text(),
    limits.Limits(),
    services.Services(),
)
NAMES = tuple(section.name for section in SECTIONS)


def section(name: str) -> Section[Scratch, Any, Summary]:
    return next(s for s in SECTIONS if s.name == name)
