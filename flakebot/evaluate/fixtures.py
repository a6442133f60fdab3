"""Sources a need starts from that are made when the suite runs, because they hold absolute paths.

A fixture directory (suite/fixtures/NAME/) holds fixture.json and repo/, the files of a git repository:

    {"crate": "textkit-cli", "version": "0.3.0", "member": "crates/cli", "tag": "textkit-cli-v0.3.0"}

prepare_fixture() commits repo/ to a git repository (tagged), and writes a cargo directory source
holding the member crate as published, its `repository` a file:// URL of that git repository. The
need's craft searches that directory source and clones the repository (`--method git`), as it would
clone a project's repository from GitHub.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

from flakebot.errors import UsageError
from flakebot.source import safegit

logger = logging.getLogger(__name__)

AUTHOR = {"GIT_AUTHOR_NAME": "Upstream Author", "GIT_AUTHOR_EMAIL": "author@example.org"}
AUTHOR |= {"GIT_COMMITTER_NAME": AUTHOR["GIT_AUTHOR_NAME"], "GIT_COMMITTER_EMAIL": AUTHOR["GIT_AUTHOR_EMAIL"]}


def prepare_fixture(source: Path, root: Path) -> Path:
    """Make the fixture at `source` under `root`; returns the directory source to search."""
    info_file = source / "fixture.json"
    if not info_file.is_file():
        raise UsageError(
            f"fixture {source} has no fixture.json", fix="add fixture.json naming crate, version, member and tag"
        )
    info = json.loads(info_file.read_text())
    repository = _commit_repo(source / "repo", root / "repos" / source.name, info["tag"])
    return _directory_source(repository / info["member"], root / "registry", info, repository.as_uri())


def _commit_repo(files: Path, dest: Path, tag: str) -> Path:
    shutil.copytree(files, dest)
    safegit.git(dest, "init", "--quiet", "--template=", "--initial-branch=main", error=UsageError)
    safegit.git(dest, "add", "-A", error=UsageError)
    safegit.git(dest, "commit", "-q", "--no-verify", "-m", "upstream", env=AUTHOR, error=UsageError)
    safegit.git(dest, "tag", tag, error=UsageError)
    return dest


def _directory_source(member: Path, registry: Path, info: dict[str, str], url: str) -> Path:
    """The member crate as a registry would publish it: its manifest with `repository`, and a checksum file."""
    crate = registry / f"{info['crate']}-{info['version']}"
    shutil.copytree(member, crate)
    # Publishing drops `path` from dependencies: the crate then names its siblings by version only.
    manifest = re.sub(r'path\s*=\s*"[^"]*",\s*', "", (crate / "Cargo.toml").read_text())
    (crate / "Cargo.toml").write_text(manifest.replace("[package]\n", f'[package]\nrepository = "{url}"\n', 1))
    (crate / ".cargo-checksum.json").write_text('{"files": {}, "package": ""}')
    return registry
