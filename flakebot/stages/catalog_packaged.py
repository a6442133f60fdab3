"""The package pipeline's catalog stage (`flakebot package CRATE --catalog`): the packaged crate catalogued as an agent
tool.

No model is involved: the manifest is built from what flakebot observed of the built binary (its `--help` where it
has one, read in the sandbox; else what its smoke run printed) and the crate's own description, so `flakebot run`,
`list` and `flakebot mcp` offer it as they offer a crafted tool, run in the same sandbox. It has no acceptance
examples; its manifest records the smoke run's level (help, usage, runs, starts-only) and the evidence. Without --catalog
the stage does nothing.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from flakebot.deliver.catalog import Catalog
from flakebot.deliver.manifest import build_manifest, shell_command, usage_markdown
from flakebot.errors import UsageError
from flakebot.nix.command import require_nix_run_target
from flakebot.pipeline.engine import StageContext
from flakebot.redact import redact_text
from flakebot.stages.instruct import add_to_catalog, observe, package_run
from flakebot.stages.outputs import CatalogOut, LocateOut, PackageOut
from flakebot.toolspec import NAME_RE

logger = logging.getLogger(__name__)


def catalog_stage(ctx: StageContext) -> CatalogOut:
    """Catalogue the packaged crate's binary (as NAME: --name, else the binary's name) when the request asks."""
    if not ctx.request.catalog:
        return CatalogOut()
    built = ctx.get(PackageOut)
    package = built.to_dict()
    catalog = Catalog.open(ctx.settings)
    name = catalog_name(ctx.request.name, built.main_program)
    need = packaged_need(built.pname)
    version = catalog.version_for(name)
    flake_ref = str(catalog.version_dir(name, version) / "flake")
    nix_run = package_run(package, flake_ref)
    help_from, help_text = _help(ctx, built)
    ctx.progress("checking that nix run resolves to the smoke-run store path")
    manifest = build_manifest(
        spec={"name": name, "summary": built.description or f"{built.pname} {built.version}", "usage": ""},
        need=need,
        package=package,
        flake_ref=flake_ref,
        nix_run=nix_run,
        help_text=help_text,
        examples=[],
        verification=_verify(ctx, package, nix_run),
        origin=_origin(ctx),
        run_id=ctx.run.id,
        sandbox=ctx.settings.sandbox,
    )
    manifest["packaged"] = {"crate": built.pname, "version": built.version}
    manifest["help_from"] = help_from
    manifest["catalog_dir"] = str(catalog.version_dir(name, version))
    manifest["catalog_version"] = version
    usage_md = redact_text(usage_markdown(manifest))  # it quotes the tool's output
    entry = add_to_catalog(ctx, catalog, name, package, manifest, usage_md, need=need, version=version)
    return CatalogOut(manifest=manifest, usage_markdown=usage_md, catalog=entry)


def catalog_name(given: str | None, binary: str, option: str = "--name") -> str:
    """The tool's name in the catalog: --name, else the binary's in kebab-case (look_up -> look-up); the name is a
    directory of the catalog, so anything else is refused (said back cut short; `option`: the argument as the
    caller's door spells it, `name` over MCP)."""
    name = given or re.sub(r"[_.]+", "-", binary.lower()).strip("-")
    if not NAME_RE.match(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise UsageError(
            f"'{shown}' cannot name a catalogued tool (lower-case words joined by -)",
            fix=f"pass {option} with a name like csv-dedup",
        )
    return name


PACKAGED_NEED = "packaged crate "


def packaged_need(pname: str) -> str:
    """The need a packaged crate's tool is catalogued for: packaging the same crate again replaces it."""
    return f"{PACKAGED_NEED}{pname}"


def _help(ctx: StageContext, built: PackageOut) -> tuple[str, str]:
    """(the command, its text) the tool's parameters are read from: its help (the stdout of the smoke try that exited
    0, which the smoke run kept whole; read again in the sandbox when it printed its help on stderr, or the package
    stage ran before it kept that stdout), else the usage or error its smoke run printed."""
    smoke = built.smoke
    if smoke.get("level") == "help" and smoke.get("stdout") and isinstance(smoke["stdout"], str):  # the try, whole
        return smoke["command"], smoke["stdout"]
    if smoke.get("level") == "help":
        ctx.progress(f"reading '{smoke['command']}' of the built tool (sandboxed)")
        argv = [str(Path(built.store_path) / "bin" / built.main_program), *smoke["argv"][1:]]
        result = observe(ctx, argv)
        return smoke["command"], result.stdout or result.stderr
    return smoke.get("command", ""), str(smoke.get("output_head", ""))


def _verify(ctx: StageContext, package: dict[str, Any], nix_run: list[str]) -> dict[str, Any]:
    """The `nix run` command a caller will use must start the binary the smoke run ran (evaluated, not run)."""
    program = require_nix_run_target(package, "smoke-run", ctx.settings.nix_build_timeout)
    smoke = package.get("smoke") or {}
    return {
        "command": shell_command(nix_run, list(smoke.get("argv", ["", "--help"])[1:])),
        "exit_code": smoke.get("exit_code", 0),
        "passed": smoke.get("level") == "help",
        "stdout_head": str(smoke.get("output_head", ""))[:2000],
        "resolves_to": program,
        "how": f"the smoke run (level {smoke.get('level')}) ran on this store path in the sandbox; nix run was "
        "evaluated (not executed) and resolves to it",
    }


def _origin(ctx: StageContext) -> dict[str, Any]:
    located = ctx.get(LocateOut)
    return located.origin or {"method": "path", "url": located.source_dir}
