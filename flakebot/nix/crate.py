"""What a flake needs to know about a crate: its Cargo.lock, its packages and binaries (asked of cargo)."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from flakebot.config import Settings
from flakebot.errors import NixError, UsageError
from flakebot.nix import build_inputs, devdeps
from flakebot.nix.devdeps import Dropped
from flakebot.nix.lock import PINNED_RUSTC, version_tuple
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalPackage:
    """A workspace member as the dependency skeleton needs it (flakebot.nix.skeleton)."""

    name: str
    manifest: str  # its Cargo.toml, relative to the workspace root
    build_script: bool = False
    proc_macro: bool = False


@dataclass
class CrateFacts:
    """The chosen binary and the package it belongs to, plus what Cargo.lock says about dependencies."""

    pname: str
    version: str
    bin_name: str
    description: str = ""
    license: str = ""
    homepage: str = ""
    cargo_build_flags: list[str] = field(default_factory=list)
    cargo_test_flags: list[str] = field(default_factory=list)
    lock_crates: list[str] = field(default_factory=list)
    git_dependencies: list[str] = field(default_factory=list)  # "name-version" keys for cargoLock.outputHashes
    placeholder_checksums: bool = False  # Debian's directory source wrote checksums a networked build rejects
    lock_generated: bool = False
    build_features: list[str] = field(default_factory=list)  # the chosen binary's required-features
    chosen_because: str = ""  # why this binary, when flakebot picked it among several (a notice)
    # "NAME VERSION (rust-version X)" of the locked packages that need a newer rustc than the pinned nixpkgs has
    needs_newer_rustc: list[str] = field(default_factory=list)
    # devdeps.Dropped.to_dict(): tests cannot run
    dropped_dev_dependencies: list[dict[str, Any]] = field(default_factory=list)
    local_packages: list[LocalPackage] = field(default_factory=list)  # the workspace members
    outside_path_packages: list[str] = field(default_factory=list)  # path packages that are not members
    # cargo's `metadata --no-deps` answer when resolution was left out: the resolution beside the build takes it for
    # its sources check (one `cargo metadata --no-deps` per workspace state), rather than asking cargo again
    members_listing: dict[str, Any] | None = field(default=None, repr=False, compare=False)


def _cargo(settings: Settings, scratch: Path) -> Any:
    from flakebot.cargo.runner import Cargo

    return Cargo.for_run(settings, scratch / "target")


def _first_error(stderr: str) -> str:
    """Cargo's first `error:` line (plus its detail), or the last line of output."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("error"):
            detail = (
                lines[index + 1]
                if index + 1 < len(lines) and not lines[index + 1].startswith(("Caused by", "error"))
                else ""
            )
            return f"{line} {detail}".strip()
    return lines[-1] if lines else "no output"


def ensure_lock(
    crate_dir: Path, settings: Settings, scratch: Path, label: str, dropped: list[Dropped] | None = None
) -> bool:
    """Make sure crate_dir has a Cargo.lock, generating one (offline when configured). True if generated.

    When cargo resolves only without some dev-dependencies, crate_dir's manifests (a copy) lose them and
    `dropped` (when given) receives them."""
    if (crate_dir / "Cargo.lock").is_file():
        return False
    cargo = _cargo(settings, scratch)
    result = cargo.run(["generate-lockfile"], crate_dir, timeout=settings.command_timeout)
    if result.returncode != 0:
        left_out = (
            devdeps.lock_without_unresolvable(cargo, crate_dir, settings.command_timeout)
            if dropped is not None
            else None
        )
        if left_out is None or dropped is None:
            where = " offline" if cargo.offline else ""
            raise NixError(
                f"cannot produce Cargo.lock for {label}{where}: {_first_error(result.stderr)}",
                fix=_git_offline_fix(result.stderr)
                or "add a Cargo.lock to the crate, or install the missing crates into the local registry (apt-get install librust-<name>-dev)",
            )
        dropped.extend(left_out)
    logger.info("generated Cargo.lock in %s", crate_dir)
    return True


def _git_offline_fix(stderr: str) -> str:
    """Offline, cargo cannot check out a git dependency it never fetched: say that, not "install crates"."""
    if "offline" in stderr and ("checkout from" in stderr or "git" in stderr.lower()):
        return (
            "the crate has git dependencies, which cargo must fetch once online: package it online "
            "(--registry crates-io, with the network on)"
        )
    return ""


def metadata(
    crate_dir: Path,
    settings: Settings,
    scratch: Path,
    label: str,
    *,
    resolve: bool = True,
    listed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`cargo metadata --locked`: fails early when Cargo.lock cannot be satisfied from the configured source. Without
    `resolve`, `--no-deps`: the workspace members alone (no dependency packages, no `resolve`), one call of cargo's
    cheapest (a resolving call is two: the sources check's `--no-deps` first, cargo/sources.py, unless `listed` is
    that answer for the tree as it is)."""
    result = _cargo(settings, scratch).run(
        ["metadata", "--format-version", "1", "--locked" if resolve else "--no-deps"],
        crate_dir,
        timeout=settings.command_timeout,
        listed=listed,
    )
    if result.returncode != 0:
        what = "resolve {} from its Cargo.lock" if resolve else "read the manifests of {}"
        raise NixError(
            f"cargo cannot {what.format(label)}: {_first_error(result.stderr)}",
            fix=_git_offline_fix(result.stderr)
            or "remove Cargo.lock so flakebot regenerates it from the local registry, or install the missing crates (apt-get install librust-<name>-dev)",
        )
    try:
        return dict(json.loads(result.stdout))
    except json.JSONDecodeError as exc:
        raise NixError(
            f"cargo metadata printed something that is not JSON ({exc})",
            fix="check the crate's Cargo.toml with 'cargo metadata'",
        ) from None


class Resolution:
    """`cargo metadata --locked` of a crate (metadata, resolving) on a thread of its own, its answer taken later
    (`meta`): a lone registry package's flake is rendered from cargo's `--no-deps` answer alone, so what only
    resolution says (that Cargo.lock holds, the dependencies' rust-versions) can come beside its nix build. `listed`:
    that `--no-deps` answer, for the tree as it still is (flakebot's own copy: only flakebot's files are added to it
    meanwhile), which its sources check reads rather than asking cargo again."""

    def __init__(self, crate_dir: Path, settings: Settings, label: str, listed: dict[str, Any] | None = None) -> None:
        self._answer: dict[str, Any] | BaseException | None = None
        self._thread = threading.Thread(
            target=self._resolve, args=(crate_dir, settings, label, listed), name="cargo-resolution", daemon=True
        )
        self._thread.start()

    def _resolve(self, crate_dir: Path, settings: Settings, label: str, listed: dict[str, Any] | None) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix="flakebot-cargo-") as scratch:
                self._answer = metadata(crate_dir, settings, Path(scratch), label, listed=listed)
        except BaseException as exc:  # given to whoever takes the answer
            self._answer = exc

    def wait(self) -> None:
        """Let cargo finish and drop its answer: what stopped the build (a cancel, an error of another kind) is what
        the caller hears, and nothing of the resolution is left running, or in its scratch directory, when it does."""
        self._thread.join()

    def meta(self) -> dict[str, Any]:
        """cargo's answer, or the NixError `metadata` raised (the lock cargo cannot resolve)."""
        self._thread.join()
        if isinstance(self._answer, BaseException):
            raise self._answer
        assert self._answer is not None
        return self._answer


def lone_registry_package(crate_dir: Path) -> bool:
    """The crate at `crate_dir` is a lone package (its own workspace root, its lock beside it) whose dependencies are
    all registry crates, with no [patch] or [replace] (cargo/cache_skeleton.py's test, read as data through safefs):
    resolution adds no package of its own (no path package outside the members), so cargo's `--no-deps` answer gives
    every fact a flake is written from."""
    from flakebot.cargo.cache_skeleton import NoSkeleton, skeleton_of

    try:
        skeleton_of(crate_dir)
    except NoSkeleton:
        return False
    return True


def inspect_crate(
    crate_dir: Path,
    settings: Settings,
    bin_name: str | None = None,
    *,
    prefer_bin: str | None = None,
    all_bins: bool = False,
    label: str = "",
    member: str = "",
    resolve: bool = True,
) -> CrateFacts:
    """Lock, ask cargo, and pick the binary: `bin_name`; else `prefer_bin` if present; else the only/default one
    (of the workspace member at `member`, a path relative to crate_dir, when given). Without `resolve`, cargo is
    asked for the workspace members alone: what only resolution tells (the root package, path packages that are not
    members, the dependencies' rust-versions: needs_newer_rustc) is then not known, and Cargo.lock is not checked."""
    label = label or crate_dir.name
    with tempfile.TemporaryDirectory(prefix="flakebot-cargo-") as scratch:
        dropped: list[Dropped] = []
        generated = ensure_lock(crate_dir, settings, Path(scratch), label, dropped)
        meta = metadata(crate_dir, settings, Path(scratch), label, resolve=resolve)
    members = [p for p in meta["packages"] if p["id"] in set(meta["workspace_members"])]
    root_id = (meta.get("resolve") or {}).get("root")
    if member and bin_name is None:
        root_id = _member_id(members, crate_dir / member) or root_id
    if bin_name is None and prefer_bin and any(t["name"] == prefer_bin for _, t in binaries(members)):
        bin_name = prefer_bin
    package, target = choose_binary(members, root_id, bin_name, label)
    facts = CrateFacts(
        pname=package["name"],
        version=package["version"],
        bin_name=target["name"],
        description=package.get("description") or "",
        license=package.get("license") or "",
        homepage=package.get("homepage") or package.get("repository") or "",
        lock_generated=generated,
        build_features=list(target.get("required-features") or []),
        dropped_dev_dependencies=[d.to_dict() for d in dropped],
    )
    own = [t["name"] for p, t in binaries(members) if p is package]
    if bin_name is None and len(own) > 1:  # flakebot picked: install them all, as nixpkgs does
        all_bins = True
        facts.chosen_because = _why_chosen(package, target["name"], own)
    _selection_flags(facts, members, package, all_bins)
    _read_lock(facts, crate_dir / "Cargo.lock")
    _read_local(facts, meta, crate_dir)
    facts.needs_newer_rustc = needs_newer_rustc(meta, PINNED_RUSTC)
    facts.members_listing = None if resolve else meta
    return facts


def needs_newer_rustc(meta: dict[str, Any], rustc: str) -> list[str]:
    """The packages of `cargo metadata` (the locked dependencies and the crate itself) whose rust-version is newer
    than `rustc`: real nixpkgs with that rustc cannot build them."""
    newer = [
        (version_tuple(p["rust_version"]), f"{p['name']} {p['version']} (rust-version {p['rust_version']})")
        for p in meta.get("packages", [])
        if p.get("rust_version") and version_tuple(p["rust_version"]) > version_tuple(rustc)
    ]
    return [text for _, text in sorted(newer, key=lambda item: (tuple(-n for n in item[0]), item[1]))]


def declare_rust_version(manifest: Path, rustc: str) -> str:
    """Set [package] rust-version in `manifest` to `rustc` (tomlkit keeps the rest as written), whatever it said
    before: cargo then resolves dependencies for that rustc. Returns the value it replaced ('' for none)."""
    document = tomlkit.parse(manifest.read_text())
    package = document.get("package")
    if not isinstance(package, dict):
        return ""  # a virtual workspace manifest: its members carry the packages
    before = package.get("rust-version")
    package["rust-version"] = rustc
    # a link at its name is replaced; not synced, as the flake's other files (flake_files.py): a resume writes it again
    Tree(manifest.parent).write_text(manifest.name, tomlkit.dumps(document), sync=False)
    return str(before) if isinstance(before, str) else ("workspace" if before is not None else "")


def binaries(members: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(package, target) for every binary target of the workspace members."""
    return [(p, t) for p in members for t in p.get("targets", []) if "bin" in t.get("kind", [])]


def choose_binary(
    members: list[dict[str, Any]], root_id: str | None, bin_name: str | None, label: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The binary to package: the one asked for, the only one, or the root package's default."""
    found = binaries(members)
    names = ", ".join(sorted(t["name"] for _, t in found))
    if bin_name:
        for package, target in found:
            if target["name"] == bin_name:
                return package, target
        raise UsageError(
            f"{label} has no binary named '{bin_name}' (binaries: {names or 'none'})",
            fix=f"pass --bin with one of: {names}" if names else "pick a crate with a binary target",
        )
    if not found:
        raise UsageError(
            f"{label} has no binary target (it is a library crate)",
            fix="package a crate that ships a command-line tool (src/main.rs or a [[bin]] section)",
        )
    if len(found) == 1:
        return found[0]
    own = [(p, t) for p, t in found if root_id is not None and p["id"] == root_id]
    if own:  # as nixpkgs' mainProgram among the binaries it installs: the default-run, one named like the package,
        default = own[0][0].get("default_run") or own[0][0]["name"]
        return next(((p, t) for p, t in own if t["name"] == default), own[0])  # else the first
    raise UsageError(f"{label} has several binaries ({names})", fix="choose one with --bin NAME")


def _why_chosen(package: dict[str, Any], name: str, own: list[str]) -> str:
    why = (
        "its default-run"
        if package.get("default_run") == name
        else "named like the package"
        if package["name"] == name
        else "the first"
    )
    return (
        f"{package['name']} has several binaries ({', '.join(own)}): all are installed, {name} ({why}) is "
        "mainProgram and the one `nix run` starts; choose another with --bin NAME"
    )


def _member_id(members: list[dict[str, Any]], directory: Path) -> str | None:
    """The id of the workspace member whose Cargo.toml is in `directory`."""
    for package in members:
        if Path(package["manifest_path"]).resolve().parent == directory.resolve():
            return str(package["id"])
    return None


def workspace_root(crate_dir: Path, settings: Settings) -> Path:
    """The root of the cargo workspace crate_dir is a member of (crate_dir itself when it stands alone)."""
    with tempfile.TemporaryDirectory(prefix="flakebot-cargo-") as scratch:
        result = _cargo(settings, Path(scratch)).run(
            ["locate-project", "--workspace", "--message-format", "plain"], crate_dir, timeout=120
        )
    if result.returncode != 0 or not result.stdout.strip():
        return crate_dir  # cargo reports a broken manifest better later, with the metadata call
    root = Path(result.stdout.strip()).parent.resolve()
    return root if crate_dir.resolve().is_relative_to(root) else crate_dir


def _selection_flags(
    facts: CrateFacts, members: list[dict[str, Any]], package: dict[str, Any], all_bins: bool = False
) -> None:
    """cargoBuildFlags/cargoTestFlags selecting the chosen binary (every binary of its package with `all_bins`)."""
    if len(members) > 1:
        facts.cargo_build_flags += ["-p", package["name"]]
        facts.cargo_test_flags += ["-p", package["name"]]
    if len(binaries(members)) > 1 and not all_bins:  # `-p` above already keeps to the package
        facts.cargo_build_flags += ["--bin", facts.bin_name]


def _read_local(facts: CrateFacts, meta: dict[str, Any], crate_dir: Path) -> None:
    """The workspace members (manifest, build script, proc-macro) and any other path package, as cargo reports them."""
    member_ids = set(meta["workspace_members"])
    root = Path(meta.get("workspace_root") or crate_dir).resolve()
    for package in meta["packages"]:
        if package.get("source") is not None:
            continue
        manifest = Path(package["manifest_path"]).resolve()
        if package["id"] not in member_ids or not manifest.is_relative_to(root):
            facts.outside_path_packages.append(package["name"])
            continue
        kinds = {kind for target in package.get("targets", []) for kind in target.get("kind", [])}
        facts.local_packages.append(
            LocalPackage(
                package["name"], str(manifest.relative_to(root)), "custom-build" in kinds, "proc-macro" in kinds
            )
        )


def _read_lock(facts: CrateFacts, lock_file: Path) -> None:
    for entry in build_inputs.lock_packages(lock_file):
        name, version, source = str(entry.get("name", "")), str(entry.get("version", "")), str(entry.get("source", ""))
        facts.lock_crates.append(name)
        if source.startswith("git+"):
            facts.git_dependencies.append(f"{name}-{version}")
        if "Could not get crate checksum" in str(entry.get("checksum", "")):
            facts.placeholder_checksums = True
