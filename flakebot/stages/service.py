"""The instruct stage of `craft --service`: the built service's lifecycle checked as `flakebot up` runs it, what
`nix run` resolves to checked, and the manifest of kind "service" with its declaration (as `package-service` writes
it), so the catalog holds it as a service and `flakebot up NAME` starts it. A failed check: nothing catalogued."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from flakebot.errors import NixError
from flakebot.nix.command import require_nix_run_target
from flakebot.pipeline.engine import StageContext
from flakebot.redact import redact_text
from flakebot.services.catalogued import service_manifest, usage_markdown
from flakebot.services.crafting import ServiceNeed, lifecycle_of
from flakebot.stages.outputs import AcquireOut, SpecOut


def instruct_service(
    ctx: StageContext, spec: SpecOut, package: dict[str, Any], binary: Path, nix_run: list[str], need: str
) -> tuple[dict[str, Any], str]:
    """(manifest, USAGE.md) of the crafted service whose store binary `binary` passed its lifecycle check."""
    wanted = ServiceNeed.from_dict(spec.service)
    ctx.progress("checking the built service's lifecycle (sandboxed, its own network, as flakebot up runs it)")
    report = lifecycle_of(binary, spec.service, ctx.settings)
    if not report.ok:
        raise NixError(
            f"service {spec.name} failed its lifecycle check on the built store path: {report.first_problem()}",
            fix="the tests passed in the workspace but the built service disagrees: inspect the run with --keep; "
            "its output: " + report.last_output(),
            lifecycle=report.to_dict(),
        )
    ctx.progress("checking that nix run resolves to the tested store path")
    program = require_nix_run_target(package, "tested", ctx.settings.nix_build_timeout)
    manifest = {
        **service_manifest(spec.name, package, wanted.declaration),
        "summary": spec.summary,
        "need": need,
        "protocol": wanted.protocol,
        "nix_run": shlex.join(nix_run),
        "nix_run_argv": nix_run,
        "lifecycle": report.steps,
        "lifecycle_examples": spec.service["examples"],
        "verification": {"resolves_to": program, "how": "the lifecycle ran on this store path in the sandbox"},
        "origin": ctx.get(AcquireOut).origin,
        "run_id": ctx.run.id,
        "sandbox": ctx.settings.sandbox,
    }
    return manifest, redact_text(usage_markdown(manifest))
