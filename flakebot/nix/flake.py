"""Wrap a crate as a pinned flake and prove it: render → git add → nix build → smoke run → GC root.

package_crate(source_dir, out_dir, settings, ...)  -> PackageResult
nix_run(result_or_flake_dir, args, settings)      -> CompletedProcess (the tool, via `nix run`)
flake_check(flake_dir, settings)                  -> CompletedProcess (`nix flake check`)
"""

from __future__ import annotations

import logging
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.config import Settings
from flakebot.errors import NixError, UnsafePath, UsageError
from flakebot.fsutil import remove_tree
from flakebot.nix import build_inputs, command, evidence, gitdeps, licenses
from flakebot.nix.build import build, start_gc_root
from flakebot.nix.crate import (
    CrateFacts,
    Resolution,
    declare_rust_version,
    inspect_crate,
    lone_registry_package,
    needs_newer_rustc,
    workspace_root,
)
from flakebot.nix.devdeps import Dropped
from flakebot.nix.flake_files import MARKER, commit_flake, copy_sources, render_flake
from flakebot.nix.lock import NIXPKGS_BRANCH, PINNED_RUSTC, flake_lock_text
from flakebot.nix.reuse import dependency_output
from flakebot.nix.skeleton import Skeleton, write_skeleton
from flakebot.nix.smoke import smoke_run
from flakebot.safefs import file_below
from flakebot.sandbox import limits_for

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
# Rebuilds for native inputs a failed build asked for: a program (pkg-config) may come first, then its library.
EVIDENCE_ROUNDS = 2
# What a build that failed only on a denied lint is built again with (nixpkgs passes RUSTFLAGS on to rustc).
CAP_LINTS = "--cap-lints warn"


@dataclass(frozen=True)
class Choice:
    """Which binary to package: exactly `bin_name`, or `prefer_bin` when present."""

    bin_name: str | None = None
    prefer_bin: str | None = None
    all_bins: bool = False  # install every binary of the chosen package (a crafted tool may have several)
    rust_version: str = ""  # written into the flake's copy of the crate's Cargo.toml (a crafted crate: the pin's rustc)
    strict_smoke: bool = False  # only a smoke run exiting 0 (help) passes; else usage and starts-only pass too
    service: dict[str, Any] | None = None  # a service's outputs beside the package (flake_files.render_flake)
    # a crate flakebot wrote itself (the deps derivation's stub): its own workspace, every file its own, so neither
    # cargo (locate-project) nor git (ls-files) is asked what to copy; and cargo is asked for its members alone (one
    # `metadata --no-deps`, not a check and a resolution): its flake is built only for its deps derivation, which takes
    # of cargo's answer the members and their targets (the rest is read from Cargo.lock). A stub has no path or git
    # dependencies, no workspace (cargo/cache_skeleton.py refuses them); resolution comes next anyway, in the skeleton's
    # relock (skeleton.py) and in `nix build` (--frozen), and a lock they cannot take fails the loop's deps as before.
    # Its flake is not made a git repository either: it is built as a path: flake (loopdeps.build_deps)
    own_stub: bool = False
    # a crafted tool: every file of the tree its tests passed on is copied (walked, not git's listing), so a .gitignore
    # the model wrote cannot leave out of the flake a file the tests compiled with
    as_tested: bool = False
    # the crate's directory is its cargo workspace's root, known without asking cargo (locate-project): a craft's
    # workspace whose crate is at its top (what is above it is flakebot's run directory, none of the tool's)
    at_root: bool = False


@dataclass
class PackageResult:
    """What package_crate produced: the flake, the built store path, and how to run the tool."""

    flake_dir: str
    flake_ref: str
    store_path: str
    bin_path: str
    main_program: str
    pname: str
    version: str
    nixpkgs_mode: str
    nix_run_command: dict[str, Any]
    build_seconds: float
    smoke: dict[str, Any]
    nix_run_argv: list[str] = field(default_factory=list)  # the same argv as nix_run_command["argv"]
    gc_root: str = ""
    dependencies_path: str = ""  # the dependency derivation's output the tool was built on ('' when it had none)
    # what `nix run` of the flake starts, evaluated beside its build ('' when not: require_nix_run_target evaluates it)
    nix_run_program: str = ""
    notices: list[str] = field(default_factory=list)
    native_inputs: dict[str, Any] = field(default_factory=dict)
    licenses: list[str] = field(default_factory=list)
    portable: bool = False  # the flake builds on another machine with real nixpkgs as it is
    portable_reason: str = ""  # why not, when it does not
    build_features: list[str] = field(default_factory=list)  # turned on for the binary's required-features
    # Dev-dependencies left out of the flake's copy (devdeps.Dropped.to_dict()): the crate's own tests could not run.
    dropped_dev_dependencies: list[dict[str, Any]] = field(default_factory=list)
    description: str = ""  # the crate's own (Cargo.toml), or the one given

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def package_crate(
    source_dir: Path,
    out_dir: Path,
    settings: Settings,
    *,
    bin_name: str | None = None,
    description: str = "",
    progress: Progress | None = None,
    gc_root: Path | None = None,
    prefer_bin: str | None = None,
    all_bins: bool = False,
    rust_version: str = "",
    strict_smoke: bool = False,
    service: dict[str, Any] | None = None,
    as_tested: bool = False,
    at_root: bool = False,
    at_build: Callable[[], None] | None = None,
) -> PackageResult:
    """Copy the crate into out_dir as a flake, build it with nix, smoke-run it and keep it alive with a GC root.

    `bin_name` must name one of the crate's binaries; `prefer_bin` is used when the crate has it and
    otherwise falls back to the crate's only (or default) binary. `rust_version`: the crate's rust-version in the
    flake's copy, whatever its Cargo.toml said. The smoke run's level (help, usage, runs, starts-only) is in `smoke`;
    `strict_smoke` refuses a tool below help. `as_tested`: every file of the tree is copied, not only what git lists
    (a crafted tool's workspace, as its tests saw it). `at_root`: source_dir is its cargo workspace's root (cargo is
    not asked where that is). `at_build` is called as the nix build starts: what the caller does beside it.
    """
    report = progress or (lambda message: None)
    command.nix_program()  # fail before touching anything when nix is missing
    source_dir, out_dir = Path(source_dir).resolve(), Path(out_dir).resolve()
    if not (source_dir / "Cargo.toml").is_file():
        raise UsageError(
            f"{source_dir} is not a crate (no Cargo.toml)", fix="give the directory that holds the crate's Cargo.toml"
        )
    mode, notice = command.resolve_mode(settings)
    if notice:
        report(notice)
    _claim_out_dir(out_dir)
    try:
        return _package(
            source_dir,
            out_dir,
            settings,
            mode,
            notice,
            Choice(
                bin_name,
                prefer_bin,
                all_bins,
                rust_version,
                strict_smoke,
                service,
                as_tested=as_tested,
                at_root=at_root,
            ),
            description,
            report,
            gc_root,
            at_build,
        )
    except BaseException as exc:
        if not (isinstance(exc, NixError) and exc.details.get("flake_dir")):
            remove_tree(out_dir)  # nothing half-written is left behind; a flake that builds is kept
        raise


@dataclass
class Written:
    """A flake written into out_dir: what cargo said, and what the flake declares from it."""

    facts: CrateFacts
    native: build_inputs.NativeInputs
    licenses: list[str]
    unknown_licenses: list[str]
    # cargoLock.outputHashes learned from builds (NAME-VERSION -> hash as nix prints it); the others are lib.fakeHash
    output_hashes: dict[str, str] = field(default_factory=dict)
    rust_version_replaced: str = ""  # the crate's own rust-version, when the flake's copy declares another
    capped_lints: str = ""  # the log line of a build that failed only on a denied lint (then built with CAP_LINTS)
    skeleton: Skeleton | None = None  # the dependencies' own derivation builds from it (None: built with the tool)
    service: dict[str, Any] | None = None  # a service's outputs (declaration, NixOS module, image) beside the package
    renders: int = 0  # how many times flake.nix was written (a build evaluated before the last one is of another)
    resolution: Resolution | None = None  # cargo's resolving answer, still coming (settle_resolution takes it)


def _package(
    source_dir: Path,
    out_dir: Path,
    settings: Settings,
    mode: str,
    notice: str,
    choice: Choice,
    description: str,
    report: Progress,
    gc_root: Path | None,
    at_build: Callable[[], None] | None = None,
) -> PackageResult:
    # Lock and check the crate against the run's crate source: online a checksummed crates.io lock (the stand-in
    # fetches it by checksum from cratesio_static_url, as importCargoLock does), offline the local directory source.
    flake = write_flake(source_dir, out_dir, settings, choice, description, report)
    facts = flake.facts
    try:
        standin = _standin(settings, mode)
        report(f"nix build ({mode} nixpkgs) of {facts.pname} {facts.version}")
        root = Path(gc_root or out_dir / "result")  # made by the build itself (--out-link) as it ends
        root.parent.mkdir(parents=True, exist_ok=True)
        argv = command.run_argv(out_dir, mode, standin)  # callers append "--" and the tool's arguments
        if at_build is not None:
            at_build()
        store_path, seconds, drv, program = _build_and_resolve(
            flake,
            argv,
            settings.nix_build_timeout,
            lambda: _build_with_evidence(out_dir, flake, mode, standin, settings, description, report, root),
        )
    except NixError:
        settle_resolution(flake)  # a lock cargo cannot resolve is the error, as when cargo was asked first
        raise
    except BaseException:  # a cancel (KeyboardInterrupt: cargo got no signal), an OSError: that is the error
        drop_resolution(flake)
        raise
    settle_resolution(flake)
    rooted_dependencies = _root_dependencies(store_path, root, drv)  # its nix-store runs beside the smoke run
    try:
        bin_path = _built_binary(store_path, facts)
        report(f"smoke run: {facts.bin_name} --help")
        # under the limits the instruct stage reads the tool's help with: its stdout serves that stage too
        limits = limits_for(settings, timeout=settings.smoke_timeout)
        smoke = smoke_run(bin_path, settings.smoke_timeout, settings.sandbox, strict=choice.strict_smoke, limits=limits)
        if smoke["level"] != "help":
            report(f"smoke level {smoke['level']}: '{smoke['command']}' exited {smoke['exit_code']}")
    except NixError as exc:
        exc.details.setdefault("native_inputs", flake.native.to_dict())
        raise _kept(exc, out_dir) from None
    finally:
        dependencies = rooted_dependencies()
    return PackageResult(
        flake_dir=str(out_dir),
        flake_ref=str(out_dir),
        store_path=store_path,
        bin_path=str(bin_path),
        main_program=facts.bin_name,
        pname=facts.pname,
        version=facts.version,
        nixpkgs_mode=mode,
        nix_run_command={"argv": argv, "shell": shlex.join(argv) + " -- ARGS"},
        nix_run_argv=argv,
        build_seconds=round(seconds, 3),
        smoke=smoke,
        gc_root=str(root),
        dependencies_path=dependencies,
        nix_run_program=program,
        notices=_notices(notice, flake),
        native_inputs=flake.native.to_dict(),
        licenses=flake.licenses,
        **_portability(mode, flake),
        build_features=facts.build_features,
        dropped_dev_dependencies=facts.dropped_dev_dependencies,
        description=description or facts.description,
    )


def settle_resolution(flake: Written) -> None:
    """Take the resolution that ran beside the build (when one did): its error raised (Cargo.lock does not hold), else
    what only it says (the dependencies' rust-versions, for the notices) added to the facts."""
    if flake.resolution is not None:
        resolution, flake.resolution = flake.resolution, None
        flake.facts.needs_newer_rustc = needs_newer_rustc(resolution.meta(), PINNED_RUSTC)


def drop_resolution(flake: Written) -> None:
    """The resolution beside the build (when one runs) waited for and its answer dropped: the build stopped otherwise
    than on a nix error, and the caller removes the flake cargo reads (package_crate) once this returns."""
    if flake.resolution is not None:
        resolution, flake.resolution = flake.resolution, None
        resolution.wait()


def _build_and_resolve(
    flake: Written, run: list[str], timeout: float, build: Callable[[], tuple[str, float, str]]
) -> tuple[str, float, str, str]:
    """`build`'s (store path, seconds, derivation: _build_with_evidence), and what `nix run` of the flake starts (`run`,
    its argv), evaluated beside the build (its ~0.07 s hidden there, not paid after it by whoever checks it): '' when
    the flake was rendered again for another build (the early answer is of the first) or the evaluation failed (the
    check then evaluates it again and says why)."""
    rendered = flake.renders
    resolving = command.Resolving(run)
    try:
        built = build()
    except BaseException:
        resolving.stop()
        raise
    if flake.renders != rendered:
        resolving.stop()
        return (*built, "")
    try:
        return (*built, resolving.program(timeout))
    except NixError as exc:
        logger.info("what nix run starts is evaluated again later: %s", exc)
        return (*built, "")


def _root_dependencies(store_path: str, root: Path, drv: str) -> Callable[[], str]:
    """Start a GC root beside the tool's (`root`-deps) for the output of the dependency derivation the tool was built
    on; the call returned waits for it and gives that output. It is a build input, not in the tool's closure, so
    without it nix-collect-garbage would drop what the next craft on the same dependencies reuses. '' when the tool had
    none (or the store cannot say, or nix-store refused: it is only a speed-up)."""
    try:
        output = dependency_output(store_path, drv)  # the build named its derivation: read, not asked of the store
        finish = start_gc_root(output, root.with_name(f"{root.name}-deps")) if output else None
    except NixError as exc:
        logger.info("no GC root for the dependencies' output: %s", exc)
        return lambda: ""

    def rooted() -> str:
        try:
            if finish is not None:
                finish()
        except NixError as exc:
            logger.info("no GC root for the dependencies' output: %s", exc)
            return ""
        return output or ""

    return rooted


def write_flake(
    source_dir: Path, out_dir: Path, settings: Settings, choice: Choice, description: str, report: Progress
) -> Written:
    """Copy the crate (its whole workspace if it is a member) into out_dir, render flake.nix + flake.lock, commit."""
    root = source_dir if choice.own_stub or choice.at_root else workspace_root(source_dir, settings)
    member = str(source_dir.relative_to(root)) if root != source_dir else ""
    report(f"copying {root.name} into {out_dir}")
    copy_sources(root, out_dir, listed_by_git=not (choice.own_stub or choice.as_tested))
    replaced = ""
    if choice.rust_version:  # the copy's manifest, after any edit of the model's: its own value is not trusted
        replaced = declare_rust_version(out_dir / member / "Cargo.toml", choice.rust_version)
        replaced = "" if replaced == choice.rust_version else replaced
    report("asking cargo for the crate's packages and binaries")
    # a crafted lone registry package: its members alone, the resolution beside its build (settle_resolution)
    beside = choice.at_root and not choice.own_stub and lone_registry_package(out_dir)
    facts = inspect_crate(
        out_dir,
        settings,
        choice.bin_name,
        prefer_bin=choice.prefer_bin,
        all_bins=choice.all_bins,
        label=source_dir.name,
        member=member,
        resolve=not (choice.own_stub or beside),
    )
    flake = Written(facts, build_inputs.native_inputs(facts.lock_crates), *licenses.nix_licenses(facts.license))
    flake.resolution = Resolution(out_dir, settings, source_dir.name, facts.members_listing) if beside else None
    try:
        # the stub's: its lock renamed, not relocked (its build proves it, and falls back: loopdeps.build_deps)
        flake.skeleton = write_skeleton(out_dir, facts, settings, provisional=choice.own_stub)
        flake.rust_version_replaced = replaced
        flake.service = choice.service
        _render(out_dir, flake, description)
        (out_dir / "flake.lock").write_text(flake_lock_text())
        if not choice.own_stub:  # the stub's flake is built as a path: flake (loopdeps.build_deps), every file its own
            commit_flake(out_dir, f"flakebot: {facts.pname} {facts.version} as a flake")
    except NixError:
        settle_resolution(flake)  # a lock cargo cannot resolve is the error, as when it was resolved first
        raise
    except BaseException:
        drop_resolution(flake)  # nothing of cargo's left reading the flake its caller removes
        raise
    return flake


def _render(out_dir: Path, flake: Written, description: str) -> None:
    facts = flake.facts
    flake.renders += 1
    (out_dir / "flake.nix").write_text(
        render_flake(
            facts,
            description or facts.description,
            flake.native,
            flake.licenses,
            flake.unknown_licenses,
            flake.output_hashes,
            flake.skeleton,
            flake.service,
        )
    )


def _build_with_evidence(
    out_dir: Path,
    flake: Written,
    mode: str,
    standin: Path | None,
    settings: Settings,
    description: str,
    report: Progress,
    out_link: Path,
) -> tuple[str, float, str]:
    """nix build (making its GC root at `out_link`), and again after what a failed build taught: the git dependencies'
    hashes in place of lib.fakeHash (the --keep-going build reports every clone's mismatch, so once; once per git
    dependency at most), or a program, pkg-config module or library the flake does not give (EVIDENCE_ROUNDS times at
    most), or RUSTFLAGS=--cap-lints warn when only a denied lint failed it (once)."""
    git_rounds, evidence_rounds = len(flake.facts.git_dependencies), EVIDENCE_ROUNDS
    while True:
        # A git dependency still at lib.fakeHash fails the build: let every other fetch finish and land in the store
        # (a crate is downloaded once) and every clone report its hash (one more build, not one per dependency).
        learning = any(key not in flake.output_hashes for key in flake.facts.git_dependencies)
        try:
            return build(
                out_dir, mode, standin, settings, flake.facts.pname, report, keep_going=learning, out_link=out_link
            )
        except NixError as exc:
            if git_rounds and (keys := _learn_git_hash(exc, flake)):
                git_rounds -= 1
                lesson = f"git dependency {', '.join(keys)}: hash from the first build"
                commit = f"flakebot: cargoLock.outputHashes of {', '.join(keys)} from the build"
            elif not flake.capped_lints and (line := _denied_lint(exc, flake)):
                lesson = f"the build failed only on a denied lint ({line}): RUSTFLAGS={CAP_LINTS}"
                commit = f"flakebot: RUSTFLAGS={CAP_LINTS} (a denied lint failed the build)"
            elif evidence_rounds and (added := _add_evidence(exc, flake, mode)):
                evidence_rounds -= 1
                lesson = f"the build asked for {', '.join(added)}: added to the flake's inputs"
                commit = f"flakebot: {', '.join(added)} from the build log"
            else:
                exc.details.setdefault("native_inputs", flake.native.to_dict())  # what the failed build was given
                if (unknown := _unknown_library(exc, flake.facts.pname)) is not None:
                    raise unknown from None
                raise
        report(f"{lesson}, building again")
        _render(out_dir, flake, description)
        commit_flake(out_dir, commit)


def _denied_lint(exc: NixError, flake: Written) -> str:
    """The log line of a build that failed only on a lint the crate denies, now built with CAP_LINTS; '' otherwise."""
    logged = [*str(exc.details.get("lint_lines", "")).splitlines(), *str(exc.details.get("log_tail", "")).splitlines()]
    line = evidence.denied_lint(logged)
    if line and "RUSTFLAGS" not in flake.native.env:
        flake.native.env["RUSTFLAGS"] = CAP_LINTS
        flake.capped_lints = line
        return line
    return ""


def _learn_git_hash(exc: NixError, flake: Written) -> list[str]:
    """The git dependencies whose lib.fakeHash the build's hash mismatches answer (a --keep-going build reports each
    clone's): their outputHashes entries become the hashes nix got. Empty when a mismatch is not a placeholder's (a
    recorded hash that no longer matches stays an error) or nix printed no SRI sha256."""
    if not exc.details.get("git_dependencies") or exc.details.get("specified") != gitdeps.FAKE_HASH:
        return []  # the error is the first mismatch that is not a placeholder's, when there is one
    learned: dict[str, str] = {}
    for mismatch in exc.details.get("git_mismatches") or []:
        keys = [key for key in mismatch.get("git_dependencies") or [] if key in flake.facts.git_dependencies]
        got = str(mismatch.get("got", ""))
        if not keys or mismatch.get("specified") != gitdeps.FAKE_HASH or not gitdeps.is_sri_sha256(got):
            return []
        if any(key in flake.output_hashes for key in keys):
            return []
        learned.update(dict.fromkeys(keys, got))
    keys = [key for key in flake.facts.git_dependencies if key in learned]  # the lock's order, not the log's
    flake.output_hashes.update((key, learned[key]) for key in keys)
    if keys:
        logger.info("outputHashes from the build: %s", ", ".join(f"{key} {learned[key]}" for key in keys))
    return keys


def _add_evidence(exc: NixError, flake: Written, mode: str) -> list[str]:
    """Native inputs the failed build's log asks for, added to the flake (none: not such a failure). A library the
    flake already gives but the build still lacks is an error of its own."""
    found = evidence.missing_inputs(str(exc.details.get("log_tail", "")).splitlines())
    added = flake.native.add_evidence(
        {name: line for name, line in found.items() if name not in flake.native.declared()}
    )
    if not added and found:
        exc.details.setdefault("native_inputs", flake.native.to_dict())
        raise _library_missing(exc, flake.facts.pname, found, mode) from None
    return list(added)


def _unknown_library(exc: NixError, pname: str) -> NixError | None:
    """The build failed linking a -lNAME that no attribute of flakebot's table gives: say which, and how to add it."""
    lines = [*str(exc.details.get("lint_lines", "")).splitlines(), *str(exc.details.get("log_tail", "")).splitlines()]
    unknown = evidence.unknown_libraries(lines)
    if not unknown:
        return None
    names = ", ".join(f"-l{name}" for name in unknown)
    return NixError(
        f"nix build of {pname} failed: it links {names}, which no nixpkgs attribute in flakebot's table gives",
        fix=f"add the nixpkgs attribute that ships lib{next(iter(unknown))}.so to PACKAGES in flakebot/nix/build_inputs.py "
        f'(libraries=("{next(iter(unknown))}",)) and, for the crate that links it, an entry in NATIVE_INPUTS',
        **exc.details,
    )


def _library_missing(exc: NixError, pname: str, found: dict[str, str], mode: str) -> NixError:
    """The build lacks a library the flake already gives: with the host stand-in, the host itself lacks it."""
    names = ", ".join(found)
    fix = (
        f"the host stand-in links this machine's own libraries: install the development package of {names} "
        "(on Debian: apt-get install lib<name>-dev), or build with real nixpkgs (--nixpkgs pinned)"
        if mode == "host"
        else exc.fix
    )
    return NixError(
        f"nix build of {pname} failed: it found no {names} ({next(iter(found.values()))})", fix=fix, **exc.details
    )


def _kept(exc: NixError, out_dir: Path) -> NixError:
    """`exc` (after the nix build succeeded) saying that the flake, which builds, is kept in out_dir."""
    fix = f"{exc.fix}; the flake builds and is kept in {out_dir} (nix build {out_dir})"
    return NixError(exc.message, fix=fix, **{**exc.details, "flake_dir": str(out_dir)})


def _built_binary(store_path: str, facts: CrateFacts) -> Path:
    """bin/<name> of the build as a regular file, no link followed (safefs.file_below): the smoke run binds its
    directory into the sandbox, so a link planted there must not name a host directory."""
    try:
        return file_below(Path(store_path), Path(store_path) / "bin" / facts.bin_name)
    except UnsafePath as exc:
        raise NixError(
            f"bin/{facts.bin_name} of the build of {facts.pname} is refused ({exc.details['rule']}): it must be a "
            "regular file reached through real directories, never a link",
            fix="build the tool as a plain [[bin]] target; remove what installs a link in its place",
        ) from None
    except FileNotFoundError:
        found = sorted(p.name for p in (Path(store_path) / "bin").glob("*"))
        raise NixError(
            f"the build of {facts.pname} has no bin/{facts.bin_name} (it has: {', '.join(found) or 'nothing'})",
            fix="pass --bin with one of the crate's binaries",
        ) from None


def _portability(mode: str, flake: Written) -> dict[str, Any]:
    """Whether the flake builds elsewhere as it is, and if not, why (item by item, for `flakebot show`)."""
    facts = flake.facts
    reasons = []
    if mode == "host":
        reasons.append(
            "built with this machine's stand-in for nixpkgs (--nixpkgs host); its nix run command works only here"
        )
    if facts.placeholder_checksums:
        reasons.append(
            "Cargo.lock comes from a local directory source with placeholder checksums, which real nixpkgs rejects"
        )
    if _unhashed(flake):
        reasons.append("git dependencies still carry lib.fakeHash in cargoLock.outputHashes")
    if facts.needs_newer_rustc:
        reasons.append(
            f"locked crates need a newer rustc than nixpkgs {NIXPKGS_BRANCH}'s {PINNED_RUSTC}: "
            + ", ".join(facts.needs_newer_rustc)
        )
    return {"portable": not reasons, "portable_reason": "; ".join(reasons)}


def _unhashed(flake: Written) -> list[str]:
    """The git dependencies whose cargoLock.outputHashes entry is still lib.fakeHash."""
    return [key for key in flake.facts.git_dependencies if key not in flake.output_hashes]


def _notices(notice: str, flake: Written) -> list[str]:
    facts = flake.facts
    notes = [notice] if notice else []
    if facts.lock_generated:
        notes.append("Cargo.lock was generated by flakebot (the crate had none)")
    if facts.chosen_because:
        notes.append(facts.chosen_because)
    if flake.rust_version_replaced:
        notes.append(
            f"rust-version {flake.rust_version_replaced} in Cargo.toml replaced by {PINNED_RUSTC}, the rustc of "
            f"nixpkgs {NIXPKGS_BRANCH} the flake pins"
        )
    if flake.capped_lints:
        notes.append(
            f"the build failed only on a lint the crate denies ({flake.capped_lints}), as a newer compiler warns more: "
            f"built with RUSTFLAGS={CAP_LINTS} (env in flake.nix)"
        )
    notes += [Dropped(**d).notice() for d in facts.dropped_dev_dependencies]
    if facts.dropped_dev_dependencies:
        notes.append(
            "the crate's own tests were not run and the flake has no checks: they need the dev-dependencies left out"
        )
    if facts.build_features:
        notes.append(f"{facts.bin_name} needs --features {','.join(facts.build_features)}: turned on (buildFeatures)")
    if facts.placeholder_checksums:
        notes.append(
            "Cargo.lock has placeholder checksums from a local directory source: real nixpkgs (--nixpkgs pinned) needs a crates.io lock"
        )
    if unhashed := _unhashed(flake):
        notes.append(
            f"git dependencies ({', '.join(unhashed)}) have lib.fakeHash in cargoLock.outputHashes: "
            "nix prints the right hash on the first pinned build"
        )
    if flake.output_hashes:
        notes.append(
            f"git dependencies ({', '.join(flake.output_hashes)}): cargoLock.outputHashes holds the hash of what their "
            "repository served at the locked commit on the first build (trusted on first use)"
        )
    if flake.unknown_licenses:
        notes.append(
            f"licence {', '.join(flake.unknown_licenses)} has no lib.licenses equivalent and is left out of meta"
        )
    return notes


def check_out_dir(out_dir: Path) -> bool:
    """Whether out_dir holds an earlier flakebot flake (False: missing or empty); a directory holding anything
    else, or no directory at all, is refused. Needs nothing built, so `package` checks it before a run starts."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir} is not a directory", fix="choose an empty or new output directory")
    if not out_dir.exists() or not any(out_dir.iterdir()):
        return False
    flake = out_dir / "flake.nix"
    if not (flake.is_file() and flake.read_text().startswith(MARKER)):
        raise UsageError(
            f"{out_dir} already holds files that flakebot did not write", fix="choose an empty or new output directory"
        )
    return True


def _claim_out_dir(out_dir: Path) -> None:
    """Make out_dir empty: it may be missing, empty, or an earlier flakebot flake; anything else is refused."""
    if check_out_dir(out_dir):
        remove_tree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)


def _standin(settings: Settings, mode: str) -> Path | None:
    if mode != "host":
        return None
    from flakebot.nix.standin import ensure_standin

    return ensure_standin(settings)


# ---------------------------------------------------------------- using a packaged flake


def nix_run(
    result_or_flake_dir: PackageResult | dict[str, Any] | Path | str,
    args: list[str],
    settings: Settings,
    *,
    input: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the packaged tool with `nix run ... -- ARGS`: the result's nix_run_command, with flakebot's machine
    options (should nix have to build the tool again, it builds as every flakebot build does)."""
    flake, mode, standin = command.run_target(_run_argv(result_or_flake_dir, settings))
    argv = command.nix_argv(["run"], [flake, "--", *args], mode, standin, settings.nix_builders)
    logger.info("nix run: %s", shlex.join(argv))
    return launcher.run(
        argv,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout or settings.command_timeout,
    )


def _run_argv(target: PackageResult | dict[str, Any] | Path | str, settings: Settings) -> list[str]:
    if isinstance(target, PackageResult):
        target = target.to_dict()
    if isinstance(target, dict):
        if target.get("nixpkgs_mode") == "host":
            _standin(settings, "host")  # re-render if the cache was cleaned; identical content keeps its hash
        return list(target["nix_run_command"]["argv"])
    mode, _ = command.resolve_mode(settings)
    return command.run_argv(Path(target).resolve(), mode, _standin(settings, mode))


def flake_check(
    flake_dir: Path | str, settings: Settings, *, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """`nix flake check` of a generated flake (builds checks.<system>.default: the package with its tests)."""
    mode, _ = command.resolve_mode(settings)
    argv = command.nix_argv(
        ["flake", "check"],
        ["-L", str(Path(flake_dir).resolve())],
        mode,
        _standin(settings, mode),
        settings.nix_builders,
    )
    logger.info("nix flake check: %s", shlex.join(argv))
    return launcher.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout or settings.nix_build_timeout
    )
