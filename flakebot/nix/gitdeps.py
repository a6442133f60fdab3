"""Git dependencies of a Cargo.lock as nixpkgs' importCargoLock fetches them: one fixed-output clone per locked
commit, named as fetchgit names it, hashed by cargoLock.outputHashes."NAME-VERSION" (templates/standin/rust.nix
does the same offline)."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from flakebot.errors import NixError
from flakebot.nix import build_inputs

FAKE_HASH = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="  # nixpkgs' lib.fakeHash
_GIT_SOURCE = re.compile(r"git\+([^?]+)(?:\?(?:rev|tag|branch)=.*)?#(.*)")
_ARCHIVE_SUFFIX = re.compile(r"(.*)\.(?:git|tar|zip|gz|tgz|bz|tbz|bz2|tbz2|lzma|txz|xz|zstd)")
_STORE_PREFIX = re.compile(r"^[0-9a-z]{32}-")
_SRI_SHA256 = re.compile(r"sha256-[A-Za-z0-9+/]{43}=")


def fetch_name(source: str) -> str | None:
    """The name fetchgit gives the clone of a lock's `git+URL[?rev=..]#COMMIT` source (None for other sources): the
    repository's base name less `.git` and the like, a dash, the commit's first 7 digits (as lib.sources.urlToName)."""
    match = _GIT_SOURCE.fullmatch(source)
    if match is None:
        return None
    url, commit = match.groups()
    base = posixpath.basename(url.split(":")[-1].removesuffix("/"))
    while (stripped := _ARCHIVE_SUFFIX.fullmatch(base)) is not None:
        base = stripped.group(1)
    return f"{base}-{commit[:7]}"


def fetched_by(drv: str, lock_file: Path) -> list[str]:
    """The NAME-VERSION keys of the lock's git packages that the fixed-output derivation `drv` clones (a workspace
    repository gives several); none when `drv` is no git fetch of this lock or there is no readable lock."""
    name = _STORE_PREFIX.sub("", Path(drv).name).removesuffix(".drv")
    try:
        packages = build_inputs.lock_packages(lock_file) if lock_file.is_file() else []
    except NixError:
        return []
    return [f"{p['name']}-{p['version']}" for p in packages if fetch_name(str(p.get("source", ""))) == name]


def is_sri_sha256(text: str) -> bool:
    """Whether `text` is a sha256 as nix prints it (SRI), fit for an outputHashes entry."""
    return _SRI_SHA256.fullmatch(text) is not None
