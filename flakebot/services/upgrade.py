"""A health-gated upgrade: `up NAME@VERSION` while another version of NAME runs (and `rollback`, the same way back).

The new version is checked first, beside the running one and without touching it: its whole lifecycle (start on a
scratch port, health, the examples its manifest declares, SIGTERM and a clean exit, a second start on the same state,
the examples that must survive it) on a scratch *copy* of the live state directory. Never on the live directory
itself: two versions writing the same files at once (a database's lock, a half-migrated format) could damage the
state the running version serves, and a version that fails must leave nothing behind. Only when the check passes is
the service switched: the running version is stopped (SIGTERM, its grace period), the new one started on the same
port with the live state, and if that start does not become healthy either, the old version is started again. The
service does not answer from the old version's stop until the new one accepts. A service whose socket flakebot holds
(handoff.py) keeps it through the switch: the running supervisor hands a copy over before it stops, the new one (or
the old one again) is started with it, so the port is never free and a connection made meanwhile waits in the
backlog for the new version instead of being refused. A pasta-forwarded service's port is closed in that gap.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import UpgradeRefused, UsageError
from flakebot.modeltext import output_quoted
from flakebot.services import envelope, forward, handoff, identity
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir
from flakebot.services.lifecycle import Examples, check_lifecycle
from flakebot.services.logfile import tail
from flakebot.services.supervised import show, start_supervised, stop_supervised

logger = logging.getLogger(__name__)


def upgrade(
    where: ServiceDir,
    manifest: dict[str, Any],
    binary: Path,
    program: dict[str, Any],
    running: dict[str, Any],
    settings: Settings,
    *,
    port: int | None = None,
    secrets: dict[str, str] | None = None,
    network: bool = False,
) -> dict[str, Any]:
    """Switch the running service (its launch: `running`) to `manifest`'s version (`binary`, recorded as `program`:
    identity.py) once that passes its checks; the status after. UpgradeRefused, the running version still serving, when it does not. The caller holds the control
    lock. Outbound network stays as it ran (`network` can only turn it on: the user's own `up --network`)."""
    version, old = str(manifest["catalog_version"]), str(running.get("version", ""))
    host_port = int(running["host_port"])
    if port is not None and port != host_port:
        raise UsageError(
            f"an upgrade keeps the service's port ({host_port}), not --port {port}",
            fix=f"upgrade without --port, or 'flakebot down {where.name}' first",
        )
    secrets = secrets or running.get("secrets") or {}
    network = network or forward.outbound_network(running)
    spec = ServiceSpec.from_dict(manifest["service"])
    declared = manifest.get("lifecycle_examples")  # package-service and craft --service keep them there
    examples = Examples.from_dict(declared) if isinstance(declared, dict) else None
    logger.info("checking %s %s on a copy of its state before it replaces %s", where.name, version, old)
    report = check_lifecycle(binary, spec, settings, examples, seed=where.state, secrets=secrets, network=network)
    if not report.ok:
        raise UpgradeRefused(
            f"{where.name} {version} failed its check ({report.first_problem()}): {old} keeps serving on port "
            f"{host_port}",
            fix="fix the new version and package it again; its output: " + report.last_output(),
            check=report.steps,
        )
    launch = {**running, "version": version, "previous_version": old, "binary": str(binary), "spec": spec.to_dict(),
              "secrets": secrets, "network": network, "limits": envelope.launch_limits(settings), "program": program,
              "previous": identity.snapshot(running), "examples": declared}  # fmt: skip
    held = handoff.take(where.handover) if _handed(running) and _handed(launch) else None
    try:
        stop_supervised(where)
        status = start_supervised(where, launch, held)
        if status.get("state") == "running":
            logger.info("%s upgraded from %s to %s", where.name, old, version)
            return show(where)
        why, lines = status.get("message", ""), tail(where.log, 5)
        stop_supervised(where)
        back = start_supervised(where, running, held)  # the version that ran, as it ran
    finally:
        if held is not None:
            held.close()  # the running supervisor has its own copy
    raise UpgradeRefused(
        f"{where.name} {version} passed its check on a copy of the state but not on the live state ({why}): "
        f"{old} started again ({back.get('state')}) on port {host_port}",
        fix="read the log of the failed start: " + output_quoted(lines),
    )


def _handed(launch: dict[str, Any]) -> bool:
    """Whether the launch's service takes its socket from flakebot (both versions must, for it to be kept)."""
    spec = ServiceSpec.from_dict(launch.get("spec") or {})
    return handoff.mode(spec, forward.outbound_network(launch)) == "handoff"


__all__ = ["upgrade"]
