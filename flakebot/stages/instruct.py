"""The instruct stage: observe the built tool (help text, every example), check what `nix run` would run,
write manifest.json and USAGE.md, and only then put the tool in the catalog.

Every run of the built tool (model-written code) is in the normal sandbox: no privilege, /nix/store
read-only, nothing of the catalog bound. `nix run` itself is not executed here: flakebot evaluates what
it would start (flakebot.nix.command.resolved_program) and requires the store path it just tested.
One failing example, or a `nix run` that resolves elsewhere, means no catalog entry.
"""

from __future__ import annotations

import functools
import logging
import tempfile
from pathlib import Path
from typing import Any

from flakebot.agent.acceptance import EXAMPLES_AT_ONCE, built_file, example_record, run_example
from flakebot.deliver.catalog import Catalog
from flakebot.deliver.manifest import build_manifest, shell_command, usage_markdown
from flakebot.errors import NixError
from flakebot.fsutil import atomic_write_json, atomic_write_text
from flakebot.nix.command import require_nix_run_target
from flakebot.pipeline.engine import StageContext
from flakebot.redact import redact_text
from flakebot.sandbox import CommandResult, limits_for, open_sandbox
from flakebot.sandbox.process import at_once
from flakebot.stages.outputs import AcquireOut, EditOut, InstructOut, PackageOut, SpecOut, tested_spec
from flakebot.stages.service import instruct_service
from flakebot.toolspec import Example

logger = logging.getLogger(__name__)
STORE = "the tool's store path"


def instruct_stage(ctx: StageContext) -> InstructOut:
    spec, built = tested_spec(ctx.get(SpecOut), ctx.get(EditOut)), ctx.get(PackageOut)
    package = built.to_dict()
    _remove_early(ctx)
    catalog = Catalog.open(ctx.settings)
    improve = ctx.request.improve
    need = improve.need if improve and improve.need else ctx.request.need  # an improvement keeps the tool's need
    version = improve.version if improve and improve.version else catalog.version_for(spec.name)
    flake_ref = str(catalog.version_dir(spec.name, version) / "flake")
    store = Path(built.store_path)  # bin/<main> there is the build's: a link in it is refused, never resolved
    binary = built_file(store / "bin" / (built.main_program or spec.name), store, STORE)
    nix_run = package_run(package, flake_ref)
    if spec.service:
        manifest, usage_md = instruct_service(ctx, spec, package, binary, nix_run, need)
        manifest.update(catalog_dir=str(catalog.version_dir(spec.name, version)), catalog_version=version)
        entry = add_to_catalog(ctx, catalog, spec.name, package, manifest, usage_md, need=need, version=version)
        return InstructOut(manifest=manifest, usage_markdown=usage_md, catalog=entry)
    ctx.progress("reading --help, running every example (sandboxed), checking what nix run starts")
    # --help (unless the smoke run read it) beside the examples, not before them: a sandbox's start-up is most of each
    # run; and what nix run starts (evaluated beside the tool's nix build, else its `nix eval` here: no code of the
    # tool's runs in it) beside both.
    # at_once: a Ctrl-C or a failure kills every run still going, as it killed --help when that ran on this thread
    runs = [functools.partial(_example, ctx, binary, store, example, nix_run) for example in spec.tool_spec().examples]
    resolve = functools.partial(_nix_run_target, package, ctx.settings.nix_build_timeout)
    smoked = smoked_help(built.smoke, binary)
    read_help = [] if smoked is not None else [functools.partial(observe, ctx, [str(binary), "--help"])]
    observed: list[Any] = at_once([resolve, *read_help, *runs], EXAMPLES_AT_ONCE + 2)
    program, examples = observed[0], observed[1 + len(read_help) :]
    help_text = smoked if smoked is not None else observed[1].stdout
    _require_all_passed(examples)  # a failing example is the error to report, before what nix run resolves to
    if isinstance(program, NixError):
        raise program
    verification = verify(nix_run, examples, program)
    manifest = build_manifest(
        spec=spec.to_dict(),
        need=need,
        package=package,
        flake_ref=flake_ref,
        nix_run=nix_run,
        help_text=help_text,
        examples=examples,
        verification=verification,
        origin=ctx.get(AcquireOut).origin,
        run_id=ctx.run.id,
        sandbox=ctx.settings.sandbox,
        corrected_examples=[d for d in ctx.get(EditOut).disputes if d["outcome"] == "corrected"],
        untested=ctx.get(AcquireOut).untested,
    )
    manifest["catalog_dir"] = str(catalog.version_dir(spec.name, version))
    manifest["catalog_version"] = version
    if improve:
        manifest["improves"] = {"version": improve.from_version, "request": improve.request}
    # it quotes the tool's output; JSON records are redacted as written
    usage_md = redact_text(usage_markdown(manifest))
    entry = add_to_catalog(ctx, catalog, spec.name, package, manifest, usage_md, need=need, version=version)
    return InstructOut(manifest=manifest, usage_markdown=usage_md, catalog=entry)


def _remove_early(ctx: StageContext) -> None:
    """The workspace and the edit loop's deps flake, read by no stage from here on (the package stage copied the crate
    into the run's flake/, which this stage and the catalog read), removed while the tool's examples run, not in clean
    after them: clean waits for each removal (pipeline/cleanup.py). Kept for --keep, and the workspace for --push."""
    from flakebot.pipeline.cleanup import remove_early

    if ctx.request.keep:
        return
    remove_early(ctx.run, ctx.run.dir / "loop-deps")
    if not ctx.request.push:
        remove_early(ctx.run, ctx.run.workspace)


def add_to_catalog(
    ctx: StageContext,
    catalog: Catalog,
    name: str,
    package: dict[str, Any],
    manifest: dict[str, Any],
    usage_md: str,
    *,
    need: str,
    version: str,
) -> dict[str, Any]:
    """Put the verified tool in the catalog (atomically) as `version`, then write the run's copies; on any failure
    after the entry exists that version is removed again, so a failed craft never leaves a runnable tool."""
    entry = catalog.add(
        name,
        version=version,
        change=(manifest.get("improves") or {}).get("request", ""),
        need=need,
        flake_dir=Path(package["flake_dir"]),
        manifest=manifest,
        usage_md=usage_md,
        store_path=package["store_path"],
        dependencies_path=package.get("dependencies_path", ""),
        run_id=ctx.run.id,
        origin=manifest["origin"],
    )
    try:
        atomic_write_json(ctx.run.dir / "manifest.json", manifest)
        atomic_write_text(ctx.run.dir / "USAGE.md", usage_md)
    except BaseException:
        logger.warning("removing %s %s from the catalog: the craft failed after it was added", name, version)
        catalog.remove(f"{name}@{version}")
        raise
    return entry


def package_run(package: dict[str, Any], flake_ref: str) -> list[str]:
    """The `nix run` command line for the tool's flake at `flake_ref` (with the host override when in host mode)."""
    argv = list(package["nix_run_argv"])
    return [flake_ref if arg == package["flake_ref"] else arg for arg in argv]


def smoked_help(smoke: dict[str, Any], binary: Path) -> str | None:
    """The stdout of `binary --help` as the package stage's smoke run read it (exit 0, sandboxed, under the limits
    observe runs it with), or None (it took another try, or a state.json from before it kept that stdout): one run
    of the built tool serves both stages."""
    stdout = smoke.get("stdout")  # a text, or state.json was edited or damaged: then --help is read again
    if smoke.get("argv") == [str(binary), "--help"] and smoke.get("exit_code") == 0 and isinstance(stdout, str):
        return stdout
    return None


def observe(ctx: StageContext, argv: list[str]) -> CommandResult:
    """Run the built tool (model-written code) in the sandbox, in an empty scratch directory, stdin empty."""
    with tempfile.TemporaryDirectory(prefix="flakebot-observe-") as tmp:
        cwd = Path(tmp)
        limits = limits_for(ctx.settings, timeout=ctx.settings.smoke_timeout)
        sandbox = open_sandbox(
            ctx.settings.sandbox,
            workspace=cwd,
            writable=[cwd],
            readable=[Path(argv[0]).parent],
            limits=limits,
            adopt=True,
        )
        return sandbox.run(argv, cwd=cwd, stdin="")


def _example(ctx: StageContext, binary: Path, store: Path, example: Example, nix_run: list[str]) -> dict[str, Any]:
    limits = limits_for(ctx.settings, timeout=ctx.settings.smoke_timeout)
    passed, result = run_example(binary, example, ctx.settings.sandbox, limits, store, STORE)
    return {**example_record(example, passed, result), "command": shell_command(nix_run, example.args, example.stdin)}


def _nix_run_target(package: dict[str, Any], timeout: float) -> str | NixError:
    """What nix run of the package's flake starts (require_nix_run_target), or the error saying it is not the tested
    binary: returned, not raised, so a failing example running beside it is still the error reported first."""
    try:
        return require_nix_run_target(package, "tested", timeout)
    except NixError as exc:
        return exc


def _require_all_passed(examples: list[dict[str, Any]]) -> None:
    failed = [(n, e) for n, e in enumerate(examples, 1) if not e["passed"]]
    if failed:
        n, first = failed[0]
        got, wanted = (
            f"{first['stdout'][:200]!r} with exit {first['exit_code']}",
            f"{first['expected_stdout'][:200]!r} with exit {first['expected_exit_code']}",
        )
        raise NixError(
            f"{len(failed)} of {len(examples)} examples fail on the built tool; example {n} ({first['description'] or ' '.join(first['args'])}) "
            f"printed {got}, expected {wanted}",
            fix="the tests passed in the workspace but the built tool disagrees: inspect the run with --keep",
            failed_examples=[n for n, _ in failed],
        )


def verify(nix_run: list[str], examples: list[dict[str, Any]], program: str) -> dict[str, Any]:
    """The record of the `nix run` command a caller will use: it starts `program`, the binary every example just
    passed on (require_nix_run_target evaluated the run's own flake: the catalog's copy is the same files, so the
    same store path)."""
    shown = next((e for e in examples if not e["files"] and e["expected_exit_code"] == 0), None)
    args, stdin = (shown["args"], shown["stdin"]) if shown else (["--help"], "")
    return {
        "command": shell_command(nix_run, args, stdin),
        "exit_code": shown["exit_code"] if shown else 0,
        "passed": True,
        "stdout_head": shown["stdout"][:2000] if shown else "",
        "resolves_to": program,
        "how": "every example ran on this store path in the sandbox; nix run was evaluated (not executed) and resolves to it",
    }
