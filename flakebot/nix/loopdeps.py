"""The edit loop's dependencies taken from the flake's own deps derivation: each dependency compiles once per craft.

Without this the dependencies compile twice: in the debug profile for the edit loop (cargo/depcache.py) and in the
release profile in the flake's `cargo-deps-0` derivation (nix/skeleton.py). Here the loop starts from that derivation,
as crane's later steps start from `cargoArtifacts`:
- the derivation is built before the loop's first `cargo test` (and again when the model changes the dependency set)
  from a stub crate flakebot writes: the crate's manifest with its targets removed, its Cargo.lock, an empty main (and
  an empty build script where the crate has one). The package stage writes the same skeleton from the final crate, so
  the same derivation: Nix builds it once and the tool's build compiles only the crate. No line of the model's runs in
  it, and nothing the loop does reaches it: the store is read-only, and the loop gets a private copy (cp
  --reflink=auto, never a link) as its target dir.
- cargo takes the copy as fresh when everything its fingerprints hash is what the Nix build had: the same rustc
  (`rustc -vV`), profile (release, the flake's), `--target` triple, RUSTFLAGS (none), and the same path for every
  registry crate: the sandbox shows the registry where the stand-in's builds see it (/flakebot/registry). And the copy
  is dated now, one instant for all, as the flake's preBuild dates it (the store dates files 1970).
- the crate itself builds incrementally, unoptimised, with debug assertions and overflow checks (profile
  overrides for its package and `profile.release.incremental`, which cargo never applies to a registry crate), so
  the dependencies stay fresh and an iteration costs what a debug one did.

Each output built is indexed in the cache (DERIVATIONS_DIR, a GC root named by the dependency set, the toolchain, the
stand-in and the flake template): a later craft on the same set copies it without writing a stub or calling nix. An
entry that is stale for a reason its name misses costs only speed: cargo's fingerprints then recompile in the loop,
and the package stage builds its own derivation whatever the index says.

Only the offline stand-in (`--nixpkgs host`) builds with the loop's own toolchain; a flake on pinned nixpkgs builds
with nixpkgs' rustc, so there the loop keeps the dependency cache (plan() says why).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomlkit

from flakebot import launcher
from flakebot.cargo.cache_skeleton import (
    TARGET_TABLES,
    CacheSkeleton,
    NoSkeleton,
    SkeletonInputs,
    read_inputs,
    skeleton_from,
)
from flakebot.cargo.depcache import Seeded, rustc_version
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.errors import FlakebotError, UnsafePath
from flakebot.fsutil import remove_tree
from flakebot.safefs import Tree

logger = logging.getLogger(__name__)

DEPS_ATTRIBUTE = "cargo-deps"  # templates/flake.nix.j2's packages output of the deps derivation
CRATE_INCREMENTAL = ("--config", "profile.release.incremental=true")
CRATE_OVERRIDES = ("opt-level=0", "debug-assertions=true", "overflow-checks=true")
CRATE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")  # what may go into a --config key
DERIVATIONS_DIR = "deps-derivations"  # in cache_dir: one GC root per deps derivation the loop built
DERIVATIONS_KEPT = 16  # the most recently used roots kept; an older one's output goes at Nix's next GC
NIX_STORE = Path("/nix/store")


class NoStoreDeps(Exception):
    """Why the loop cannot start from the deps derivation (it then uses the dependency cache, or builds them itself)."""


@dataclass(frozen=True)
class Plan:
    """How the loop's cargo matches the Nix build: the registry's path inside, and the target triple."""

    registry: Path  # where the stand-in's builds (and so the loop's sandbox) see the crate registry
    triple: str
    # what a deps derivation's output depends on besides its dependency set (_builds_with): the index names by it
    builds_with: str = ""

    def profile(self, crate: str = "") -> tuple[str, ...]:
        """cargo's flags for the loop; with the crate's package name, the crate alone also builds unoptimised with
        debug assertions and overflow checks, as a debug build would (package overrides leave the dependencies' hashes
        as they are): half the first build of csv-dedup, and tests that rely on assertions keep them."""
        own = [f"profile.release.package.{crate}.{key}" for key in CRATE_OVERRIDES] if CRATE_NAME.match(crate) else []
        return ("--release", "--target", self.triple, *CRATE_INCREMENTAL, *(a for o in own for a in ("--config", o)))


def crate_name(crate_dir: Path) -> str:
    """The package name of the crate at `crate_dir`, read as data ('' when there is none or it is not a plain name)."""
    try:
        name = tomllib.loads((crate_dir / "Cargo.toml").read_text()).get("package", {}).get("name", "")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, AttributeError):
        return ""
    return name if isinstance(name, str) and CRATE_NAME.match(name) else ""


def plan(settings: Settings, cargo: Cargo) -> Plan:
    """The plan for this run, or NoStoreDeps saying why the loop cannot reuse the deps derivation."""
    from flakebot.nix.command import resolve_mode
    from flakebot.nix.standin import ensure_standin, rustc_report

    if cargo.registry_dir is None:
        raise NoStoreDeps("online, the flake fetches crates the loop's registry does not hold")
    try:
        mode, _ = resolve_mode(settings)
        if mode != "host":
            raise NoStoreDeps("the flake builds with nixpkgs' rustc, not the loop's toolchain")
        standin = ensure_standin(settings)
        host = json.loads((standin / "host.json").read_text())
    except (FlakebotError, OSError, ValueError) as exc:
        raise NoStoreDeps(f"no Nix stand-in: {exc}") from None
    registry = cargo.registry_dir.resolve()
    inside = [Path(i) for i, outside in host.get("sandboxPaths", {}).items() if Path(outside).resolve() == registry]
    if not inside:
        raise NoStoreDeps(f"the stand-in's builds do not see {registry}")
    toolchain = Path(host.get("hostToolchainBin", "")) / "rustc"
    try:
        theirs = rustc_report(toolchain)  # the stand-in's host triple asked it already
    except (OSError, subprocess.SubprocessError):
        theirs = ""
    if theirs.strip() != rustc_version(cargo):
        raise NoStoreDeps("the stand-in's rustc is not the loop's")
    triple = str(host["hostTriple"])
    return Plan(registry=inside[0], triple=triple, builds_with=_builds_with(standin, theirs.strip(), triple, inside[0]))


def _builds_with(standin: Path, rustc: str, triple: str, registry: Path) -> str:
    """A digest of the toolchain and triple, where builds see the registry, the stand-in's files (its host.json names
    the toolchain's paths), flakebot's version and the flake template."""
    from flakebot import __version__
    from flakebot.render import template_dir

    digest = hashlib.sha256()
    template = (template_dir() / "flake.nix.j2").read_text()
    for part in (rustc, triple, str(registry), __version__, template):
        digest.update(part.encode() + b"\0")
    for path in sorted(standin.iterdir()):
        if path.is_file() and not path.is_symlink():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


class StoreSeeder:
    """The loop's target dir kept on the deps derivation of the crate's current dependency set (LoopSeeder's calls)."""

    def __init__(
        self,
        settings: Settings,
        crate_dir: Path,
        target_dir: Path,
        work_dir: Path,
        plan: Plan,
        progress: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.settings, self.crate_dir, self.target_dir, self.work_dir = settings, crate_dir, target_dir, work_dir
        self.plan, self.progress, self.key = plan, progress, ""
        # the manifest, lock and build.rs that gave `key`: equal ones give it again, without parsing the TOML
        self.keyed_inputs: SkeletonInputs | None = None

    def seed(self, *, isolated: bool) -> Seeded:
        if not isolated:
            return Seeded("skipped", "the sandbox is off, so model code could rewrite what it copies")
        return self._seed()

    def refresh(self) -> Seeded | None:
        """Before a `cargo test`: the new set's derivation when the model changed the dependencies (None: unchanged)."""
        try:
            inputs = read_inputs(self.crate_dir)
            if inputs == self.keyed_inputs:
                return None
            key = _key(skeleton_from(inputs))
        except NoSkeleton:
            return None
        if key == self.key:
            self.keyed_inputs = inputs
            return None
        shutil.rmtree(self.target_dir, ignore_errors=True)  # never copy into a dir the model's code wrote
        return self._seed()

    def _seed(self) -> Seeded:
        started = time.monotonic()
        try:
            inputs = read_inputs(self.crate_dir)
            skeleton = skeleton_from(inputs)
            self.key, self.keyed_inputs = _key(skeleton), inputs
            if not skeleton.packages():  # a new crate: nothing to compile, so no nix build until the model adds some
                return Seeded("skipped", "the crate has no dependencies yet")
            root = derivations_dir(self.settings) / index_key(self.key, self.plan)
            output, how = indexed(root), "indexed, copied"
            if output is None:
                self.progress(
                    "building the dependencies once, in the flake's deps derivation (from the manifest and lock)"
                )
                output = build_deps(self.settings, skeleton, self.crate_dir, self.work_dir / self.key[:16], root)
                how = "copied"
                evict(root.parent, keep=DERIVATIONS_KEPT)
            try:
                copy_output(output, self.target_dir)
            except UnsafePath:
                if output.parent == NIX_STORE and root.is_symlink():
                    root.unlink()  # a refused entry is not tried again: the next seed builds the set
                raise
        except (NoSkeleton, NoStoreDeps, FlakebotError, OSError, subprocess.SubprocessError) as exc:
            logger.warning("deps derivation not used: %s", exc)
            shutil.rmtree(self.target_dir, ignore_errors=True)  # a half copy could pass for fresh outputs
            return Seeded("skipped", f"the deps derivation did not build or copy ({exc})")
        return Seeded("store", f"{output.name}, {how}", self.key, time.monotonic() - started)


def derivations_dir(settings: Settings) -> Path:
    return settings.path("cache_dir") / DERIVATIONS_DIR


def index_key(skeleton_key: str, plan: Plan) -> str:
    """The index's name for a deps derivation: its dependency set, and what the plan builds it with."""
    return hashlib.sha256(f"{skeleton_key}\0{plan.builds_with}".encode()).hexdigest()[:40]


def indexed(root: Path) -> Path | None:
    """The store output the index's GC root `root` names, or None: not there, or not a deps output in the Nix store
    (the cache is flakebot's own, but a link there is followed only into the store). A hit is marked used now."""
    if not os.path.lexists(root):
        return None
    try:
        output = Path(os.readlink(root))
    except OSError:
        output = Path()
    if output.parent != NIX_STORE or not output.name.endswith("-cargo-deps-0") or not _real_dirs(output, "target"):
        logger.info("deps derivation index: %s does not name a deps output in the store; built again", root.name)
        if root.is_dir() and not root.is_symlink():  # removed, or Nix refuses to put its root there
            remove_tree(root)
        else:
            root.unlink()
        return None
    os.utime(root, follow_symlinks=False)
    return output


def _real_dirs(output: Path, *below: str) -> bool:
    """Whether the store path `output` and each of `below` under it is a directory itself, not a link to one: whoever
    adds a path to the store chooses its contents, so no hop of an index entry leaves the store."""
    path = output
    for part in ("", *below):
        path = path / part if part else path
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def _refuse_links_out(output: Path) -> None:
    """UnsafePath unless everything under `output`/target is a directory, a regular file or a link that names a path
    further down from its own directory (relative, no '..'): walked beneath a descriptor (safefs), nothing followed.
    The store is read-only, so what is checked here is what cp copies."""
    if not _real_dirs(output, "target"):
        raise UnsafePath(
            f"{output}/target is not a directory of the store path itself (a link, or missing): refused",
            fix=f"remove the index entry that names {output} and craft again",
            path=f"{output}/target",
            rule="link",
        )
    with Tree(output) as tree:
        for rel, info in tree.walk("target"):
            if stat.S_ISLNK(info.st_mode):
                text = tree.readlink(rel)
                if text.startswith("/") or ".." in Path(text).parts:
                    raise UnsafePath(
                        f"{output}/{rel} is a symbolic link to {text}, out of the deps output: refused",
                        fix=f"remove the index entry that names {output} and craft again",
                        path=f"{output}/{rel}",
                        rule="link",
                    )
            elif not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                raise UnsafePath(
                    f"{output}/{rel} is not a file or directory: refused",
                    fix=f"remove the index entry that names {output} and craft again",
                    path=f"{output}/{rel}",
                    rule="not-a-file",
                )


def evict(directory: Path, keep: int) -> None:
    """Unlink the least recently used GC roots beyond `keep` (Nix's next garbage collection frees their outputs)."""
    roots = sorted((p for p in directory.iterdir() if p.is_symlink()), key=lambda p: p.lstat().st_mtime, reverse=True)
    for old in roots[keep:]:
        old.unlink(missing_ok=True)


def _key(skeleton: CacheSkeleton) -> str:
    return hashlib.sha256(skeleton.key_material().encode()).hexdigest()


def build_deps(
    settings: Settings, skeleton: CacheSkeleton, crate_dir: Path, work: Path, root: Path | None = None
) -> Path:
    """Build the deps derivation of `skeleton` (the flake the package stage writes, on a stub crate): its output path,
    held by the GC root `root` (the index's), else by one in `work` while the run lasts."""
    from flakebot.nix import command
    from flakebot.nix.flake import Choice, write_flake
    from flakebot.nix.skeleton import keep_renamed, relocked_otherwise
    from flakebot.nix.standin import ensure_standin

    remove_tree(work)
    stub, flake = work / "crate", work / "flake"
    write_stub(stub, skeleton, build_script=_has_build_script(crate_dir, skeleton))
    written = write_flake(stub, flake, settings, Choice(own_stub=True), "", lambda message: logger.debug("%s", message))
    if written.skeleton is None:
        raise NoStoreDeps("the crate's dependencies have no derivation of their own")
    argv = command.nix_argv(
        ["build"],
        # path:, not a git repository: every file of the stub's flake is flakebot's, so no git is needed to say which
        # (three git processes); the deps derivation takes the skeleton through builtins.path, so it is the same
        # derivation as the package stage's git flake builds
        ["--json", "--out-link", str(root or work / "result"), "-L", f"path:{flake}#{DEPS_ATTRIBUTE}"],
        "host",
        ensure_standin(settings),
        settings.nix_builders,
    )
    logger.info("nix build of the loop's dependencies: %s", " ".join(argv))
    outcome = command.run_streaming(argv, settings.nix_build_timeout, lambda line: logger.debug("nix: %s", line))
    if outcome.returncode != 0 and written.skeleton.renamed:
        # the lock flakebot renamed was not cargo's (a stale one: the model edited the manifest), or the build failed
        # for another reason: cargo relocks it, and only another lock is built again
        again = relocked_otherwise(flake, written.skeleton, settings)
        if again is None:
            raise NoStoreDeps("cargo cannot relock the skeleton to the crate's registry packages")
        if again:
            logger.info("nix build of the loop's dependencies again, on cargo's relock of the skeleton")
            outcome = command.run_streaming(
                argv, settings.nix_build_timeout, lambda line: logger.debug("nix: %s", line)
            )
    elif outcome.returncode == 0:
        keep_renamed(flake, written.skeleton, settings)  # cargo --frozen took it: cargo's own
    if outcome.returncode != 0:
        raise NoStoreDeps(f"nix build failed: {' '.join(outcome.tail[-3:])[-300:]}")
    return Path(json.loads(outcome.stdout)[0]["outputs"]["out"])


def write_stub(directory: Path, skeleton: CacheSkeleton, *, build_script: bool) -> None:
    """The crate with no code: its manifest less its targets, its lock, an empty main (and build script)."""
    manifest = tomlkit.parse(skeleton.manifest_text)
    for table in TARGET_TABLES:
        manifest.pop(table, None)
    package = manifest["package"]
    assert isinstance(package, dict)
    for key in ("autobins", "default-run", "autoexamples", "autotests", "autobenches"):
        package.pop(key, None)
    package["build"] = "build.rs" if build_script else False
    (directory / "src").mkdir(parents=True)
    (directory / "Cargo.toml").write_text(tomlkit.dumps(manifest))
    (directory / "Cargo.lock").write_text(skeleton.lock_text)
    (directory / "src/main.rs").write_text("fn main() {}\n")
    if build_script:
        (directory / "build.rs").write_text("fn main() {}\n")


def _has_build_script(crate_dir: Path, skeleton: CacheSkeleton) -> bool:
    """As cargo decides it (the package stage's skeleton has an empty build script exactly then)."""
    build = tomlkit.parse(skeleton.manifest_text).get("package", {}).get("build")
    return build is not False and (isinstance(build, str) or (crate_dir / "build.rs").is_file())


def copy_output(output: Path, target_dir: Path) -> None:
    """A private copy of the output's target dir at `target_dir`, writable, every file dated now (one instant).
    Whatever was at `target_dir` goes first: nothing is copied into (or dated through) a tree the model's code wrote.
    The output is checked first (no link out of it, _refuse_links_out), and cp copies links as links (-P)."""
    _refuse_links_out(output)
    shutil.rmtree(target_dir, ignore_errors=True)  # never follows a link; a link at target_dir itself is unlinked
    if target_dir.is_symlink():
        target_dir.unlink()
    target_dir.mkdir(parents=True)
    for argv in (
        ["cp", "--reflink=auto", "-r", "-P", "--", f"{output}/target/.", str(target_dir)],
        ["chmod", "-R", "u+w", str(target_dir)],
    ):
        launcher.run(argv, check=True, capture_output=True, timeout=600)
    stamp = target_dir / ".dependencies-copied"
    os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
    launcher.run(
        ["find", str(target_dir), "-exec", "touch", "-h", "-r", str(stamp), "{}", "+"],
        check=True,
        capture_output=True,
        timeout=600,
    )
