"""Acquisition: the chosen crate's source as a git workspace the agent can edit, test and push.

    acquisition.py  acquire(): local copy, git clone (version tag), GitHub fork, or .crate archive
    newcrate.py  new_crate(): a new binary crate depending on a library
    remote.py    release_fork() and push_branch(): the end of a craft that started from a repository
    github.py    the GitHub REST calls (fork, poll, delete) over httpx
    gitrepo.py   workspace git: clone, tags, init + commit, push (all through safegit)
    safegit.py   every host git call in flakebot: hardened config, minimal env, nested .git swept
    tree.py      which files of a published crate the workspace keeps
    archive.py   .crate download (crates.io client) and safe extraction

May import flakebot.config, errors, fsutil, cargo, pipeline.run and crates (CrateInfo, the crates.io client).
"""
