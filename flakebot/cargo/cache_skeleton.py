"""A crate's dependencies without its code: the manifest and lock with every target replaced by an empty one.

Read on the host with tomllib/tomlkit as data (nothing of the tree is built or run), as crane's `buildDepsOnly`
does: building the skeleton compiles the locked dependencies exactly as the crate's own `cargo test` would, and
no line the model wrote. The skeleton's package is renamed, so none of its own artifacts can ever be taken for
the real crate's (cargo keys a path package's outputs by its name, and would find them fresh).

Crates whose dependencies are not all crates.io's (path or git dependencies, another registry's, `[patch]`, a
workspace member) have no skeleton: their dependency build depends on code in the tree or outside the registry.

The Nix deps derivation has its own skeleton (nix/skeleton.py's Skeleton; this one is CacheSkeleton): it is written
after `cargo metadata` has described the crate, keeps workspaces and path members, and lets cargo relock it; this one
is read before any cargo call on a tree the model is editing, so it takes the manifest and lock as data only and
refuses what it cannot key safely.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomlkit

from flakebot.cargo.sources import is_crates_io
from flakebot.safefs import read_file_text

SKELETON_NAME = "flakebot-deps-skeleton"
TARGET_TABLES = ("lib", "bin", "test", "example", "bench")
DEPENDENCY_TABLES = ("dependencies", "dev-dependencies", "build-dependencies")
# cargo's old spellings, still read before edition 2024: a crate using them is left to cargo, not read here
OLD_DEPENDENCY_TABLES = ("dev_dependencies", "build_dependencies")
# what the manifest says that changes how dependencies compile (the package's own name and targets do not)
KEYED_TABLES = (*DEPENDENCY_TABLES, "target", "features", "profile")


class NoSkeleton(Exception):
    """Why a crate gets no dependency skeleton (its dependencies are then built in the edit loop, as before)."""


@dataclass(frozen=True)
class CacheSkeleton:
    """The files of a dependency-only crate, and what of the real crate decides its dependency build: what the
    dependency cache (cargo/depcache.py) and the loop's stub crate (nix/loopdeps.py) build and key on. The flake's own
    skeleton, written after `cargo metadata`, is nix/skeleton.py's Skeleton."""

    manifest_text: str  # the crate's own, as read once (the tree may change after)
    lock_text: str
    build_script: bool
    keyed: dict[str, Any]  # the lock's registry packages and the manifest's dependency tables

    def write(self, directory: Path) -> None:
        """The skeleton crate at `directory`: Cargo.toml, Cargo.lock, an empty lib, main and build script."""
        (directory / "src").mkdir(parents=True, exist_ok=True)
        (directory / "Cargo.toml").write_text(_skeleton_manifest(tomlkit.parse(self.manifest_text), self.build_script))
        (directory / "Cargo.lock").write_text(_skeleton_lock(self.lock_text, self.keyed["name"]))
        (directory / "src/lib.rs").write_text("")
        (directory / "src/main.rs").write_text("fn main() {}\n")
        if self.build_script:
            (directory / "build.rs").write_text("fn main() {}\n")

    def packages(self) -> list[str]:
        """The locked packages, one `name version source` string each."""
        return sorted(f"{p.get('name')} {p.get('version')} {p.get('source', '')}" for p in self.keyed["lock"])

    def key_material(self) -> str:
        """What decides the dependency build, as JSON (not the crate's own name)."""
        return json.dumps({k: v for k, v in self.keyed.items() if k != "name"}, sort_keys=True, default=str)


@dataclass(frozen=True)
class SkeletonInputs:
    """What a crate's skeleton is made of, as read from its tree: equal inputs give an equal skeleton."""

    manifest_text: str
    lock_text: str
    build_rs: bool  # a build.rs beside the manifest (a build script unless the manifest says otherwise)


def read_inputs(crate_dir: Path) -> SkeletonInputs:
    """The manifest's and lock's text and whether build.rs is there; NoSkeleton when they cannot be read safely."""
    manifest_path, lock_path = crate_dir / "Cargo.toml", crate_dir / "Cargo.lock"
    if not lock_path.is_file():
        raise NoSkeleton("no Cargo.lock beside Cargo.toml (a workspace member, or no lock yet)")
    if manifest_path.is_symlink() or lock_path.is_symlink():
        raise NoSkeleton("Cargo.toml or Cargo.lock is a symbolic link")
    try:
        # the workspace is the sandbox's to write: a FIFO or link at either name is refused, not waited on
        manifest_text, lock_text = read_file_text(manifest_path), read_file_text(lock_path)
    except (OSError, UnicodeDecodeError) as exc:
        raise NoSkeleton(f"cannot read the manifest or lock: {exc}") from None
    return SkeletonInputs(manifest_text, lock_text, (crate_dir / "build.rs").is_file())


def skeleton_of(crate_dir: Path) -> CacheSkeleton:
    """The skeleton of the crate at `crate_dir` (its Cargo.lock beside it); NoSkeleton says why there is none."""
    return skeleton_from(read_inputs(crate_dir))


def skeleton_from(inputs: SkeletonInputs) -> CacheSkeleton:
    """The skeleton `inputs` describe (read_inputs); NoSkeleton says why there is none."""
    manifest_text, lock_text = inputs.manifest_text, inputs.lock_text
    try:
        plain, lock = tomllib.loads(manifest_text), tomllib.loads(lock_text)
    except tomllib.TOMLDecodeError as exc:
        raise NoSkeleton(f"cannot read the manifest or lock: {exc}") from None
    package = plain.get("package")
    if not isinstance(package, dict) or not isinstance(package.get("name"), str):
        raise NoSkeleton("the manifest has no [package] name")
    # a model's edit may be TOML and still not what cargo reads: cargo says what is wrong with it, not this reading
    if not isinstance(plain.get("target", {}), dict):
        raise NoSkeleton("the manifest's [target] is not a table")
    packages = lock.get("package", [])
    if not isinstance(packages, list) or not all(isinstance(p, dict) for p in packages):
        raise NoSkeleton("the lock's [[package]] entries are not tables")
    _refuse_non_registry(plain, lock)
    # a build script matters to the dependency build only through its build-dependencies
    build_script = _has_build_script(package, inputs.build_rs) and any(
        t == "build-dependencies" for t, _ in _tables(plain)
    )
    return CacheSkeleton(
        manifest_text=manifest_text,
        lock_text=lock_text,
        build_script=build_script,
        keyed={
            "name": package["name"],
            "lock": _registry_packages(lock, package["name"]),
            "manifest": {name: plain[name] for name in KEYED_TABLES if name in plain},
            "resolver": [package.get("edition"), package.get("resolver")],  # how features are unified
            "build_script": build_script,
        },
    )


def _refuse_non_registry(manifest: dict[str, Any], lock: dict[str, Any]) -> None:
    if "workspace" in manifest or "workspace" in manifest.get("package", {}):
        raise NoSkeleton("the crate is a cargo workspace")
    for table in ("patch", "replace"):
        if table in manifest:
            raise NoSkeleton(f"the manifest has [{table}]")
    platforms = [manifest, *(p for p in manifest.get("target", {}).values() if isinstance(p, dict))]
    if any(old in platform for platform in platforms for old in OLD_DEPENDENCY_TABLES):
        raise NoSkeleton("the manifest spells a dependency table the old way (dev_dependencies, build_dependencies)")
    for name, spec in _dependency_specs(manifest):
        if isinstance(spec, dict) and ("path" in spec or "git" in spec):
            raise NoSkeleton(f"dependency {name} is a path or git dependency")
        if isinstance(spec, dict) and ("registry" in spec or "registry-index" in spec):
            raise NoSkeleton(f"dependency {name} is from another registry than crates.io")
    for package in lock.get("package", []):
        source = str(package.get("source", ""))
        if source.startswith("git+"):
            raise NoSkeleton(f"the lock holds git package {package.get('name')}")
        if source and not is_crates_io(source):  # the sources check refuses it: cargo must be asked
            raise NoSkeleton(f"the lock holds {package.get('name')} from {source}, not crates.io")
    root = manifest["package"]["name"]
    local = [p.get("name") for p in lock.get("package", []) if "source" not in p and p.get("name") != root]
    if local:
        raise NoSkeleton(f"the lock holds path packages {', '.join(map(str, local))}")


def _dependency_specs(manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(name, spec) for _, table in _tables(manifest) for name, spec in table.items()]


def _tables(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every non-empty dependency table, with its kind, the platform-specific ones too."""
    found = [(t, manifest.get(t)) for t in DEPENDENCY_TABLES]
    for platform in manifest.get("target", {}).values():
        found += [(t, platform.get(t)) for t in DEPENDENCY_TABLES if isinstance(platform, dict)]
    return [(kind, table) for kind, table in found if isinstance(table, dict) and table]


def _has_build_script(package: dict[str, Any], build_rs: bool) -> bool:
    build = package.get("build")
    if build is False:
        return False
    return isinstance(build, str) or build_rs


def _skeleton_manifest(manifest: tomlkit.TOMLDocument, build_script: bool) -> str:
    for table in TARGET_TABLES:
        manifest.pop(table, None)
    package = manifest["package"]
    assert isinstance(package, dict)
    package["name"] = SKELETON_NAME
    for key in ("autobins", "autoexamples", "autotests", "autobenches", "default-run", "links"):
        package.pop(key, None)
    for key in ("autoexamples", "autotests", "autobenches"):
        package[key] = False
    package["build"] = "build.rs" if build_script else False  # an empty build script: links nothing
    return tomlkit.dumps(manifest)


def _skeleton_lock(text: str, root: str) -> str:
    lock = tomlkit.parse(text)
    packages = lock.get("package")
    for package in packages if packages is not None else []:
        if package.get("name") == root and "source" not in package:
            package["name"] = SKELETON_NAME
    return tomlkit.dumps(lock)


def _registry_packages(lock: dict[str, Any], root: str) -> list[dict[str, Any]]:
    """The lock's packages but the crate itself: what the dependency build is made of."""
    return [p for p in lock.get("package", []) if not (p.get("name") == root and "source" not in p)]
