"""What the CLI, the MCP server and Python users call. Each function returns plain data or a typed result."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flakebot import config, preflight
from flakebot.crates import Candidate
from flakebot.errors import CatalogError, FlakebotError, RunError, UsageError
from flakebot.events import EventSink, ignore
from flakebot.fsutil import remove_tree
from flakebot.pipeline.request import Improvement, RunRequest, check_bounds, from_keywords, keyword_signature
from flakebot.pipeline.run import Run

logger = logging.getLogger(__name__)

__all__ = [  # the public API; run_result and craft_result take a Run, flakebot's own
    "CraftResult",
    "Improvement",
    "RunRequest",
    "call_tool",
    "call_tool_argv",
    "craft",
    "craft_request",
    "evaluate",
    "improve",
    "improve_request",
    "install",
    "list_remote",
    "list_runs",
    "list_tools",
    "models",
    "package",
    "package_request",
    "publish",
    "remove_runs",
    "remove_tool",
    "resume",
    "resume_report",
    "run_tool",
    "search",
    "set_setting",
    "settings_report",
    "show",
    "show_run",
    "status",
    "tool_arguments",
    "tool_definitions",
    "tool_manifest",
]

if TYPE_CHECKING:
    from flakebot.deliver.toolcall import ToolCall
    from flakebot.evaluate.harness import EvalReport
    from flakebot.stages.outputs import PackageOut
    from flakebot.toolspec import ToolSpec


def _settings(settings: config.Settings | None) -> config.Settings:
    return settings or config.load()


def show_run(run_id: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A run's stage timeline and outcome."""
    settings = _settings(settings)
    run = Run.load(_workdir(settings), run_id)
    from flakebot.pipeline.engine import stage_names

    try:
        names = stage_names(run.state["pipeline"])
    except RunError:
        names = list(run.state["stages"])
    stages = [{"name": n, **run.state["stages"].get(n, {"status": "pending"})} for n in names]
    return {
        "kind": "run",
        "id": run.id,
        "dir": str(run.dir),
        "pipeline": run.state["pipeline"],
        "need": run.state.get("need", ""),
        "status": run.status,
        "created": run.state.get("created"),
        "age_seconds": round(time.time() - run.state.get("created", time.time())),
        "stages": stages,
        "error": run.state.get("error"),
        "outputs": run.state["outputs"],
    }


def status(run_id: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """What a caller polling a run needs: its status, the stage timeline and, once it succeeded, its result (a craft's manifest)."""
    settings = _settings(settings)
    report = show_run(run_id, settings)
    stages = [{k: stage.get(k) for k in ("name", "status", "seconds", "attempts")} for stage in report["stages"]]
    answer = {
        "run_id": report["id"],
        "pipeline": report["pipeline"],
        "need": report["need"],
        "status": report["status"],
        "stages": stages,
    }
    answer["error"] = report["error"]
    if report["status"] in ("succeeded", "stopped"):
        answer["result"] = run_result(Run.load(_workdir(settings), report["id"]))
    return answer


def resume(run_id: str, *, sink: EventSink = ignore, settings: config.Settings | None = None) -> dict[str, Any]:
    """Continue a run from its first unfinished stage; returns its result as `status` gives it."""
    return run_result(_resume(run_id, sink, settings))


def resume_report(run_id: str, *, sink: EventSink = ignore, settings: config.Settings | None = None) -> dict[str, Any]:
    """Continue a run (as `resume` does); its id, pipeline, status and stage outputs, and under "craft" the
    CraftResult of a craft that got as far as its instructions (else None)."""
    run = _resume(run_id, sink, settings)
    crafted = craft_result(run).to_dict() if run.state["pipeline"] == "craft" and run.output("instruct") else None
    return {
        "run_id": run.id,
        "status": run.state["status"],
        "outputs": run.state["outputs"],
        "pipeline": run.state["pipeline"],
        "craft": crafted,
    }


def _resume(run_id: str, sink: EventSink, settings: config.Settings | None) -> Run:
    from flakebot.pipeline import engine as pipeline

    settings = _settings(settings)
    return pipeline.resume(_workdir(settings), run_id, settings, sink)


def run_result(run: Run) -> dict[str, Any]:
    """A finished run's result: a craft's CraftResult, a package run's PackageOut, else its stage outputs."""
    if run.state["pipeline"] == "craft":
        return craft_result(run).to_dict()
    if run.state["pipeline"] == "package" and run.output("package"):
        return {**run.output("package"), "run_id": run.id}
    return {"run_id": run.id, "status": run.state.get("status"), "outputs": run.state["outputs"]}


def show(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A run (by id) or, failing that, a catalogued tool (by name)."""
    settings = _settings(settings)
    try:
        return show_run(name, settings)
    except RunError as run_error:
        if run_error.details.get("reason") not in ("not_found", "bad_id"):  # NAME@VERSION is not a run id
            raise
    from flakebot.deliver import catalog

    try:
        return catalog.show_tool(name, settings)
    except CatalogError as exc:
        if exc.details.get("reason") == "damaged":  # the tool exists: say what is wrong with it
            raise
        raise RunError(
            f"no run or tool named '{name}'", fix="list them with 'flakebot runs' and 'flakebot list'"
        ) from None


def search(
    query: str,
    *,
    registry: str | None = None,
    limit: int = 10,
    offline: bool | None = None,
    settings: config.Settings | None = None,
) -> list[Candidate]:
    """Crates for `query`, best first; registry: crates-io, local, a path, or auto."""
    from flakebot.crates.registries import search as search_crates

    settings = _settings(settings)
    if offline is not None:
        settings = dataclasses.replace(settings, offline=offline)
    return search_crates(query, settings, registry, limit)[1]


def list_runs(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every readable run, newest first: id, status, pipeline, need, created."""
    from flakebot.pipeline.run import list_runs as runs

    keys = ("pipeline", "need", "created")
    return [
        {"id": r.id, "status": r.status, **{k: r.state.get(k) for k in keys}}
        for r in runs(_workdir(_settings(settings)))
    ]


def _workdir(settings: config.Settings) -> Path:
    return settings.path("workdir")


# ------------------------------------------------------------------ craft


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

    @property
    def from_catalog(self) -> bool:
        return self.status in ("cached", "installed")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "from_catalog": self.from_catalog}


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


def craft_request(
    request: RunRequest,
    *,
    stop_after: str | None = None,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
) -> CraftResult:
    """`craft` of a RunRequest as the caller built it (from_location not yet resolved, settings as given)."""
    from flakebot.deliver.catalog import Catalog
    from flakebot.pipeline import engine as pipeline

    need = request.need
    preflight.check_text("need", need, example='flakebot craft "need a CSV deduper"')
    check_bounds(request)
    overrides = _run_overrides(request.overrides())
    settings = dataclasses.replace(_settings(settings), **overrides)
    started = time.monotonic()
    preflight.check_request_flags(request.fork, request.push, request.delete_fork)
    if not request.fresh and stop_after is None:
        hit = Catalog.open(settings).find_need(need)
        if hit is not None:
            return _cached(hit, settings, started)
        installed = _install_need(need, settings)
        if installed is not None:
            return dataclasses.replace(_cached(installed, settings, started), status="installed")
        _check_in_flight(need, settings)
    from flakebot.llm.providers import check_model

    check_model(request.model, settings)  # fail before any work when no model can be used
    _check_craft_options(request.crate, request.mode, request.spec_file, stop_after)
    _check_method(request.method)
    _check_limits(settings)
    _check_name(request.name, need, settings)
    _check_host(settings, request.registry)
    start = _start_point(request.from_location, request.ref, request.crate, request.mode)
    spec_file = str(Path(request.spec_file).resolve()) if request.spec_file else None
    request = dataclasses.replace(request, **start, spec_file=spec_file, settings=overrides)
    run = pipeline.start("craft", _workdir(settings), settings, request, sink, stop_after)
    reused = run.output("spec").get("reuse")
    if reused:  # the model judged a catalogued tool equivalent to this need
        return dataclasses.replace(_cached(Catalog.open(settings).get(reused), settings, started), run_id=run.id)
    return craft_result(run, time.monotonic() - started)


def _install_need(need: str, settings: config.Settings) -> dict[str, Any] | None:
    """The tool a shared catalog holds for the same need, installed (signatures checked), or None."""
    if not settings.catalogs:
        return None
    from flakebot.deliver.install import find_need, install
    from flakebot.errors import CatalogTrustError

    found = find_need(need, settings)
    if found is None:
        return None
    source, ref = found
    logger.info("%s answers this need in the shared catalog %s: installing it", ref, source["url"])
    try:
        return install(ref, settings, source["url"], need=need)
    except CatalogTrustError as exc:  # its index changed for the worse since find_need read it: craft instead
        logger.warning("shared catalog %s skipped: %s", source["url"], exc.one_line())
        return None


def _given(**values: Any) -> dict[str, Any]:
    """The settings a caller's keywords override: those given (not None)."""
    return {k: v for k, v in values.items() if v is not None}


def _check_in_flight(need: str, settings: config.Settings) -> None:
    """A craft of the same need that a process is driving right now is not paid for twice: say which run it is."""
    from flakebot.deliver.catalog import normalize_need
    from flakebot.pipeline.run import list_runs

    key = normalize_need(need)
    for run in list_runs(_workdir(settings)):
        same = run.state.get("pipeline") == "craft" and normalize_need(str(run.state.get("need", ""))) == key
        if same and run.state.get("status") == "running" and run.driven():
            raise RunError(
                f"a craft of this need is already running: run {run.id}",
                fix=f"follow it with 'flakebot show {run.id}' (its tool is catalogued when it ends), "
                "or pass --fresh to craft another",
                run=run.id,
            )


def _run_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The settings a request overrides (those given), coerced as their flags would be."""
    return {k: config.coerce(k, v, f"--{k.replace('_', '-')}") for k, v in given.items() if v is not None}


def _check_method(method: str | None) -> None:
    from flakebot.source.acquisition import METHODS

    if method is not None and method not in METHODS:
        raise UsageError(f"unknown acquisition method '{method}'", fix=f"use one of: {', '.join(METHODS)}")


def _check_craft_options(crate: str | None, mode: str | None, spec_file: str | None, stop_after: str | None) -> None:
    """Bad options, an unreadable spec file and a missing nix fail before a run exists (and before any model call)."""
    from flakebot.stages.choose import MODES

    if mode is not None and mode not in MODES:
        raise UsageError(f"unknown --mode '{mode}'", fix=f"use one of: {', '.join(MODES)} (with --crate)")
    if mode is not None and not crate:
        raise UsageError(
            "--mode needs --crate", fix="name the crate to start from with --crate NAME, or leave --mode out"
        )
    if spec_file:
        from flakebot.toolspec import load_spec_file

        load_spec_file(Path(spec_file))
    if stop_after not in ("spec", "search", "choose", "acquire", "edit"):  # the run will reach the package stage
        from flakebot.nix.command import nix_program

        nix_program()


def _check_name(name: str | None, need: str, settings: config.Settings) -> None:
    """--name must be a binary name, and not one the catalog holds for another need."""
    if name is None:
        return
    from flakebot.deliver.catalog import Catalog
    from flakebot.toolspec import NAME_RE

    if not NAME_RE.match(name):
        raise UsageError(
            f"--name '{name}' is not kebab-case", fix="pass a name like csv-dedup (lower-case words joined by -)"
        )
    catalog = Catalog.open(settings)
    holder = catalog.name_holder(name, need)
    if holder is not None:
        free = catalog.free_name(name, need)
        raise UsageError(
            f"the catalog holds a tool named {name} for another need ({holder.get('need', '')!r})",
            fix=f"pass --name {free}, or remove the old one with 'flakebot rm {name}'",
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


def _check_limits(settings: config.Settings) -> None:
    """Limits that would stop a craft before its first edit fail at once instead."""
    for key, least in (("max_iterations", 1), ("max_tokens", 1), ("max_cost", 0)):
        if settings.get(key) < least:
            flag = f"--{key.replace('_', '-')}"
            raise UsageError(
                f"{key} must be at least {least}, got {settings.get(key)}",
                fix=f"pass {flag} with a larger value (or set {key} in flakebot.toml)",
            )


def _check_host(settings: config.Settings, registry: str | None) -> None:
    """What the run will need of this machine, checked before the model is called: the registry, room to work, and
    the directories its runs and its tool go to (a read-only catalog fails now, not after the build)."""
    preflight.check_registry(settings, registry)
    preflight.check_writable_dir(_workdir(settings), "workdir")
    preflight.check_writable_dir(settings.path("catalog_dir"), "catalog_dir")
    preflight.check_free_space(_workdir(settings))


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


# ------------------------------------------------------------------ improve


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
    request: RunRequest,
    *,
    stop_after: str | None = None,
    sink: EventSink = ignore,
    settings: config.Settings | None = None,
) -> CraftResult:
    """`improve` of a RunRequest whose `improve` names the tool and the change (the rest is filled in here)."""
    from flakebot.deliver.catalog import Catalog, show_tool
    from flakebot.deliver.versions import newest, next_version
    from flakebot.llm.providers import check_model
    from flakebot.pipeline import engine as pipeline
    from flakebot.source.acquisition import start_point
    from flakebot.toolspec import improvement_from_file

    asked = request.improve or Improvement(tool="", request="")
    preflight.check_text("improvement", asked.request, example='flakebot improve csv-dedup "also support --delimiter"')
    check_bounds(request)
    overrides = _run_overrides(request.overrides())
    settings = dataclasses.replace(_settings(settings), **overrides)
    started = time.monotonic()
    catalog = Catalog.open(settings)
    entry = catalog.get(asked.tool)  # NAME@VERSION: that version's fields, and every version under "versions"
    manifest = show_tool(asked.tool, settings)["manifest"]
    kept = _kept_spec(entry, manifest, settings)
    if request.spec_file:  # a bad file fails before any work
        improvement_from_file(kept, Path(request.spec_file))
    check_model(request.model, settings)
    _check_craft_options(None, None, None, stop_after)
    _check_limits(settings)
    _check_host(settings, request.registry)
    source = Path(entry["dir"]) / "flake"
    if not (source / "Cargo.toml").is_file():
        raise CatalogError(
            f"{entry['name']}@{entry['version']} has no sources in {source}",
            fix=f"craft it again with 'flakebot craft --fresh', or remove it with 'flakebot rm {entry['name']}'",
        )
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
    run = pipeline.start("craft", _workdir(settings), settings, request, sink, stop_after)
    return craft_result(run, time.monotonic() - started)


def _kept_spec(entry: dict[str, Any], manifest: dict[str, Any], settings: config.Settings) -> ToolSpec:
    """The spec (whole examples, file contents included) of the version an improvement starts from: its
    manifest's, or for a tool crafted before manifests kept it, its run's while the run is still there."""
    from flakebot.toolspec import ToolSpec

    spec = manifest.get("spec")
    if not spec:
        try:
            spec = Run.load(_workdir(settings), entry.get("run_id", "")).output("spec")
        except RunError:
            spec = None
    if not spec or not spec.get("examples"):
        raise CatalogError(
            f"{entry['name']}@{entry['version']} was crafted before flakebot kept its acceptance examples whole",
            fix=f"craft it again with 'flakebot craft --fresh \"{entry.get('need', '')}\"', then improve that",
        )
    return ToolSpec.from_dict(spec, source=f"{entry['name']}@{entry['version']}")


# ------------------------------------------------------------------ package


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
    request: RunRequest, *, sink: EventSink = ignore, settings: config.Settings | None = None
) -> PackageOut:
    """`package` of a RunRequest naming its target (and registry, bin, out, and the nixpkgs or offline settings)."""
    from flakebot.pipeline import engine as pipeline
    from flakebot.stages.outputs import PackageOut

    target = request.target or ""
    if not target.strip():
        raise UsageError(
            "nothing to package", fix="give a crate directory or a crate name: flakebot package PATH|CRATE"
        )
    if request.name:
        if not request.catalog:
            raise UsageError("--name names a catalogued tool", fix="add --catalog, or leave --name out")
        from flakebot.stages.catalogue import catalog_name

        catalog_name(request.name, "")  # a malformed name is refused before anything is built
    # offline: no crates.io, cargo --offline, the host stand-in for nixpkgs (as craft does)
    overrides = _run_overrides(request.overrides())
    settings = dataclasses.replace(_settings(settings), **overrides)
    path = Path(target).expanduser()
    request = dataclasses.replace(
        request,
        need=f"package {target}",
        target=str(path.resolve()) if path.exists() else target,
        out=str(Path(request.out).expanduser().resolve()) if request.out else None,
        settings=overrides,
    )
    run = pipeline.start("package", _workdir(settings), settings, request, sink)
    catalogued = run.output("catalog").get("catalog") or {} if request.catalog else {}
    return dataclasses.replace(PackageOut.from_dict(run.output("package")), run_id=run.id, catalog=catalogued)


# ------------------------------------------------------------------ catalog


def list_tools(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every catalogued tool's entry (its current version), sorted by name."""
    from flakebot.deliver.catalog import Catalog

    return sorted(Catalog.open(_settings(settings)).tools().values(), key=lambda e: e["name"])


def tool_manifest(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """A catalogued tool's manifest (its schemas, how to run it)."""
    from flakebot.deliver.catalog import show_tool

    manifest: dict[str, Any] = show_tool(name, _settings(settings))["manifest"]
    if not manifest.get("nix_run_argv"):
        raise CatalogError(
            f"tool '{name}' has no manifest",
            fix=f"craft it again with 'flakebot craft --fresh' or remove it with 'flakebot rm {name}'",
        )
    return manifest


def tool_definitions(settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every catalogued tool as an MCP tool definition (name, description, inputSchema); tools without a manifest are left out."""
    from flakebot.deliver.toolcall import mcp_definition

    settings = _settings(settings)
    definitions = []
    for entry in list_tools(settings):
        try:
            manifest = tool_manifest(entry["name"], settings)
            if manifest.get("kind") == "service":  # started with `flakebot up`, not called as a tool
                continue
            definitions.append(mcp_definition(manifest))
        except (CatalogError, OSError, ValueError) as exc:  # one broken entry must not hide the others
            logger.warning("tool %s left out of the tool list: %s", entry["name"], exc)
    return definitions


def tool_arguments(name: str, arguments: Any, settings: config.Settings | None = None) -> tuple[list[str], str | None]:
    """(argv, stdin or None) for a catalogued tool called with its schema's JSON arguments."""
    from flakebot.deliver.toolcall import arguments_to_argv

    return arguments_to_argv(tool_manifest(name, settings), arguments)


def call_tool(name: str, arguments: Any, settings: config.Settings | None = None) -> ToolCall:
    """Run a catalogued tool (sandboxed) with JSON arguments; its output and exit code come back as data."""
    from flakebot.deliver.toolcall import call

    settings = _settings(settings)
    return call(tool_manifest(name, settings), arguments, settings=settings)


def call_tool_argv(
    name: str,
    args: list[str],
    settings: config.Settings | None = None,
    stdin: str | None = None,
    writable: list[str] | None = None,
) -> ToolCall:
    """Run a catalogued tool (sandboxed) with command-line `args` and `stdin` (None: the caller's own), capturing
    its output; `writable`: the existing paths it may write."""
    from flakebot.deliver.toolcall import run_captured

    settings = _settings(settings)
    return run_captured(tool_manifest(name, settings), args, stdin, settings=settings, writable=writable)


def run_tool(
    name: str,
    args: list[str],
    settings: config.Settings | None = None,
    stdin: str | None = None,
    writable: list[str] | None = None,
) -> int:
    """Run a catalogued tool (NAME or NAME@VERSION) in the sandbox with the caller's stdin (or `stdin`), stdout and
    stderr; returns its exit code. It runs in an empty directory: paths its arguments name are readable, only
    `writable` ones writable (deliver.toolrun)."""
    from flakebot.deliver.toolrun import run_attached

    settings = _settings(settings)
    return run_attached(tool_manifest(name, settings), args, settings=settings, stdin=stdin, writable=writable)


def remove_tool(name: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """Remove a tool from the catalog: NAME (every version, its GC roots with it) or NAME@VERSION; the entry removed."""
    from flakebot.deliver.catalog import Catalog

    return Catalog.open(_settings(settings)).remove(name)


def remove_runs(run_id: str | None, settings: config.Settings | None = None) -> list[Path]:
    """`flakebot clean RUN|--all`: remove one run directory (or all), releasing its forks and paths first."""
    from flakebot.pipeline.cleanup import clean_run
    from flakebot.pipeline.run import Run, find_run_dir, runs_dir
    from flakebot.source.remote import release_run_forks

    settings = _settings(settings)
    workdir = _workdir(settings)
    directories = (
        [find_run_dir(workdir, run_id)]
        if run_id
        else sorted(p for p in runs_dir(workdir).glob("*") if p.is_dir() and not p.is_symlink())
    )
    for directory in directories:
        try:
            run = Run.load(workdir, directory.name)
            release_run_forks(run, settings)
            clean_run(run)
        except FlakebotError as exc:  # a corrupt run is still removed; say why its resources were not read
            logger.warning("could not read %s before removing it: %s", directory, exc.one_line())
        remove_tree(directory)
    return directories


# ------------------------------------------------------------------ publish


def install(tool: str, *, from_url: str | None = None, settings: config.Settings | None = None) -> dict[str, Any]:
    """Install a published tool (NAME or NAME@VERSION) from the configured shared catalogs (or the one `from_url`
    names): its signed entry and closure are fetched with `nix copy`, checked against the configured keys and
    catalogued here. Returns the catalog entry; nothing is built."""
    from flakebot.deliver.install import install as install_tool

    return install_tool(tool, _settings(settings), from_url)


def list_remote(url: str | None = None, settings: config.Settings | None = None) -> list[dict[str, Any]]:
    """Every tool the configured shared catalogs (or the one `url` names) list, each version with its signer."""
    from flakebot.deliver.install import remote_tools

    return remote_tools(_settings(settings), url)


def publish(tool: str, *, to: str, settings: config.Settings | None = None) -> dict[str, Any]:
    """Copy a catalogued tool's closure to a binary cache or Nix store (`nix copy`); returns what was copied and how to fetch it."""
    from flakebot.deliver.publish import publish as publish_tool

    return publish_tool(tool, to, _settings(settings))


# ------------------------------------------------------------------ evaluation, models, settings


def evaluate(
    suite: str = "default",
    *,
    model: str | None = None,
    only: list[str] | None = None,
    out_dir: Path = Path("bench"),
    record: Path | None = None,
    settings: config.Settings | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[EvalReport, dict[str, Path]]:
    """Craft every need of a suite and score the tools on held-out checks; the report and the files written
    (out_dir/eval.md, out_dir/eval.json). `model`: give every need to it; default: each need's own session."""
    from flakebot.evaluate.harness import run_eval

    return run_eval(
        suite, model=model, only=only, out_dir=out_dir, record=record, settings=_settings(settings), progress=progress
    )


def models(settings: config.Settings | None = None) -> dict[str, Any]:
    """Model providers, the default model and whether each API key is set (never the key). Unless offline, a
    provider whose key is set is asked which models it serves now."""
    from flakebot.llm.providers import describe

    settings = _settings(settings)
    return describe(settings, ask=not settings.offline)


def settings_report(settings: config.Settings | None = None, sources: dict[str, str] | None = None) -> dict[str, Any]:
    """Every setting: "values" (key -> value), "settings" (key, value, where it came from ("source": `sources`'
    entry, else default), trust class and meaning of each), "files" (the configuration files read)."""
    settings = _settings(settings)
    rows = [
        {
            "key": key,
            "value": settings.get(key),
            "source": (sources or {}).get(key, "default"),
            "trust": config.Settings.trust_class(key),
            "meaning": config.Settings.describe(key),
        }
        for key in config.Settings.keys()
    ]
    files = [str(p) for p in config.config_files() if p.is_file()]
    return {"values": settings.as_dict(), "settings": rows, "files": files}


def set_setting(key: str, value: str, *, local: bool = False) -> Path:
    """Write one setting to the user's flakebot.toml (./flakebot.toml when `local`: a limit only), comments kept;
    the file written."""
    return config.set_value(key, value, local=local)
