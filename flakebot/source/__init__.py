"""Acquisition: the chosen crate's source as a git workspace the agent can edit, test and push.

    acquire.py   acquire(): local copy, git clone (version tag), GitHub fork, or .crate archive
    newcrate.py  new_crate(): a new binary crate depending on a library
    stage.py     the pipeline's acquire stage; release_fork() and push_branch() for the end of a craft
    gitrepo.py   GitPython helpers (safe clone, tags, init + commit, push)
    layout.py    cargo metadata: where the crate sits in a checkout
    tree.py      which files of a published crate the workspace keeps
    archive.py   .crate download (crates.io client) and safe extraction

May import flakebot.config, errors, fsutil, cargo, run, github and crates (CrateInfo, the crates.io client).
"""

from __future__ import annotations

from flakebot.source.acquire import METHODS, acquire
from flakebot.source.newcrate import new_crate
from flakebot.source.stage import acquire_stage, prepare_cargo, push_branch, release_fork, release_run_forks

__all__ = ["METHODS", "acquire", "acquire_stage", "new_crate", "prepare_cargo", "push_branch", "release_fork", "release_run_forks"]
