"""up, down, status and logs of services: what the CLI (and later MCP and the API) call."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from flakebot.config import Settings
from flakebot.deliver.toolrun import built_program
from flakebot.errors import FlakebotError, SandboxError, UsageError
from flakebot.modeltext import output_quoted
from flakebot.services import envelope, forward, identity
from flakebot.services.catalogued import service_manifest_of
from flakebot.services.declaration import ServiceSpec
from flakebot.services.layout import ServiceDir, all_service_dirs
from flakebot.services.logfile import MAX_LINE, lines_of, tail
from flakebot.services.supervised import show, start_supervised, stop_supervised
from flakebot.services.upgrade import upgrade

logger = logging.getLogger(__name__)


def up(
    ref: str,
    settings: Settings,
    *,
    port: int | None = None,
    secrets: dict[str, str] | None = None,
    network: bool = False,
    replace: bool = False,
    agent: bool = False,
) -> dict[str, Any]:
    """Start catalogued service `ref` under a detached supervisor and wait until it is healthy; its status.
    `secrets` (credentials.parse: KEY -> file path) appear in its $CREDENTIALS_DIRECTORY. `network`: it may reach
    the outside (never the host's loopback; forward.py), recorded in launch.json so restarts keep it.
    A service that does not become healthy is stopped again (SandboxError with the log's tail).
    `ref` naming another version than the one running is an upgrade (upgrade.py): health-gated, the running version
    kept when the new one fails its checks (UpgradeRefused).
    The program started is recorded (identity.py): restarts run it, not what the catalog's name means later.
    `agent` (an MCP call) may neither upgrade a running service nor start one whose last launch held secrets;
    the user's `up` of another program than a secret-holding launch recorded needs `replace`."""
    manifest = service_manifest_of(ref, settings)
    spec = ServiceSpec.from_dict(manifest["service"])
    where = ServiceDir.of(manifest["name"], settings)
    forward.pasta_program()  # before anything starts: no forward, no service
    binary = built_program(manifest, settings.nix_build_timeout)
    program = identity.record(manifest, binary)
    with where.control_lock():
        earlier = where.read_json(where.launch_file)
        if where.supervisor_alive():
            running = str(earlier.get("version", ""))
            if "@" not in ref or manifest["catalog_version"] == running:
                raise UsageError(
                    f"service {where.name} {running} is running already (port {where.status().get('port')})",
                    fix=f"stop it first with 'flakebot down {where.name}', or upgrade with 'flakebot up "
                    f"{where.name}@VERSION'",
                )
            if agent:
                raise UsageError(
                    f"service {where.name} {running} is running: replacing its program is the user's upgrade",
                    fix=f"ask the user to run 'flakebot up {ref}'",
                )
            return upgrade(where, manifest, binary, program, earlier, settings, port=port, secrets=secrets,
                           network=network)  # fmt: skip
        identity.may_start(where, earlier, program, replace=replace, agent=agent)
        launch = {
            "name": where.name,
            "version": manifest["catalog_version"],
            "previous_version": previous_version(earlier, manifest["catalog_version"]),
            "binary": str(binary),
            "spec": spec.to_dict(),
            "host_port": _host_port(port),
            "sandbox": settings.sandbox,
            "limits": envelope.launch_limits(settings),
            "secrets": secrets or {},  # paths only: the supervisor reads them at each start
            "network": network,  # off unless this command asked (restart, up --all, rollback keep the recorded one)
            "program": program,  # what restarts run and secrets go to (identity.py)
            "previous": identity.previous(earlier, manifest["catalog_version"]),  # what rollback runs
            "examples": manifest.get("lifecycle_examples"),  # what an upgrade or a rollback to it is checked with
        }
        return _healthy_or_stopped(where, launch)


def _healthy_or_stopped(where: ServiceDir, launch: dict[str, Any]) -> dict[str, Any]:
    """Start `launch` (the control lock held); its status once healthy, else stopped again and a SandboxError."""
    status = start_supervised(where, launch)
    if status.get("state") != "running":
        stopped = stop_supervised(where)
        raise SandboxError(
            f"service {where.name} did not become healthy: {status.get('message') or stopped.get('message')}",
            fix=f"read its log ({where.log}): " + output_quoted(tail(where.log, 5)),
        )
    return show(where)


def relaunch(where: ServiceDir, launch: dict[str, Any], port: int | None) -> dict[str, Any]:
    """Start exactly the program `launch` recorded (checked: identity.checked_binary) with its secrets, network and
    state, on `port` (None: a free one); the catalog is not read."""
    forward.pasta_program()
    program = identity.program_of(launch)
    binary = identity.checked_binary(where.name, program)
    with where.control_lock():
        if where.supervisor_alive():
            raise UsageError(f"service {where.name} is running already", fix=f"'flakebot restart {where.name}'")
        again = {**launch, "binary": str(binary), "program": program, "host_port": _host_port(port)}
        return _healthy_or_stopped(where, again)


def previous_version(earlier: dict[str, Any], version: str) -> str:
    """The version a start of `version` follows: the one the last launch ran when it differs (else its own previous)."""
    last = str(earlier.get("version") or "")
    return last if last and last != version else str(earlier.get("previous_version") or "")


def rollback(name: str, settings: Settings) -> dict[str, Any]:
    """Go back to the program the service ran before (its state kept), as its launch recorded it (not what the
    catalog's name@version means now): health-gated as an upgrade when it runs, a plain start (on its port when
    free) when it does not."""
    where = ServiceDir.of(name, settings)
    launch = where.read_json(where.launch_file)
    previous = str(launch.get("previous_version") or "")
    before = launch.get("previous")
    if not previous:
        raise UsageError(
            f"service {name} has no previous version to go back to"
            if launch
            else f"no service {name} was started here",
            fix="'flakebot services' shows each service's version and previous one",
        )
    if not isinstance(before, dict) or not before.get("spec"):  # a launch from before programs were recorded
        raise UsageError(
            f"service {name}'s previous version {previous} has no recorded program to go back to",
            fix=f"start the catalog's {previous} with 'flakebot up {name}@{previous}'",
        )
    program = before.get("program") or identity.program_of(before)
    binary = identity.checked_binary(name, program)
    secrets, network = launch.get("secrets") or {}, forward.outbound_network(launch)
    if where.supervisor_alive():
        manifest = {"catalog_version": str(before.get("version") or previous), "service": before["spec"],
                    "lifecycle_examples": before.get("examples")}  # fmt: skip
        with where.control_lock():
            running = where.read_json(where.launch_file)
            if running.get("version") != launch.get("version"):  # another command switched it meanwhile
                raise UsageError(f"service {name} changed while rolling back", fix=f"'flakebot rollback {name}' again")
            return upgrade(where, manifest, binary, program, running, settings, secrets=secrets, network=network)
    back = {**launch, **{k: before.get(k) for k in identity.PROGRAM_FIELDS}, "program": program,
            "version": str(before.get("version") or previous), "previous_version": str(launch.get("version") or ""),
            "previous": identity.snapshot(launch)}  # fmt: skip
    return relaunch(where, back, forward.port_if_free(launch.get("host_port")))


RESTORABLE = ("starting", "running", "restarting", "stopping", "lost")


def up_all(settings: Settings) -> list[dict[str, Any]]:
    """Start again every service that was up when its supervisor went away (a reboot, a kill): the program it ran
    (recorded), its port when it is still free, its secrets, network and state. Each one's status, or
    {"name", "error"} for one that did not start."""
    results: list[dict[str, Any]] = []
    for where in all_service_dirs(settings):
        status = show(where)
        if status.get("state") != "lost" and not (status.get("state") in RESTORABLE and not status["supervised"]):
            continue
        try:
            launch = where.read_json(where.launch_file)
            results.append(relaunch(where, launch, forward.port_if_free(status.get("port"))))
        except FlakebotError as exc:
            results.append({"name": where.name, "error": exc.message})
    return results


def restart(name: str, settings: Settings) -> dict[str, Any]:
    """`down`, then a start of the program it ran (recorded, checked first: one that is gone leaves the service as
    it is), on its port (when still free), with its secrets, network and state."""
    where = ServiceDir.of(name, settings)
    launch = where.read_json(where.launch_file)
    if not launch:
        raise UsageError(f"no service {name} was started here", fix="list services with 'flakebot services'")
    identity.checked_binary(name, identity.program_of(launch))
    down(name, settings)
    return relaunch(where, launch, forward.port_if_free(launch.get("host_port")))


def check_up(ref: str, settings: Settings, port: int | None) -> None:
    """The checks `up` makes that need nothing built or started (a catalogued service by that name, a usable
    port), for a door that answers before the work starts."""
    ServiceDir.of(service_manifest_of(ref, settings)["name"], settings)
    if port is not None:
        _host_port(port)


def _host_port(port: int | None) -> int:
    if port is None:
        return forward.free_port()
    if not 1024 <= port <= 65535:
        raise UsageError(f"--port {port} is not a free unprivileged port", fix="pass --port between 1024 and 65535")
    if forward.port_in_use(port):
        raise UsageError(f"port {port} on 127.0.0.1 is in use", fix="pass another --port, or none for a free one")
    return port


def down(name: str, settings: Settings) -> dict[str, Any]:
    """Stop service `name`: its supervisor stops the service (SIGTERM, SIGKILL after the grace period) and exits;
    a supervisor that does not is killed, and so is anything it left. Its status after."""
    where = ServiceDir.of(name, settings)
    if not where.status():
        raise UsageError(f"no service {name} was started here", fix="list services with 'flakebot services'")
    with where.control_lock():
        return stop_supervised(where)


def statuses(settings: Settings) -> list[dict[str, Any]]:
    """Every service started here (running or not), by name."""
    return [show(where) for where in all_service_dirs(settings) if where.status()]


MAX_LOG_LINES = 10_000  # what one answer holds (the log itself rotates at 1 MiB)


def logs(name: str, settings: Settings, *, lines: int = 50, most: int = MAX_LOG_LINES) -> list[str]:
    """The last `lines` lines of the service's log, each through the renderer for others' text."""
    if not 1 <= lines <= most:
        raise UsageError(f"lines {lines} is out of range", fix=f"ask for 1 to {most} lines")
    where = ServiceDir.of(name, settings)
    if not where.root.is_dir():
        raise UsageError(f"no service {name} was started here", fix="list services with 'flakebot services'")
    return tail(where.log, lines)


def follow(name: str, settings: Settings, *, poll: float = 0.2) -> Iterator[str]:
    """The log's new lines as they are written (rotation followed), until the caller stops. Only complete lines: a
    poll can catch a long line's write part way (it is copied page by page), and the rest of it, read at the next
    poll, is the same line of the service's, never a line of its own (it would have no mark, and could hold a stamp
    and a `flakebot:` note the service placed where a page ends)."""
    where = ServiceDir.of(name, settings)
    offset = where.log.stat().st_size if where.log.exists() else 0
    pending = b""
    while True:
        size = where.log.stat().st_size if where.log.exists() else 0
        if size < offset:  # rotated: the new file from its start (the old one ended with a whole line)
            offset, pending = 0, b""
        if size > offset:
            with open(where.log, "rb") as handle:
                handle.seek(offset)
                data = handle.read(size - offset)
            offset += len(data)
            whole, newline, pending = (pending + data).rpartition(b"\n")
            if newline:
                yield from lines_of(whole + newline)
            if len(pending) > 8 * MAX_LINE:  # no line the supervisor writes is this long: not shown
                pending = b""
        else:
            time.sleep(poll)


__all__ = ["down", "follow", "logs", "relaunch", "restart", "rollback", "statuses", "up"]
