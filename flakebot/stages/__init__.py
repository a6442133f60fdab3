"""The stages of flakebot's two pipelines, in order, one module per stage.

    craft:    spec -> search -> choose -> acquire -> edit -> package -> instruct -> clean
    package:  locate -> package -> catalog -> clean   (catalog: only with --catalog)
    improve:  the craft pipeline from a catalogued tool's source; its spec stage keeps the tool's examples
              and adds new ones, its instruct stage catalogs the next version

Each stage is `stage(ctx: StageContext) -> <Out>` with its output type from outputs.py. Stage modules
are imported only when their stage runs, so listing or showing runs stays fast. A module is named for its stage,
but for the package pipeline's catalog stage: catalog_packaged.py (deliver/catalog.py is the catalog itself).

May import every other folder of flakebot except cli/ and api.py (services/: a crafted service's spec and
lifecycle check).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from flakebot.longlived import imports_kept
from flakebot.pipeline.engine import Stage, StageContext


def _lazy(target: str) -> Callable[[StageContext], Any]:
    module, _, name = target.partition(":")

    def stage(ctx: StageContext) -> Any:
        with imports_kept():  # a stage's module and its tool schemas live as long as the process
            function = getattr(importlib.import_module(module), name)
        return function(ctx)

    stage.__name__ = name
    return stage


CRAFT = [
    Stage("spec", _lazy("flakebot.stages.spec:spec_stage")),
    Stage("search", _lazy("flakebot.stages.search:search_stage")),
    Stage("choose", _lazy("flakebot.stages.choose:choose_stage")),
    Stage("acquire", _lazy("flakebot.stages.acquire:acquire_stage"), valid=lambda run: run.workspace.is_dir()),
    Stage("edit", _lazy("flakebot.stages.edit:edit_stage")),
    Stage("package", _lazy("flakebot.stages.package:package_stage")),
    Stage("instruct", _lazy("flakebot.stages.instruct:instruct_stage"), writes=lambda run: ("catalog_dir",)),
    Stage("clean", _lazy("flakebot.stages.clean:clean_stage"), always=True),
]

PACKAGE = [
    Stage("locate", _lazy("flakebot.stages.locate:locate_stage")),
    Stage("package", _lazy("flakebot.stages.package:package_only_stage")),
    Stage(
        "catalog",
        _lazy("flakebot.stages.catalog_packaged:catalog_stage"),
        writes=lambda run: ("catalog_dir",) if run.request.catalog else (),
    ),
    Stage("clean", _lazy("flakebot.stages.clean:package_clean_stage"), always=True),
]
