"""Many catalogued tools made cheaply: one small tool (a shell script with a clap-style --help) catalogued through
`Catalog.add` under many names, each with its own flake copy, manifest, USAGE.md and GC root, as a craft catalogues
it; nothing is built N times. The catalog benchmark (benchmarks/perf/catalog.py) and the MCP tests use it."""

from __future__ import annotations

import subprocess
from pathlib import Path

HELP = """A stand-in for a crafted tool

Usage: {name} [OPTIONS] [FILES]...

Arguments:
  [FILES]...  Input files (standard input when none)

Options:
  -d, --delimiter <DELIMITER>  Field delimiter [default: ,]
  -k, --key <KEY>              Columns that make a row's key
      --ignore-case            Compare keys case-insensitively
  -o, --output <OUTPUT>        Write here instead of standard output
  -h, --help                   Print help
  -V, --version                Print version
"""


def store_path(root: Path, nix: bool) -> str:
    """The tool's store path: a script added to the Nix store (or, without nix, its directory as it is)."""
    tool = root / "tool"
    (tool / "bin").mkdir(parents=True)
    (tool / "bin/stand-in").write_text('#!/bin/sh\necho "$@"\n')
    (tool / "bin/stand-in").chmod(0o755)
    if not nix:
        return str(tool)
    added = subprocess.run(["nix-store", "--add", str(tool)], capture_output=True, text=True, check=True)
    return added.stdout.strip()


class Tools:
    """Catalog entries of the one stand-in tool under many names, in the catalog of the flakebot home `root`
    (XDG_DATA_HOME=root/data)."""

    def __init__(self, root: Path, store: str) -> None:
        from flakebot.deliver.catalog import Catalog

        self.catalog = Catalog(root / "data" / "flakebot")
        self.store = store
        self.flake = root / "flake"
        self.flake.mkdir(parents=True)
        (self.flake / "flake.nix").write_text("{ }\n")
        self.count = 0

    def add(self, name: str) -> None:
        manifest = {
            "format": 1, "name": name, "main_program": "stand-in", "summary": f"{name}: dedupe rows of CSV files",
            "usage": f"{name} [OPTIONS] [FILES]...", "help_text": HELP.format(name=name), "store_path": self.store,
            "nix_run_argv": ["nix", "run", f"{self.catalog.root}/tools/{name}/0.1.0/flake"],
        }  # fmt: skip
        self.catalog.add(name, need=f"{name} rows", flake_dir=self.flake, manifest=manifest,
                         usage_md=f"# {name}\n", store_path=self.store, run_id=f"bench-{name}", origin={})  # fmt: skip

    def grow(self, size: int) -> None:
        while self.count < size:
            self.count += 1
            self.add(f"t{self.count:05d}")
