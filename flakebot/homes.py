"""Where flakebot's own directories (XDG config, data, cache) and rustup's home are: what a process needs of
flakebot.config without its settings (a service's supervisor imports this, never config: benchmarks S5, its memory).
flakebot.config re-exports them."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "flakebot"


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "flakebot"


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flakebot"


@functools.cache
def rustup_home() -> Path:
    """rustup's home: RUSTUP_HOME when set; else the `.rustup` beside the `.cargo/bin` that `cargo` (rustup's proxy)
    is found in on PATH, so a process started with another HOME (hosts that isolate their servers' environment) still
    finds the toolchains; else ~/.rustup. Resolved once per process."""
    if os.environ.get("RUSTUP_HOME"):
        return Path(os.environ["RUSTUP_HOME"])
    for program in ("cargo", "rustup"):
        found = shutil.which(program)
        bin_dir = Path(found).parent if found else None  # not resolved: the proxy links to rustup beside it
        if bin_dir is not None and bin_dir.name == "bin" and (bin_dir.parent.parent / ".rustup").is_dir():
            return bin_dir.parent.parent / ".rustup"
    return Path.home() / ".rustup"
