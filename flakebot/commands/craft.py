"""craft: a need becomes a tested, Nix-built tool (or the catalogued one); its request's checks and its result."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

from flakebot import config, preflight
from flakebot.commands.common import (
    LONG,
    check_craft_options,
    check_crate,
    check_host,
    check_limits,
    run_overrides,
    settings_or_default,
    workdir_of,
)
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import RunError, UsageError
from flakebot.events import EventSink, ignore
from flakebot.pipeline.request import RunRequest, check_bounds, from_keywords, keyword_signature
from flakebot.pipeline.run import Run

logger = logging.getLogger(__name__)


@dataclass
class CraftResult:
    """What a craft hands back to its caller."""

    status: str  # "crafted" | "cached" | "installed" (from a shared catalog) | "stopped"
    name: str
    run_id: str
    manifest: dict[str, Any] = field(default_factory=dict)
    usage_markdown: str = ""
    choice: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    version: str = ""  # the tool's version in the catalog (0.1.0, then 0.2.0 after an improvement)
    installed_from: dict[str, Any] = field(default_factory=dict)  # the shared catalog and signer, when installed
    service: str = ""  # a service of this name started here keeps its own program (services/identity.py)

    @property
    def from_catalog(self) -> bool:
        return self.status in ("cached", "installed")

    def to_dict(self) -> dict[str, Any]:
        """Its fields, and once there is a tool or service: what it is and the door to use it by (deliver/howto.py)."""
        from flakebot.deliver.howto import how_to_use

        made = {**asdict(self), "from_catalog": self.from_catalog}
        if self.status != "stopped" and self.name:
            made |= how_to_use(self.name, self.manifest.get("kind"))
        return made


def craft(
    need: str,
    *,
    stop_after: str | None = None,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
    **options: Any,
) -> CraftResult:
    """Turn a need into a tested, Nix-built tool (or return the catalogued one for the same need).

    The keywords are the craft options of RunRequest's fields (flakebot.pipeline.request), e.g. `model`,
    `from_source` (start from a git repository or crate directory instead of searching), `name`, `max_cost`;
    `help(flakebot.api.craft)` lists them all. See `craft_request` for a RunRequest built by hand."""
    request = from_keywords("craft", {"need": need, **options})
    return craft_request(request, stop_after=stop_after, sink=sink, settings=settings)


craft.__signature__ = keyword_signature("craft", craft)  # type: ignore[attr-defined]


STAGES = "spec, search, choose, acquire, edit, package, instruct"  # where --stop-after may stop a craft
StopAfter = Annotated[str | None, Param(f"Stop after this stage ({STAGES}).", doors=frozenset({"cli", "api"}))]


def craft_request(
    request: Annotated[RunRequest, Param("The craft's request: its need and options.", request="craft")],
    *,
    stop_after: StopAfter = None,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
) -> CraftResult:
    """Craft a tested, Nix-built command-line tool from a need (or return the catalogued one).

    Stages: spec -> search -> choose -> acquire -> edit -> package -> instruct -> clean.
    Resume an interrupted craft with 'flakebot resume RUN'.
    """
    # `craft` of a RunRequest as the caller built it: from_location not yet resolved, settings as given
    from flakebot.deliver.catalog import Catalog
    from flakebot.pipeline import engine as pipeline

    need = request.need
    _check_request(request, settings)
    overrides = run_overrides(request.overrides())
    settings = dataclasses.replace(settings_or_default(settings), **overrides)
    started = time.monotonic()
    if not request.fresh and stop_after is None:
        hit = Catalog.open(settings).find_need(need)
        if hit is not None and _is_service(hit, settings) == request.service:  # a tool never answers --service
            return _cached(hit, settings, started)
        installed = _install_need(need, settings)
        if installed is not None:
            return dataclasses.replace(_cached(installed, settings, started), status="installed")
        _check_in_flight(need, settings)
    from flakebot.llm.providers import check_model

    check_model(request.model, settings)  # fail before any work when no model can be used
    check_craft_options(request.crate, request.mode, request.spec_file, stop_after, service=request.service)
    _check_method(request.method)
    check_limits(settings)
    _check_name(request.name, need, settings)
    check_host(settings, request.registry)
    if request.crate and not request.from_location:
        check_crate(request.crate, request.registry, settings)
    if request.service and request.from_location is None and request.crate is None:
        from flakebot.services.crafting import TEMPLATE

        request = dataclasses.replace(request, from_location=str(TEMPLATE))  # a std-only HTTP skeleton to start at
    start = _start_point(request.from_location, request.ref, request.crate, request.mode)
    spec_file = str(Path(request.spec_file).resolve()) if request.spec_file else None
    request = dataclasses.replace(request, **start, spec_file=spec_file, settings=overrides)
    run = pipeline.start("craft", workdir_of(settings), settings, request, sink, stop_after)
    reused = run.output("spec").get("reuse")
    if reused:  # the model judged a catalogued tool equivalent to this need
        return dataclasses.replace(_cached(Catalog.open(settings).get(reused), settings, started), run_id=run.id)
    return with_service_note(craft_result(run, time.monotonic() - started), settings)


def _check_request(request: RunRequest, settings: config.Settings | None) -> None:
    """The need, the numbers and the flags, before anything (the first thing craft_request does)."""
    preflight.check_text("need", request.need, example='flakebot craft "need a CSV deduper"')
    check_bounds(request)
    preflight.check_request_flags(request.fork, request.push, request.delete_fork)
    _check_fork(request.fork, dataclasses.replace(settings_or_default(settings), **run_overrides(request.overrides())))


def _check_craft(
    request: RunRequest, stop_after: str | None = None, settings: config.Settings | None = None, agent: bool = False
) -> None:
    """What needs nothing built, before an MCP job exists: `_check_request`, and unless a catalog could answer the
    need without a run (this machine's, or a shared one) what craft_request checks before its run: no craft of the
    need running now, a usable model, the options, a free --name, this machine (registry, writable directories,
    room) and where --from points. `agent`: said as MCP names the arguments and tools."""
    from flakebot.deliver.catalog import Catalog
    from flakebot.llm.providers import check_model

    _check_request(request, settings)
    settings = dataclasses.replace(settings_or_default(settings), **run_overrides(request.overrides()))
    answered = not request.fresh and stop_after is None
    if answered and (settings.shared_catalogs() or Catalog.open(settings).find_need(request.need) is not None):
        return  # a catalog may answer the need: no model, no run of its own
    if answered:
        _check_in_flight(request.need, settings, agent)
    check_model(request.model, settings)
    check_craft_options(request.crate, request.mode, request.spec_file, stop_after, service=request.service)
    _check_method(request.method)
    check_limits(settings)
    _check_name(request.name, request.need, settings, agent)
    check_host(settings, request.registry)
    if request.crate and not request.from_location:  # --from names the crate's source; --crate picks its package
        check_crate(request.crate, request.registry, settings)
    _start_point(request.from_location, request.ref, request.crate, request.mode)  # a directory, or a URL's form


def with_service_note(result: CraftResult, settings: config.Settings) -> CraftResult:
    """`result`, saying so when it catalogued a service whose name a service here runs another program under: that
    service keeps its recorded program (a craft never changes what receives a service's secrets)."""
    from flakebot.services.identity import catalog_change_note

    note = catalog_change_note(result.name, {**result.manifest, "catalog_version": result.version}, settings)
    return dataclasses.replace(result, service=note) if note else result


def _is_service(entry: dict[str, Any], settings: config.Settings) -> bool:
    from flakebot.deliver.catalog import show_tool

    return bool(show_tool(entry["name"], settings)["manifest"].get("kind") == "service")


def _install_need(need: str, settings: config.Settings) -> dict[str, Any] | None:
    """The tool a shared catalog holds for the same need, installed (signatures checked), or None. A catalog that
    fails in any way (its index, a fetch, nix copy, a signature, an entry's shape) is skipped with one warning and the
    next one asked: a catalog someone else owns never stops a craft."""
    catalogs = settings.shared_catalogs()  # a tenant's: the organisation's, then its own
    if not catalogs:  # none to ask: the installer (signatures, nix copy, its HTTP) is not loaded
        return None
    from flakebot.deliver.install import find_need, install_from_catalog
    from flakebot.errors import FlakebotError

    for catalog in catalogs:
        found = find_need(need, settings, only=catalog)
        if found is None:
            continue
        source, ref = found
        logger.info("%s answers this need in the shared catalog %s: installing it", ref, source["url"])
        try:
            return install_from_catalog(ref, source, settings, need=need)
        except (FlakebotError, OSError, ValueError) as exc:
            why = exc.one_line() if isinstance(exc, FlakebotError) else str(exc)
            logger.warning("shared catalog %s skipped: %s", source["url"], why)
    return None


def _check_in_flight(need: str, settings: config.Settings, agent: bool = False) -> None:
    """A craft of the same need that a process is driving right now is not paid for twice: say which run it is
    (`agent`: as MCP names the tool to follow it and the argument)."""
    run_id = in_flight(need, settings)
    if run_id is not None:
        follow = f"the status tool (run_id {run_id})" if agent else f"'flakebot show {run_id}'"
        raise RunError(
            f"a craft of this need is already running: run {run_id}",
            fix=f"follow it with {follow} (its tool is catalogued when it ends), "
            f"or pass {'fresh: true' if agent else '--fresh'} to craft another",
            run=run_id,
        )


def in_flight(need: str, settings: config.Settings, any_tenant: bool = False) -> str | None:
    """The run a process is crafting the same need in right now (as the catalog keys needs) for the tenant of
    `settings` (another tenant's run is not this one's to name or wait for; `any_tenant`: anyone's), or None."""
    from flakebot.deliver.catalog import normalize_need
    from flakebot.pipeline.run import list_runs

    key = normalize_need(need)
    for run in list_runs(workdir_of(settings)):
        same = run.state.get("pipeline") == "craft" and normalize_need(str(run.state.get("need", ""))) == key
        same = same and (any_tenant or run.state.get("tenant", "") == settings.tenant)
        if same and run.state.get("status") == "running" and run.driven():
            return run.id
    return None


def _check_method(method: str | None) -> None:
    from flakebot.source.acquisition import METHODS

    if method is not None and method not in METHODS:
        raise UsageError(f"unknown acquisition method '{method}'", fix=f"use one of: {', '.join(METHODS)}")


def _check_fork(fork: bool, settings: config.Settings) -> None:
    """--fork forks on GitHub: an offline run, or one without a token, is refused before any work (it was ignored)."""
    if not fork:
        return
    if settings.offline:
        raise UsageError(
            "--fork forks the crate on GitHub, which an offline run does not reach", fix="drop --fork or --offline"
        )
    from flakebot.source.github import github_token

    if not github_token():
        raise UsageError(
            "--fork needs a GitHub token",
            fix="export GITHUB_TOKEN=... (a token that may fork repositories), or drop --fork",
        )


def _check_name(name: str | None, need: str, settings: config.Settings, agent: bool = False) -> None:
    """--name must be a binary name (said back cut short), and not one the catalog holds for another need. `agent`:
    said as MCP names the argument (`name`) and the removal (the rm tool)."""
    if name is None:
        return
    from flakebot.deliver.catalog import Catalog
    from flakebot.toolspec import NAME_MAX, NAME_RE

    option = "name" if agent else "--name"
    if not NAME_RE.match(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise UsageError(
            f"{option} '{shown}' is not kebab-case",
            fix=f"pass a name like csv-dedup (lower-case words joined by -, at most {NAME_MAX} characters)",
        )
    catalog = Catalog.open(settings)
    holder = catalog.name_holder(name, need)
    if holder is not None:
        free = catalog.free_name(name, need)
        remove = f"the rm tool with tool {name}" if agent else f"'flakebot rm {name}'"
        raise UsageError(
            f"the catalog holds a tool named {name} for another need ({holder.get('need', '')!r})",
            fix=f"pass {option} {free}, or remove the old one with {remove}",
        )


def _start_point(from_source: str | None, ref: str | None, crate: str | None, mode: str | None) -> dict[str, Any]:
    """Run options for --from: the crate to start at (a local directory or a repository URL) and the git ref."""
    if from_source is None:
        if ref:
            raise UsageError("--ref needs --from", fix="pass --from URL with --ref, or write URL#REF")
        return {}
    if mode == "new":
        raise UsageError("--from edits the given crate; --mode new does not apply", fix="leave --mode out with --from")
    from flakebot.source.acquisition import start_point

    start, resolved_ref = start_point(from_source, ref, name=crate or "")
    return {"start": start.to_dict(), "from_location": from_source, "ref": resolved_ref}


def craft_result(run: Run, seconds: float | None = None) -> CraftResult:
    """The CraftResult of a finished (or stopped) craft run; `seconds` defaults to the time its stages took."""
    instruct = run.output("instruct")
    if seconds is None:
        seconds = sum(stage.get("seconds") or 0.0 for stage in run.state["stages"].values())
    return CraftResult(
        status="crafted" if instruct else "stopped",
        name=run.output("spec").get("name", ""),
        run_id=run.id,
        manifest=instruct.get("manifest", {}),
        usage_markdown=instruct.get("usage_markdown", ""),
        choice={k: v for k, v in run.output("choose").items() if k != "crate"}
        | {"crate": run.output("choose").get("crate", {}).get("name", "")},
        usage=dict(run.state.get("usage") or {}),
        seconds=round(seconds, 3),
        version=str(instruct.get("catalog", {}).get("version") or ""),
    )


def _cached(entry: dict[str, Any], settings: config.Settings, started: float) -> CraftResult:
    from flakebot.deliver.catalog import show_tool

    tool = show_tool(entry["name"], settings)
    return CraftResult(
        status="cached",
        installed_from=dict(entry.get("installed_from") or {}),
        name=entry["name"],
        run_id=entry.get("run_id", ""),
        manifest=tool["manifest"],
        usage_markdown=tool["usage_markdown"],
        seconds=round(time.monotonic() - started, 3),
        version=str(entry.get("version") or ""),
    )


COMMANDS = [
    Command(
        "craft",
        craft_request,
        mcp="craft",
        hints=Hints("Craft a tool", open_world=True),  # the model provider, crates.io, nixpkgs
        long=True,
        changes_catalog=True,
        working="craft: {request}",
        check=_check_craft,
        mcp_description="Craft a tested, Nix-built command-line tool from a need in plain words (or return the "
        "catalogued one for the same need); returns its manifest. Start from a git repository or local crate with "
        f"`from`.{LONG}",
    )
]
