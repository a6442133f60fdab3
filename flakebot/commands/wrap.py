"""package: an existing crate wrapped as a flake, built and smoke-run (no model; the package stage,
stages/package.py, does the building for every run); catalogued with catalog=True."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from flakebot import config, preflight
from flakebot.commands.common import LONG, check_crate, run_overrides, settings_or_default, workdir_of
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import UsageError
from flakebot.events import EventSink, ignore
from flakebot.pipeline.request import RunRequest, from_keywords, keyword_signature

if TYPE_CHECKING:
    from flakebot.stages.outputs import PackageOut


def package(
    target: str, *, sink: EventSink = ignore, settings: config.Settings | None = None, **options: Any
) -> PackageOut:
    """Wrap a crate (a directory, or a crate name from the registry) as a pinned flake, build it and smoke-run it. No model.

    The keywords are the package options of RunRequest's fields: `registry`, `bin_name`, `nixpkgs`, `out` (the
    flake goes there, kept by `flakebot clean`; else into the run directory), `offline`, `catalog` (also put the
    built binary in the catalog as a tool, named `name` or after the binary, which run_tool, call_tool and the MCP
    server then offer like a crafted one) and `strict_smoke` (refuse a tool whose smoke run is below level help).
    Returns the package stage's output (flake, store path, how to run it, the smoke run's level in `smoke`) with the
    run id, and the catalog entry when catalogued.
    """
    return package_request(from_keywords("package", {"target": target, **options}), sink=sink, settings=settings)


package.__signature__ = keyword_signature("package", package)  # type: ignore[attr-defined]


def package_request(
    request: Annotated[RunRequest, Param("The crate to package and how.", request="package")],
    *,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
) -> PackageOut:
    """Wrap a Rust crate as a pinned Nix flake, nix build it and smoke-run it (no model involved)."""
    # `package` of a RunRequest naming its target (and registry, bin, out, and the nixpkgs or offline settings)
    from flakebot.pipeline import engine as pipeline
    from flakebot.stages.outputs import PackageOut

    _check_package(request, settings)  # what needs nothing built, before a run (and its directory) exists
    target = request.target or ""
    # offline: no crates.io, cargo --offline, the host stand-in for nixpkgs (as craft does)
    overrides = run_overrides(request.overrides())
    settings = dataclasses.replace(settings_or_default(settings), **overrides)
    path = Path(target).expanduser()
    request = dataclasses.replace(
        request,
        need=f"package {target}",
        target=str(path.resolve()) if path.exists() else target,
        out=str(Path(request.out).expanduser().resolve()) if request.out else None,
        settings=overrides,
    )
    run = pipeline.start("package", workdir_of(settings), settings, request, sink)
    catalogued = run.output("catalog").get("catalog") or {} if request.catalog else {}
    return dataclasses.replace(PackageOut.from_dict(run.output("package")), run_id=run.id, catalog=catalogued)


def _check_catalog_name(name: str, target: str, settings: config.Settings, agent: bool = False) -> None:
    """--name is well formed and not held by a crafted tool, a service, or another crate's package: a packaged
    crate replaces only its own earlier entry. Which crate a directory holds, cargo says only once the run has it
    (the catalog stage checks that); a crate named from the registry is known now. `agent`: said as MCP names the
    argument (`name`) and the removal (the rm tool)."""
    from flakebot.deliver.catalog import Catalog
    from flakebot.stages.catalog_packaged import PACKAGED_NEED, catalog_name

    option = "name" if agent else "--name"
    catalog_name(name, "", option)
    holder = Catalog.open(settings).entry(name)  # one row, not the whole index
    need = str((holder or {}).get("need", ""))
    if holder is None or (need.startswith(PACKAGED_NEED) and _replaceable(need, target)):
        return
    remove = f"the rm tool with tool {name}" if agent else f"'flakebot rm {name}'"
    raise UsageError(
        f"the catalog already has a tool named {name} for another need ({need!r})",
        fix=f"pass {option} {name}-2 (or another free name), or remove the old one with {remove}",
    )


def _replaceable(need: str, target: str) -> bool:
    """Whether packaging `target` may replace the packaged crate whose need is `need`: a directory's crate cargo
    names in the run (the catalog stage checks it); a crate named from the registry must be the same crate."""
    from flakebot.stages.catalog_packaged import packaged_need
    from flakebot.stages.locate import check_target

    if check_target(target) is not None:
        return True
    return need.replace("_", "-").lower() == packaged_need(target).replace("_", "-").lower()


def _check_package(request: RunRequest, settings: config.Settings | None = None, agent: bool = False) -> None:
    """What needs nothing built, before a run or an MCP job exists (the command's check, and the first thing
    package_request does): --name only with --catalog and free for a packaged crate, the target a crate
    directory or a crate name (one the registry holds, when it is on this machine), --out new or empty, the catalog writable when the crate goes into it. That the target is named at all, every door checks first
    (table.check_values). `agent`: over MCP, its arguments named as MCP names them."""
    from flakebot.nix.flake import check_out_dir
    from flakebot.stages.locate import CRATE_NAME, check_target

    if request.name:
        if not request.catalog:
            fix = "add catalog: true, or leave name out" if agent else "add --catalog, or leave --name out"
            raise UsageError("a name is for a catalogued package only", fix=fix)
        _check_catalog_name(request.name, request.target or "", settings_or_default(settings), agent)
    if request.bin and not CRATE_NAME.match(request.bin):  # which binaries it has, cargo says in the run
        shown = request.bin if len(request.bin) <= 64 else request.bin[:64] + "..."
        raise UsageError(
            f"'{shown}' is not a binary name",
            fix=f"pass {'bin' if agent else '--bin'} with one of the crate's binaries (letters, digits, '-' and '_')",
        )
    if check_target(request.target or "") is None:  # a crate name: the registry holds it (when it is here)
        overridden = dataclasses.replace(settings_or_default(settings), **run_overrides(request.overrides()))
        check_crate(request.target or "", request.registry, overridden)
    if request.out:
        preflight.check_path_name(request.out, "out")
        out = Path(request.out).expanduser()
        check_out_dir(out)
        preflight.check_could_be_dir(out, "out", fix="choose an output directory that can be made (new or empty)")
    if request.catalog:  # a read-only catalog is said now, not after the build
        preflight.check_writable_dir(settings_or_default(settings).path("catalog_dir"), "catalog_dir")


COMMANDS = [
    Command(
        "package",
        package_request,
        mcp="package",
        hints=Hints("Package a crate", idempotent=True, open_world=True),
        long=True,
        changes_catalog=True,  # with catalog: tools/list_changed once its result holds the catalog entry
        working="package {request}",
        check=_check_package,
        mcp_description="Wrap a Rust crate (a directory, or a crate name from the registry) as a pinned Nix flake, "
        "build it and smoke-run it. No model. With catalog, the built tool joins the catalog (and this server's tool "
        f"list) like a crafted one.{LONG}",
    )
]
