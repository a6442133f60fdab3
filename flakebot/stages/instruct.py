"""The instruct stage: observe the built tool (help text, every example, a verification command),
write manifest.json and USAGE.md, and put the tool in the catalog."""

from __future__ import annotations

import logging
import shlex
import tempfile
from pathlib import Path
from typing import Any

from flakebot.deliver.catalog import Catalog
from flakebot.deliver.manifest import build_manifest, shell_command, usage_markdown
from flakebot.errors import NixError
from flakebot.fsutil import atomic_write_json
from flakebot.pipeline.engine import StageContext
from flakebot.stages.outputs import AcquireOut, InstructOut, PackageOut, SpecOut

logger = logging.getLogger(__name__)


def instruct_stage(ctx: StageContext) -> InstructOut:
    spec, built = ctx.get(SpecOut).to_dict(), ctx.get(PackageOut)
    package = built.to_dict()
    catalog = Catalog.open(ctx.settings)
    flake_ref = str(catalog.tool_dir(spec["name"]) / "flake")
    binary = str(Path(built.store_path) / "bin" / (built.main_program or spec["name"]))
    ctx.progress("reading --help and running the examples against the built tool")
    help_text = observe(ctx, [binary, "--help"]).stdout
    examples = [run_example(ctx, binary, example, package_run(package, flake_ref)) for example in spec["examples"]]
    nix_run = package_run(package, flake_ref)
    manifest_in_run = build_manifest(
        spec=spec,
        need=ctx.run.state["need"],
        package=package,
        flake_ref=flake_ref,
        nix_run=nix_run,
        help_text=help_text,
        examples=examples,
        verification={"command": "", "exit_code": None, "passed": False},
        origin=ctx.get(AcquireOut).origin,
        run_id=ctx.run.id,
        untested=ctx.get(AcquireOut).untested,
    )
    usage_md = usage_markdown(manifest_in_run)
    entry = catalog.add(
        spec["name"],
        need=ctx.run.state["need"],
        flake_dir=Path(package["flake_dir"]),
        manifest=manifest_in_run,
        usage_md=usage_md,
        store_path=package["store_path"],
        run_id=ctx.run.id,
        origin=manifest_in_run["origin"],
    )
    ctx.progress("verifying the catalogued flake with nix run")
    manifest = {**manifest_in_run, "verification_command": verify(ctx, spec, nix_run), "catalog_dir": entry["dir"]}
    usage_md = usage_markdown(manifest)
    for directory in (ctx.run.dir, Path(entry["dir"])):
        atomic_write_json(directory / "manifest.json", manifest)
        (directory / "USAGE.md").write_text(usage_md)
    return InstructOut(manifest=manifest, usage_markdown=usage_md, catalog=entry)


def package_run(package: dict[str, Any], flake_ref: str) -> list[str]:
    """The `nix run` command line for the tool's flake at `flake_ref` (with the host override when in host mode)."""
    argv = list(package["nix_run_argv"])
    return [flake_ref if arg == package["flake_ref"] else arg for arg in argv]


def observe(ctx: StageContext, argv: list[str], stdin: str = "", files: dict[str, str] | None = None, *, through_nix: bool = False) -> Any:
    """Run the built tool (model-written code) inside the sandbox, in a scratch directory holding `files`.

    `through_nix`: argv is a `nix run` command; nix needs the store writable and its own uid, so the
    sandbox keeps uid 0 without capabilities, still with no network and a private home and /tmp."""
    from flakebot.nix.standin import standin_dir
    from flakebot.sandbox import open_sandbox

    with tempfile.TemporaryDirectory(prefix="flakebot-observe-") as tmp:
        cwd = Path(tmp)
        for name, content in (files or {}).items():
            (cwd / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / name).write_text(content)
        writable = [cwd, Path("/nix")] if through_nix else [cwd]
        readable = [ctx.settings.path("catalog_dir"), standin_dir(ctx.settings)] if through_nix else []
        timeout = ctx.settings.nix_build_timeout if through_nix else ctx.settings.smoke_timeout
        sandbox = open_sandbox(ctx.settings.sandbox, workspace=cwd, writable=writable, readable=readable, timeout=timeout, keep_root=through_nix)
        return sandbox.run(argv, cwd=cwd, stdin=stdin, timeout=timeout)


def run_example(ctx: StageContext, binary: str, example: dict[str, Any], nix_run: list[str]) -> dict[str, Any]:
    result = observe(ctx, [binary, *example["args"]], example.get("stdin", ""), example.get("files"))
    return {
        "description": example.get("description", ""),
        "args": example["args"],
        "stdin": example.get("stdin", ""),
        "files": sorted(example.get("files") or {}),
        "command": shell_command(nix_run, example["args"], example.get("stdin", "")),
        "stdout": result.stdout,
        "exit_code": result.returncode,
        "expected_stdout": example["stdout"],
        "expected_exit_code": example.get("exit_code", 0),
        "passed": result.stdout == example["stdout"] and result.returncode == example.get("exit_code", 0),
    }


def verify(ctx: StageContext, spec: dict[str, Any], nix_run: list[str]) -> dict[str, Any]:
    """Run the tool through `nix run` from the catalog, as a caller would, and check the output.

    The first example that needs no files and succeeds is used; with none, `--help` must exit 0."""
    example = next((e for e in spec["examples"] if not e.get("files") and e.get("exit_code", 0) == 0), None)
    args, stdin, expected = (example["args"], example.get("stdin", ""), example["stdout"]) if example else (["--help"], "", None)
    result = observe(ctx, [*nix_run, "--", *args], stdin, through_nix=True)
    passed = result.returncode == 0 and (expected is None or result.stdout == expected)
    if not passed:
        raise NixError(
            f"verification through nix run failed (exit {result.returncode})",
            fix="inspect the flake in the run directory; the log tail is in the error details",
            command=shlex.join([*nix_run, "--", *args]),
            log_tail=(result.stderr or "")[-3000:],
        )
    return {"command": shell_command(nix_run, args, stdin), "exit_code": result.returncode, "passed": True, "stdout_head": result.stdout[:2000]}
