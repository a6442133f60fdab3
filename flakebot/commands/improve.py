"""improve: a catalogued tool's next version, crafted from its own source with every example kept."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from flakebot import config, preflight
from flakebot.commands.common import (
    LONG,
    check_craft_options,
    check_host,
    check_limits,
    run_overrides,
    settings_or_default,
    workdir_of,
)
from flakebot.commands.craft import CraftResult, StopAfter, craft_result, with_service_note
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import CatalogError, RunError, UsageError
from flakebot.events import EventSink, ignore
from flakebot.pipeline.request import Improvement, RunRequest, check_bounds, from_keywords, keyword_signature
from flakebot.pipeline.run import Run

if TYPE_CHECKING:
    from flakebot.toolspec import ToolSpec


def improve(
    tool: str,
    request: str,
    *,
    stop_after: str | None = None,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
    **options: Any,
) -> CraftResult:
    """Craft the next version of a catalogued tool: a fork-mode craft from its own source that keeps every
    acceptance example it has, adds new ones for `request` (from the spec model, or `spec_file`: summary,
    usage and the new examples), and catalogs the result as the tool's next version (0.1.0 -> 0.2.0). The
    earlier versions stay runnable as TOOL@VERSION.

    `tool` may name the version to start from (csv-dedup@0.1.0); the result is always the newest version."""
    run_request = from_keywords("improve", {"tool": tool, "request": request, **options})
    return improve_request(run_request, stop_after=stop_after, sink=sink, settings=settings)


improve.__signature__ = keyword_signature("improve", improve)  # type: ignore[attr-defined]


def improve_request(
    request: Annotated[
        RunRequest, Param("The improvement's request: the tool, the change, options.", request="improve")
    ],
    *,
    stop_after: StopAfter = None,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
) -> CraftResult:
    """Craft a catalogued tool's next version: flakebot improve csv-dedup "also support --delimiter".

    The new version starts from the tool's own source (fork mode), keeps every acceptance example it has and
    adds new ones for the change; it is catalogued as the next version (0.1.0 -> 0.2.0), the current one from
    then on. Earlier versions stay runnable: flakebot run csv-dedup@0.1.0. 'flakebot show TOOL' lists them.
    """
    # `improve` of a RunRequest whose `improve` names the tool and the change (the rest is filled in here)
    from flakebot.deliver.versions import newest, next_version
    from flakebot.pipeline import engine as pipeline
    from flakebot.source.acquisition import start_point

    started = time.monotonic()
    asked, overrides, settings, entry, manifest, kept = _checked(request, stop_after, settings)
    source = Path(entry["dir"]) / "flake"
    start, _ = start_point(str(source), name=str(manifest.get("package") or ""))
    improvement = Improvement(
        tool=entry["name"],
        request=asked.request,
        from_version=entry["version"],
        version=next_version(newest(list(entry["versions"]))),
        need=entry["need"],
        kept_spec=kept.to_dict(),
    )
    request = dataclasses.replace(
        request,
        need=f"improve {entry['name']}: {asked.request}",
        name=entry["name"],
        start=start.to_dict(),
        from_location=f"{entry['name']}@{entry['version']}",
        spec_file=str(Path(request.spec_file).resolve()) if request.spec_file else None,
        fresh=True,
        settings=overrides,
        improve=improvement,
    )
    run = pipeline.start("craft", workdir_of(settings), settings, request, sink, stop_after)
    return with_service_note(craft_result(run, time.monotonic() - started), settings)


def _checked(
    request: RunRequest, stop_after: str | None, settings: config.Settings | None
) -> tuple[Improvement, dict[str, Any], config.Settings, dict[str, Any], dict[str, Any], ToolSpec]:
    """What improve checks before its run (and before an MCP job: the command's check): the change's words, the
    tool (catalogued, not a service, its examples and sources kept), the spec file, the model, the options and this
    machine. Returns the improvement asked, the settings it overrides, the settings, the entry, its manifest and the
    spec it keeps."""
    from flakebot.llm.providers import check_model
    from flakebot.toolspec import improvement_from_file

    asked = request.improve or Improvement(tool="", request="")
    preflight.check_text("improvement", asked.request, example='flakebot improve csv-dedup "also support --delimiter"')
    check_bounds(request)
    overrides = run_overrides(request.overrides())
    settings = dataclasses.replace(settings_or_default(settings), **overrides)
    entry, manifest = _improved(asked, settings)
    kept = _kept_spec(entry, manifest, settings)
    if request.spec_file:  # a bad file fails before any work
        improvement_from_file(kept, Path(request.spec_file))
    check_model(request.model, settings)
    check_craft_options(None, None, None, stop_after)
    check_limits(settings)
    check_host(settings, request.registry)
    source = Path(entry["dir"]) / "flake"
    if not (source / "Cargo.toml").is_file():
        raise CatalogError(
            f"{entry['name']}@{entry['version']} has no sources in {source}",
            fix=f"craft it again with 'flakebot craft --fresh', or remove it with 'flakebot rm {entry['name']}'",
        )
    return asked, overrides, settings, entry, manifest, kept


def _kept_spec(entry: dict[str, Any], manifest: dict[str, Any], settings: config.Settings) -> ToolSpec:
    """The spec (whole examples, file contents included) of the version an improvement starts from: its
    manifest's, or for a tool crafted before manifests kept it, its run's while the run is still there."""
    from flakebot.toolspec import ToolSpec

    spec = manifest.get("spec")
    if not spec:
        try:
            spec = Run.load(workdir_of(settings), entry.get("run_id", "")).output("spec")
        except RunError:
            spec = None
    if not spec or not spec.get("examples"):
        raise CatalogError(
            f"{entry['name']}@{entry['version']} was crafted before flakebot kept its acceptance examples whole",
            fix=f"craft it again with 'flakebot craft --fresh \"{entry.get('need', '')}\"', then improve that",
        )
    return ToolSpec.from_dict(spec, source=f"{entry['name']}@{entry['version']}")


def _improved(asked: Improvement, settings: config.Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The catalogued tool an improvement starts from (its entry, NAME@VERSION's fields with every version under
    "versions", and its manifest), refused when unknown or a service."""
    from flakebot.deliver.catalog import Catalog, show_tool

    catalog = Catalog.open(settings)
    entry = catalog.get(asked.tool)
    catalog.writable(entry["name"])  # a tenant improves its own tools, not the organisation's
    manifest = show_tool(asked.tool, settings)["manifest"]
    if manifest.get("kind") == "service":  # its spec is a lifecycle, not command-line examples to keep
        raise UsageError(
            f"'{asked.tool}' is a service: improving a service is not built yet",
            fix=f"craft it again with 'flakebot craft --service --fresh \"...\" --name {entry['name']}'",
        )
    return entry, manifest


def _check_improve(request: RunRequest, stop_after: str | None = None, settings: config.Settings | None = None) -> None:
    """What needs nothing built, before an MCP job exists: what improve checks before its run (`_checked`; that the
    tool and the change are named at all, every door checks first: table.check_values)."""
    _checked(request, stop_after, settings)


COMMANDS = [
    Command(
        "improve",
        improve_request,
        mcp="improve",
        hints=Hints("Improve a crafted tool", open_world=True),
        long=True,
        changes_catalog=True,
        working="improve {request}",
        check=_check_improve,
        mcp_description="Craft a catalogued tool's next version (0.1.0 -> 0.2.0) from its own source: every "
        "acceptance example it has must still pass, new ones are added for the change. Earlier versions stay callable "
        f"through `run` as NAME@VERSION.{LONG}",
    )
]
