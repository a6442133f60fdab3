"""The tests' crate registry: a cargo directory source holding exactly the crates of the Debian packages that
scripts/setup.sh installs (scripts/test-crates.txt) and what they depend on, linked from Debian's registry.

Tests search and build against this directory, never against all of /usr/share/cargo/registry, so a developer
who installed more `librust-*-dev` packages sees the same results as a fresh machine (a search for
'kubernetes operator' must not start matching a crate some other work installed).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import tempfile
from pathlib import Path

SYSTEM_REGISTRY = Path("/usr/share/cargo/registry")
PACKAGE_LIST = Path(__file__).resolve().parents[2] / "scripts" / "test-crates.txt"


def listed_packages() -> list[str]:
    """The Debian packages named in scripts/test-crates.txt (comments and blank lines skipped)."""
    lines = (line.split("#", 1)[0].strip() for line in PACKAGE_LIST.read_text().splitlines())
    return [line for line in lines if line]


def package_closure(roots: list[str]) -> list[str]:
    """The installed librust packages `roots` need, following Depends through Provides (dpkg's own records)."""
    listing = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}\\t${Package}\\t${Provides}\\t${Depends}\\n", "librust-*"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return closure(listing, roots)


def closure(listing: str, roots: list[str]) -> list[str]:
    """`roots` and what they depend on, from dpkg-query lines STATUS<TAB>PACKAGE<TAB>PROVIDES<TAB>DEPENDS;
    packages dpkg knows but has not installed are left out (they put no crate into the registry)."""
    provider: dict[str, str] = {}
    depends: dict[str, list[str]] = {}
    for line in listing.splitlines():
        status, name, provides, needs = (line.split("\t") + ["", "", ""])[:4]
        if not status.startswith("ii"):
            continue
        provider[name] = name
        for virtual in _names(provides):
            provider.setdefault(virtual, name)
        depends[name] = [alternatives[0] for alternatives in _alternatives(needs)]
    seen: set[str] = set()
    todo = [provider.get(root, root) for root in roots]
    while todo:
        name = todo.pop()
        if name in seen or name not in depends:
            continue
        seen.add(name)
        todo += [provider[dep] for dep in depends[name] if dep in provider]
    return sorted(seen)


def _names(field: str) -> list[str]:
    return [re.sub(r"\s*\(.*\)", "", part).strip() for part in field.split(",") if part.strip()]


def _alternatives(field: str) -> list[list[str]]:
    return [_names(part.replace("|", ",")) for part in field.split(",") if part.strip()]


def crate_dirs(packages: list[str]) -> list[Path]:
    """The NAME-VERSION folders these packages put into Debian's registry."""
    if not packages:
        return []
    files = subprocess.run(["dpkg-query", "-L", *packages], capture_output=True, text=True, check=False).stdout
    prefix = f"{SYSTEM_REGISTRY}/"
    return sorted(
        {SYSTEM_REGISTRY / line[len(prefix) :].split("/")[0] for line in files.splitlines() if line.startswith(prefix)}
    )


@functools.cache  # asked by every test's settings: dpkg is read once per session
def registry_for_tests() -> Path:
    """A directory of links to the test crates, made once per set of crates (a new set, a new directory)."""
    dirs = crate_dirs(package_closure(listed_packages()))
    digest = hashlib.sha256("\n".join(map(str, dirs)).encode()).hexdigest()[:12]
    target = Path(tempfile.gettempdir()) / f"flakebot-test-registry-{digest}"
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix="flakebot-test-registry-", dir=target.parent))
    for crate in dirs:
        (staging / crate.name).symlink_to(crate)
    staging.chmod(0o755)  # Nix build users and the sandbox's uid read it
    try:
        os.rename(staging, target)
    except OSError:  # another test process made it first: the same links
        for link in staging.iterdir():
            link.unlink()
        staging.rmdir()
    return target
