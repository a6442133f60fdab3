"""A cargo directory source searched offline: Debian's /usr/share/cargo/registry, a `cargo vendor` folder.

Each sub-directory holding a Cargo.toml with a [package] name and version is one crate version.
The parsed index is cached under the cache directory, keyed by the source's path and state (its
directory mtime and entry names: directory sources are append-only, a crate's files never change
in place), so a repeated search reads one JSON file instead of every Cargo.toml.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tomllib
from pathlib import Path
from typing import Any

from flakebot.crates import Candidate, CrateInfo
from flakebot.crates.rank import Ranker, normal_name, version_key
from flakebot.errors import SearchError
from flakebot.fsutil import atomic_write_text

logger = logging.getLogger(__name__)

INDEX_FORMAT = 1
_HEX64 = frozenset("0123456789abcdef")


class LocalRegistry:
    """The crates of one cargo directory source, indexed once and ranked with rank.Ranker."""

    name = "local"

    def __init__(self, path: Path, cache_dir: Path) -> None:
        self.path = Path(path).expanduser().resolve()
        self.cache_dir = Path(cache_dir)
        if not self.path.exists():
            raise SearchError(
                f"registry path {self.path} does not exist",
                fix="give a cargo directory source (e.g. /usr/share/cargo/registry or a 'cargo vendor' folder)",
            )
        if not self.path.is_dir():
            raise SearchError(
                f"registry path {self.path} is not a directory", fix="give a cargo directory source folder, not a file"
            )
        self._entries: list[CrateInfo] | None = None
        self._ranker: Ranker | None = None

    def entries(self) -> list[CrateInfo]:
        """Every crate version in the source (from the cache when the source is unchanged)."""
        if self._entries is None:
            self._entries = self._load()
        return self._entries

    def ranker(self) -> Ranker:
        if self._ranker is None:
            self._ranker = Ranker(self.entries())
        return self._ranker

    def search(self, query: str, limit: int = 10) -> list[Candidate]:
        return self.ranker().search(query, limit)

    def get(self, name: str, version: str | None = None) -> CrateInfo:
        """One crate version (the newest when `version` is None); `path` is its directory."""
        versions = [c for c in self.entries() if normal_name(c.name) == normal_name(name)]
        if not versions:
            raise SearchError(
                f"crate '{name}' is not in the local registry {self.path}",
                fix="search for it with 'flakebot search' or install it (apt-get install librust-<name>-dev)",
            )
        if version is None:
            return max(versions, key=lambda c: version_key(c.version))
        for crate in versions:
            if crate.version == version:
                return crate
        have = ", ".join(sorted((c.version for c in versions), key=version_key))
        raise SearchError(
            f"crate '{name}' has no version {version} in {self.path} (have {have})", fix=f"pick one of: {have}"
        )

    def _cache_file(self) -> Path:
        digest = hashlib.sha256(str(self.path).encode()).hexdigest()[:16]
        return self.cache_dir / f"local-index-{digest}.json"

    def _state_key(self, names: list[str]) -> str:
        stamp = self.path.stat().st_mtime_ns
        return hashlib.sha256(json.dumps([INDEX_FORMAT, str(self.path), stamp, names]).encode()).hexdigest()

    def _load(self) -> list[CrateInfo]:
        names = sorted(os.listdir(self.path))
        key = self._state_key(names)
        cached = _read_cache(self._cache_file(), key)
        if cached is not None:
            return cached
        entries = build_index(self.path, names)
        atomic_write_text(
            self._cache_file(),
            json.dumps(
                {"format": INDEX_FORMAT, "path": str(self.path), "key": key, "entries": [e.to_dict() for e in entries]}
            ),
        )
        logger.info("indexed %d crates in %s", len(entries), self.path)
        return entries


def _read_cache(path: Path, key: str) -> list[CrateInfo] | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable index cache %s (%s)", path, exc)
        return None
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or data.get("key") != key:
        return None
    return [CrateInfo.from_dict(e) for e in data["entries"]]


def build_index(path: Path, names: list[str] | None = None) -> list[CrateInfo]:
    """Parse every crate of a directory source; SearchError when it holds none."""
    entries = []
    for name in names if names is not None else sorted(os.listdir(path)):
        directory = path / name
        if (directory / "Cargo.toml").is_file():
            crate = read_crate(directory)
            if crate is not None:
                entries.append(crate)
    if not entries:
        raise SearchError(
            f"{path} is not a cargo directory source (no <name>-<version>/Cargo.toml inside)",
            fix="point --registry at a folder of unpacked crates such as /usr/share/cargo/registry or the output of 'cargo vendor'",
        )
    return entries


def read_crate(directory: Path) -> CrateInfo | None:
    """One crate from its directory's Cargo.toml; None (with a warning) when it is not a package."""
    try:
        manifest = tomllib.loads((directory / "Cargo.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        logger.warning("skipping %s: unreadable Cargo.toml (%s)", directory.name, exc)
        return None
    package = manifest.get("package")
    if (
        not isinstance(package, dict)
        or not isinstance(package.get("name"), str)
        or not isinstance(package.get("version"), str)
    ):
        logger.warning("skipping %s: Cargo.toml has no [package] name and version", directory.name)
        return None
    lib = manifest.get("lib") if isinstance(manifest.get("lib"), dict) else None
    return CrateInfo(
        name=package["name"],
        version=package["version"],
        description=" ".join(str(package.get("description") or "").split()),
        keywords=_strings(package.get("keywords")),
        categories=_strings(package.get("categories")),
        license=_license(package),
        repository=str(package.get("repository") or ""),
        homepage=str(package.get("homepage") or ""),
        has_lib=lib is not None or (package.get("autolib", True) is not False and (directory / "src/lib.rs").is_file()),
        bin_names=binaries(directory, manifest),
        dependencies=dependencies(manifest),
        checksum=_checksum(directory),
        source="local",
        path=str(directory),
        proc_macro=bool(lib and (lib.get("proc-macro") or lib.get("proc_macro"))),
    )


def binaries(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Names of the executables cargo builds: explicit [[bin]] targets, then (unless autobins = false)
    src/main.rs (named after the package), src/bin/NAME.rs and src/bin/NAME/main.rs."""
    package = manifest["package"]
    explicit = [b for b in manifest.get("bin") or [] if isinstance(b, dict) and isinstance(b.get("name"), str)]
    names = [b["name"] for b in explicit]
    taken_paths = {str(b.get("path", "")).removeprefix("./") for b in explicit}
    if package.get("autobins", True) is False:
        return names
    for path, name in _inferred_bins(directory, package["name"]):
        if path not in taken_paths and name not in names:
            names.append(name)
    return names


def _inferred_bins(directory: Path, package_name: str) -> list[tuple[str, str]]:
    found = [("src/main.rs", package_name)] if (directory / "src/main.rs").is_file() else []
    bin_dir = directory / "src/bin"
    if bin_dir.is_dir():
        for entry in sorted(bin_dir.iterdir()):
            if entry.suffix == ".rs" and entry.is_file():
                found.append((f"src/bin/{entry.name}", entry.stem))
            elif (entry / "main.rs").is_file():
                found.append((f"src/bin/{entry.name}/main.rs", entry.name))
    return found


def dependencies(manifest: dict[str, Any]) -> list[str]:
    """Names of the normal dependencies (any target), by their real package names."""
    tables = [manifest.get("dependencies")]
    targets = manifest.get("target")
    if isinstance(targets, dict):
        tables += [t.get("dependencies") for t in targets.values() if isinstance(t, dict)]
    names = set()
    for table in tables:
        for key, spec in (table or {}).items():
            names.add(spec.get("package", key) if isinstance(spec, dict) else key)
    return sorted(names)


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _license(package: dict[str, Any]) -> str:
    if package.get("license"):
        return str(package["license"])
    return f"see {package['license-file']}" if package.get("license-file") else ""


def _checksum(directory: Path) -> str:
    """The .crate sha256 recorded in .cargo-checksum.json ('' when absent; Debian often has none)."""
    try:
        value = json.loads((directory / ".cargo-checksum.json").read_text()).get("package")
    except (OSError, ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64 else ""
