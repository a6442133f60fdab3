"""The search stage: rank crates for the spec's search query (or the need) and keep the top ten."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from flakebot.crates.registries import search
from flakebot.errors import SearchError
from flakebot.stages.outputs import SearchOut, SpecOut

if TYPE_CHECKING:
    from flakebot.pipeline.engine import StageContext

logger = logging.getLogger(__name__)


STAGE_LIMIT = 10


def search_stage(ctx: StageContext) -> SearchOut:
    """Pipeline stage: rank crates for the spec's search query (or the need) and keep the top 10.

    With --crate NAME the query is that name: the chosen crate is looked up, not searched for.
    With --from the start is given: nothing is searched, only the registry cargo will use is fixed."""
    if ctx.request.start:
        return _given_start(ctx)
    query = ctx.request.crate or ctx.get(SpecOut).search_query or ctx.request.need
    registry = ctx.request.registry
    ctx.progress(f"searching {registry or ctx.settings.registry} for '{query}'")
    name, found = search(query, ctx.settings, registry, STAGE_LIMIT)
    if not found:
        raise SearchError(
            f"no crate in {name} matches '{query}'", fix="reword the need, or try another registry with --registry"
        )
    best = found[0].crate
    ctx.progress(f"best of {len(found)}: {best.name} {best.version} ({found[0].why})", registry=name)
    # Later stages (cargo in acquire, edit, package) use the source that answered: crates.io online,
    # or the directory source (a given PATH, else the local registry) offline.
    ctx.pin_setting(
        "registry",
        "crates-io" if name == "crates-io" else (registry if registry not in (None, "auto", "local") else "local"),
    )
    return SearchOut(registry=name, query=query, candidates=[c.to_dict() for c in found])


def _given_start(ctx: StageContext) -> SearchOut:
    """--from URL|PATH: no search. Dependencies still come from a registry: the one given, crates.io online, else the local one."""
    given = ctx.request.registry or ctx.settings.registry
    registry = (
        "local"
        if ctx.settings.offline or given == "local"
        else ("crates-io" if given in ("auto", "crates-io") else given)
    )
    ctx.pin_setting("registry", registry)
    ctx.progress(f"starting from {ctx.request.from_location}: no search")
    return SearchOut(registry=registry, query="", candidates=[])
