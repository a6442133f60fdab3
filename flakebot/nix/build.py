"""Proving a flake: `nix build --json` (Nix 2.8 has no --print-out-paths) and a GC root (the smoke run: smoke.py)."""

from __future__ import annotations

import base64
import json
import logging
import re
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

from flakebot import launcher
from flakebot.config import Settings
from flakebot.errors import NixError
from flakebot.events import waiting_on
from flakebot.nix import builders, command, evidence, gitdeps

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]


def build(
    flake_dir: Path,
    mode: str,
    standin: Path | None,
    settings: Settings,
    pname: str,
    report: Progress,
    *,
    keep_going: bool = False,
    out_link: Path | None = None,
) -> tuple[str, float, str]:
    """`nix build --json` of the flake's default package; returns (store path, seconds, its derivation).

    `out_link`: the GC root nix itself makes as the build ends (`--out-link`: no window in which a garbage collection
    could take the output, and no nix-store process after it); without it, `--no-link`.

    `keep_going`: for a build expected to fail (a git dependency's hash is still lib.fakeHash). Without it nix stops
    at the first failure and kills the fixed-output fetches still running (a crate's download on a slow link), which
    the next build then downloads again; with it they finish and stay in the store, and every clone's mismatch is
    reported at once (details: git_mismatches)."""
    link = ["--out-link", str(out_link)] if out_link is not None else ["--no-link"]
    options = ["--json", *link, "-L", *(["--keep-going"] if keep_going else []), str(flake_dir)]
    argv = command.nix_argv(["build"], options, mode, standin, settings.nix_builders)
    logger.info("nix build: %s", shlex.join(argv))
    errors: list[str] = []  # the first compiler errors, which a long log pushes out of the tail
    lints: list[str] = []  # lint levels, coded errors, ld's missing libraries of the whole log (evidence weighs them)
    mismatches: list[str] = []  # every hash mismatch and its specified/got lines (a --keep-going log has several)
    with waiting_on(f"nix build of {pname}"):
        outcome = command.run_streaming(
            argv, settings.nix_build_timeout, _build_progress(report, errors, lints, mismatches), cwd=flake_dir
        )
    log_tail = "\n".join(outcome.tail)
    if outcome.timed_out:
        raise NixError(
            f"nix build of {pname} timed out after {settings.nix_build_timeout:g} s",
            fix="raise nix_build_timeout ('flakebot config set nix_build_timeout 3600')",
            log_tail=log_tail,
        )
    if outcome.returncode != 0:
        remote = builders.remote_failure(pname, outcome.tail)
        if remote is not None:
            raise remote
        lock = Path(flake_dir) / "Cargo.lock"
        failed = _build_failed(pname, outcome.returncode, outcome.tail, lock, errors, mismatches)
        failed.details["lint_lines"] = "\n".join(lints)
        raise failed
    try:
        built = json.loads(outcome.stdout)[0]
        return str(built["outputs"]["out"]), outcome.seconds, str(built.get("drvPath") or "")
    except (json.JSONDecodeError, LookupError, TypeError):
        raise NixError(
            f"nix build of {pname} printed no store path",
            fix="run the nix build command by hand to see why",
            log_tail=log_tail,
        ) from None


# A compiler error line (rustc's `error[E0425]: ...`, cargo's `error: ...`) in nix's `pname> ` prefixed log, and
# cargo's closing summary of them, which names no cause.
ERROR_LINE = re.compile(r"(^|> )error(\[E\d+\])?:")
SUMMARY_LINE = re.compile(r"error: (could not compile|aborting due to)")
# Nix's "hash mismatch in fixed-output derivation '<drv>':" and the `specified:` and `got:` lines after it.
MISMATCH_LINE = re.compile(r"hash mismatch in fixed-output derivation '[^']+'|^\s*(specified|got):\s*\S+")
FIRST_ERRORS = 3
LINT_LINES = 40


def _build_progress(
    report: Progress, errors: list[str], lints: list[str] | None = None, mismatches: list[str] | None = None
) -> Callable[[str], None]:
    """Report progress lines, and keep the first few compiler errors (not cargo's summary) in `errors`, the
    first lint-level notes, coded errors and missing libraries in `lints`, and every hash mismatch's lines in
    `mismatches`."""

    def on_line(line: str) -> None:
        if mismatches is not None and MISMATCH_LINE.search(line):
            mismatches.append(line)
        if lints is not None and len(lints) < LINT_LINES and evidence.worth_keeping(line):
            lints.append(line)
        if len(errors) < FIRST_ERRORS and ERROR_LINE.search(line) and not SUMMARY_LINE.search(line):
            errors.append(line)
        text = line.split("> ", 1)[-1].strip()
        if text.startswith(("Compiling ", "Finished ", "Running ", "flakebot stand-in:")) or line.startswith(
            ("building '", "copying ")
        ):
            report(text)

    return on_line


def _build_failed(
    pname: str,
    returncode: int,
    tail: list[str],
    lock_file: Path,
    first_errors: list[str] | None = None,
    mismatches: list[str] | None = None,
) -> NixError:
    """A NixError naming the first compiler/cargo error (of `first_errors`, seen while the build ran, else of the
    tail), carrying the last lines of the nix log; a hash mismatch (of `mismatches`, seen while the build ran,
    else of the tail) comes first."""
    lines = [*(first_errors or []), *tail]
    mismatch = _hash_mismatch(pname, mismatches or tail, tail, lock_file)
    if mismatch is not None:
        return mismatch
    causes = [line for line in lines if ERROR_LINE.search(line) and not SUMMARY_LINE.search(line)]
    errors = [line.split("> ", 1)[-1].strip() for line in causes or [x for x in lines if ERROR_LINE.search(x)]]
    drv = _failed_derivation(tail)
    summary = errors[0] if errors else (tail[-1].strip() if tail else f"exit code {returncode}")
    fix = (
        f"read the whole log with 'nix log {drv}'" if drv else "run the nix build command by hand to read the whole log"
    )
    if "unable to download" in summary:
        fix = "without network, build offline with the host-toolchain stand-in: --nixpkgs host"
        if ".crate'" in summary:  # the stand-in's fetch of a crate Cargo.lock pins by checksum
            fix = "check that the crate server (setting cratesio_static_url) is reachable and serves this crate"
    return NixError(f"nix build of {pname} failed: {summary}", fix=fix, log_tail="\n".join(tail), drv=drv)


def _failed_derivation(tail: list[str]) -> str:
    """The derivation whose builder failed (the deps derivation or the tool's), else the first one the log names."""
    for pattern in (r"builder for '(/nix/store/[^' ]+\.drv)' failed", r"(/nix/store/[^' ]+\.drv)"):
        for line in tail:
            if m := re.search(pattern, line):
                return m.group(1)
    return ""


def _hash_mismatch(pname: str, lines: list[str], tail: list[str], lock_file: Path) -> NixError | None:
    """Nix's 'hash mismatch in fixed-output derivation' (its next lines say `specified:` and `got:`) as one line:
    for a git dependency's clone, which NAME-VERSION keys of cargoLock.outputHashes and the hashes as nix prints them
    (details: git_dependencies, specified, got); for the stand-in's crate fetches (crate-NAME-VERSION.tar.gz), which
    crate and the sha256 Cargo.lock expects. A --keep-going build reports one mismatch per fixed-output derivation:
    the error is the first that is not a git dependency's lib.fakeHash (flakebot fills those in itself), and
    details git_mismatches holds every git dependency's (git_dependencies, specified, got)."""
    found = _mismatches(lines)
    if not found:
        return None
    git = [(gitdeps.fetched_by(drv, lock_file), drv, specified, got) for drv, specified, got in found]
    placeholder = [bool(keys) and specified == gitdeps.FAKE_HASH for keys, _, specified, _ in git]
    keys, drv, specified, got = git[placeholder.index(False)] if False in placeholder else git[0]
    every_git = [{"git_dependencies": k, "specified": s, "got": g} for k, _, s, g in git if k]
    if keys:
        error = _git_hash_mismatch(pname, keys, specified, got, tail, drv)
        error.details["git_mismatches"] = every_git
        return error
    expected, got = _hex_sha256(specified), _hex_sha256(got)
    crate = re.fullmatch(r"[a-z0-9]{32}-crate-(.+)-(\d+\.\d+\.\d+\S*)\.tar\.gz\.drv", Path(drv).name)
    what = (
        f"crate {crate.group(1)} {crate.group(2)} does not match its Cargo.lock checksum"
        if crate
        else f"{Path(drv).name} fetched other bytes"
    )
    fix = (
        "the crate server (setting cratesio_static_url) sent other bytes than the registry Cargo.lock was written against: "
        "point the setting at that registry, or regenerate Cargo.lock"
        if crate
        else "the source changed since its hash was recorded: check the URL and the hash in the flake"
    )
    return NixError(
        f"nix build of {pname} failed: {what}: expected sha256 {expected}, got {got}",
        fix=fix,
        log_tail="\n".join(tail),
        drv=drv,
        git_mismatches=every_git,
    )


def _mismatches(lines: list[str]) -> list[tuple[str, str, str]]:
    """(derivation, specified, got) of each hash mismatch in `lines`, in the log's order ('?' for a hash not shown)."""
    found = []
    for index, line in enumerate(lines):
        if (mismatch := re.search(r"hash mismatch in fixed-output derivation '([^']+)'", line)) is None:
            continue
        hashes = dict(re.findall(r"(specified|got):\s*(\S+)", "\n".join(lines[index + 1 : index + 3])))
        found.append((mismatch.group(1), hashes.get("specified", "?"), hashes.get("got", "?")))
    return found


def _git_hash_mismatch(pname: str, keys: list[str], specified: str, got: str, tail: list[str], drv: str) -> NixError:
    """The clone of git dependency `keys` (one locked commit) hashed other than its cargoLock.outputHashes entry."""
    return NixError(
        f"nix build of {pname} failed: git dependency {', '.join(keys)} does not match its cargoLock.outputHashes "
        f"entry: expected {specified}, got {got}",
        fix="the repository holds other files at the locked commit than when the hash was taken, or the hash is wrong: "
        "check the repository, and put the hash received in outputHashes (flake.nix) only if you trust it",
        log_tail="\n".join(tail),
        drv=drv,
        git_dependencies=keys,
        specified=specified,
        got=got,
    )


def _hex_sha256(printed: str) -> str:
    """A hash as nix prints it (SRI `sha256-<base64>` in Nix 2.8) in hex, as Cargo.lock writes checksums."""
    if not printed.startswith("sha256-"):
        return printed
    try:
        return base64.b64decode(printed.removeprefix("sha256-"), validate=True).hex()
    except ValueError:
        return printed


GC_ROOT_TIMEOUT = 120  # seconds nix-store --add-root may take (a busy daemon)


def make_gc_root(store_path: str, link: Path) -> Path:
    """An indirect GC root at `link` (a symlink to the store path) so nix-collect-garbage keeps the tool."""
    return start_gc_root(store_path, link)()


def start_gc_root(store_path: str, link: Path) -> Callable[[], Path]:
    """Start `nix-store --add-root` for `link` and return the call that waits for it (the link, or NixError): most of
    its 20 ms is nix's own start, so two roots, or a root and a sandboxed run, take the time of one. An error starting
    it (no nix-store) is raised here."""
    link = Path(link)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    argv = [command.nix_program("nix-store"), "--add-root", str(link), "--realise", store_path]
    started = launcher.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finished() -> Path:
        try:
            _, stderr = started.communicate(timeout=GC_ROOT_TIMEOUT)
        except subprocess.TimeoutExpired:
            started.kill()
            started.communicate()
            raise NixError(
                f"cannot add a GC root at {link}: nix-store took over {GC_ROOT_TIMEOUT} s", fix="check the Nix daemon"
            ) from None
        if started.returncode != 0:
            raise NixError(
                f"cannot add a GC root at {link}: {stderr.strip().splitlines()[-1:] or started.returncode}",
                fix="check that the directory is writable",
            )
        return link

    return finished
