"""Proving a flake: `nix build --json` (Nix 2.8 has no --print-out-paths), a bounded smoke run, a GC root."""

from __future__ import annotations

import base64
import json
import logging
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import NixError
from flakebot.events import waiting_on
from flakebot.nix import command, evidence, gitdeps

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]
SMOKE_OUTPUT_HEAD = 2000


def build(
    flake_dir: Path, mode: str, standin: Path | None, settings: Settings, pname: str, report: Progress
) -> tuple[str, float]:
    """`nix build --json --no-link` of the flake's default package; returns (store path, seconds)."""
    argv = command.nix_argv(
        ["build"], ["--json", "--no-link", "-L", str(flake_dir)], mode, standin, settings.nix_builders
    )
    logger.info("nix build: %s", shlex.join(argv))
    errors: list[str] = []  # the first compiler errors, which a long log pushes out of the tail
    lints: list[str] = []  # lint levels, coded errors, ld's missing libraries of the whole log (evidence weighs them)
    with waiting_on(f"nix build of {pname}"):
        outcome = command.run_streaming(
            argv, settings.nix_build_timeout, _build_progress(report, errors, lints), cwd=flake_dir
        )
    log_tail = "\n".join(outcome.tail)
    if outcome.timed_out:
        raise NixError(
            f"nix build of {pname} timed out after {settings.nix_build_timeout:g} s",
            fix="raise nix_build_timeout ('flakebot config set nix_build_timeout 3600')",
            log_tail=log_tail,
        )
    if outcome.returncode != 0:
        failed = _build_failed(pname, outcome.returncode, outcome.tail, Path(flake_dir) / "Cargo.lock", errors)
        failed.details["lint_lines"] = "\n".join(lints)
        raise failed
    try:
        return str(json.loads(outcome.stdout)[0]["outputs"]["out"]), outcome.seconds
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
FIRST_ERRORS = 3
LINT_LINES = 40


def _build_progress(report: Progress, errors: list[str], lints: list[str] | None = None) -> Callable[[str], None]:
    """Report progress lines, and keep the first few compiler errors (not cargo's summary) in `errors`, and the
    first lint-level notes, coded errors and missing libraries in `lints`."""

    def on_line(line: str) -> None:
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
    pname: str, returncode: int, tail: list[str], lock_file: Path, first_errors: list[str] | None = None
) -> NixError:
    """A NixError naming the first compiler/cargo error (of `first_errors`, seen while the build ran, else of the
    tail), carrying the last lines of the nix log."""
    lines = [*(first_errors or []), *tail]
    mismatch = _hash_mismatch(pname, tail, lock_file)
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


def _hash_mismatch(pname: str, tail: list[str], lock_file: Path) -> NixError | None:
    """Nix's 'hash mismatch in fixed-output derivation' (its next lines say `specified:` and `got:`) as one line:
    for a git dependency's clone, which NAME-VERSION keys of cargoLock.outputHashes and the hashes as nix prints them
    (details: git_dependencies, specified, got); for the stand-in's crate fetches (crate-NAME-VERSION.tar.gz), which
    crate and the sha256 Cargo.lock expects."""
    for index, line in enumerate(tail):
        if (mismatch := re.search(r"hash mismatch in fixed-output derivation '([^']+)'", line)) is None:
            continue
        drv = mismatch.group(1)
        hashes = dict(re.findall(r"(specified|got):\s*(\S+)", "\n".join(tail[index + 1 : index + 3])))
        specified, got = hashes.get("specified", "?"), hashes.get("got", "?")
        if keys := gitdeps.fetched_by(drv, lock_file):
            return _git_hash_mismatch(pname, keys, specified, got, tail, drv)
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
        )
    return None


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


def smoke_run(bin_path: Path, timeout: float, sandbox_mode: str = "auto") -> dict[str, Any]:
    """Run `<bin> --help` (then `--version`; a cargo-NAME subcommand also `NAME --help`, as cargo calls it) in the
    sandbox with stdin empty; exit 0 within `timeout` seconds or a NixError."""
    attempts: list[dict[str, Any]] = []
    for args in smoke_arguments(bin_path.name):
        argv = [str(bin_path), *args]
        result = _sandboxed(argv, timeout, sandbox_mode)
        record = {
            "argv": argv,
            "exit_code": result.returncode,
            "output_head": (result.stdout + result.stderr)[:SMOKE_OUTPUT_HEAD],
        }
        if result.timed_out:
            raise NixError(
                f"smoke run '{shlex.join([bin_path.name, *args])}' hung and was killed after {timeout:g} s",
                fix="make the tool exit after printing --help, or raise smoke_timeout",
                smoke={**record, "timed_out": True},
            )
        if result.returncode == 0:
            return record
        attempts.append(record)
    said = [f"'{shlex.join([bin_path.name, *a['argv'][1:]])}' exited {a['exit_code']}" for a in attempts]
    codes = " and ".join([", ".join(said[:-1]), said[-1]] if len(said) > 1 else said)
    raise NixError(
        f"smoke run failed: {codes}", fix="the tool must print help or its version and exit 0", smoke=attempts[-1]
    )


def smoke_arguments(name: str) -> list[list[str]]:
    """The smoke runs to try in turn: --help, --version, and for a cargo subcommand (cargo-NAME, which cargo runs as
    `cargo-NAME NAME ARGS`) NAME --help."""
    tries = [["--help"], ["--version"]]
    if name.startswith("cargo-") and len(name) > len("cargo-"):
        tries.append([name.removeprefix("cargo-"), "--help"])
    return tries


def _sandboxed(argv: list[str], timeout: float, sandbox_mode: str) -> Any:
    """The built tool may hold model-written code: run it like every such command, in the sandbox."""
    from flakebot.sandbox import open_sandbox

    with tempfile.TemporaryDirectory(prefix="flakebot-smoke-") as tmp:
        tool_dir = Path(argv[0]).resolve().parent  # in the store for built tools; bound read-only wherever it is
        sandbox = open_sandbox(
            sandbox_mode, workspace=Path(tmp), writable=[Path(tmp)], readable=[tool_dir], timeout=timeout, adopt=True
        )
        return sandbox.run(argv, cwd=Path(tmp), stdin="", timeout=timeout)


def make_gc_root(store_path: str, link: Path) -> Path:
    """An indirect GC root at `link` (a symlink to the store path) so nix-collect-garbage keeps the tool."""
    link = Path(link)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    argv = [command.nix_program("nix-store"), "--add-root", str(link), "--realise", store_path]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise NixError(
            f"cannot add a GC root at {link}: {result.stderr.strip().splitlines()[-1:] or result.returncode}",
            fix="check that the directory is writable",
        )
    return link
