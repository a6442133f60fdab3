"""up, down, status and logs of services: what the CLI (and later MCP and the API) call."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.deliver.toolrun import built_program
from flakebot.errors import FlakebotError, SandboxError, UsageError
from flakebot.modeltext import output_quoted
from flakebot.services import envelope, forward, handoff, identity, needs, owner
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
    the user's `up` of another program than a secret-holding launch recorded needs `replace`.
    What it `needs` (its declaration) starts first, each healthy before the next (needs.py); when something fails,
    what this call started is stopped again."""
    manifest = service_manifest_of(ref, settings)
    spec = ServiceSpec.from_dict(manifest["service"])
    where = ServiceDir.of(manifest["name"], settings)
    order = _planned(where.name, spec, settings, agent=agent)  # an unknown name or a cycle: nothing started
    if handoff.mode(spec, network) == "pasta":
        forward.pasta_program()  # before anything starts: no forward, no service
    binary = built_program(manifest, settings.nix_build_timeout)
    program = identity.record(manifest, binary)
    earlier = where.read_json(where.launch_file)
    owner.may_take(where.name, earlier, settings)  # another tenant's: taken, before "running already" at its port
    _may_up(where, ref, manifest, program, earlier, settings, replace=replace, agent=agent)
    started = _start_needed(where.name, order, settings, agent=agent)  # after: a refused up starts none of them
    try:
        status = _up_locked(where, ref, manifest, spec, binary, program, settings, port=port, secrets=secrets,
                            network=network, replace=replace, agent=agent)  # fmt: skip
    except BaseException:
        _stop_all(started)
        raise
    return {**status, **_reach_again(where.name, status.get("port"), settings, agent=agent)}


def _reach_again(name: str, port: object, settings: Settings, *, agent: bool) -> dict[str, Any]:
    """After `name` started on `port` (up, relaunch): services still running from before (its supervisor died under them) reach
    it at the port it had, which any service may take once free. They stop (what needs them first) and start again
    after it, as `restart` does, reaching it where it is now; an agent's never starts one holding the user's secrets
    again (left stopped, named). Nothing when none is stale."""
    if all(_reached_at(dependent, name) == port for dependent in needs.dependents(name, settings)):
        return {}
    stopped: list[str] = []
    _stop_dependents(name, settings, stopped, {name})
    restarted, left = [], []
    for other in reversed(stopped):
        again = ServiceDir.of(other, settings)
        launch = again.read_json(again.launch_file)
        try:
            if agent and launch.get("secrets"):
                raise UsageError(f"service {other} holds the user's secrets", fix=f"'flakebot restart {other}'")
            relaunch(again, launch, forward.port_if_free(launch.get("host_port")), settings, agent=agent)
            restarted.append(other)
        except FlakebotError as exc:
            logger.warning("%s, which needs %s, did not start again: %s", other, name, exc.message)
            left.append(other)
    return {"restarted_dependents": restarted, **({"stopped_dependents": left} if left else {})}


def _up_locked(
    where: ServiceDir,
    ref: str,
    manifest: dict[str, Any],
    spec: ServiceSpec,
    binary: Path,
    program: dict[str, Any],
    settings: Settings,
    *,
    port: int | None,
    secrets: dict[str, str] | None,
    network: bool,
    replace: bool,
    agent: bool,
) -> dict[str, Any]:
    """`up` once what it needs runs: an upgrade of the running version or a start of `program`."""
    with where.control_lock():
        earlier = where.read_json(where.launch_file)
        owner.may_take(where.name, earlier, settings)  # again, under the lock: two tenants' first ups at once
        _may_up(where, ref, manifest, program, earlier, settings, replace=replace, agent=agent)  # again, under the lock
        if where.supervisor_alive():
            running_now = {**earlier, "needs": needs.reach(where.name, spec, settings)}
            return upgrade(where, manifest, binary, program, running_now, settings, port=port, secrets=secrets,
                           network=network)  # fmt: skip
        launch = {
            "name": where.name,
            "version": manifest["catalog_version"],
            "previous_version": previous_version(earlier, manifest["catalog_version"]),
            "binary": str(binary),
            "spec": spec.to_dict(),
            "host_port": _host_port(port, where.name, settings),
            "sandbox": settings.sandbox,
            "limits": envelope.launch_limits(settings),
            "secrets": secrets or {},  # paths only: the supervisor reads them at each start
            "network": network,  # off unless this command asked (restart, up --all, rollback keep the recorded one)
            "program": program,  # what restarts run and secrets go to (identity.py)
            "previous": identity.previous(earlier, manifest["catalog_version"]),  # what rollback runs
            "examples": manifest.get("lifecycle_examples"),  # what an upgrade or a rollback to it is checked with
            "needs": needs.reach(where.name, spec, settings),  # each needed service's port at this start
            owner.TENANT: owner.recorded(where.name, earlier, settings),  # whose it is (owner.py)
        }
        return _healthy_or_stopped(where, launch)


def _reached_at(dependent: ServiceDir, name: str) -> object:
    """The host port `dependent`'s launch reaches service `name` at."""
    reached = dependent.read_json(dependent.launch_file).get("needs")
    return reached.get(name) if isinstance(reached, dict) else None


def _may_up(
    where: ServiceDir,
    ref: str,
    manifest: dict[str, Any],
    program: dict[str, Any],
    earlier: dict[str, Any],
    settings: Settings,
    *,
    replace: bool,
    agent: bool,
) -> None:
    """Whether `up` of `ref` may go on over the service's last launch `earlier`: an upgrade when it runs (the user's
    only), else a start identity.may_start allows. Checked before what it needs starts, and again under the lock."""
    if where.supervisor_alive():
        # whose the running service is, from its launch as read now: `earlier` may predate another tenant's start
        # (written before its supervisor runs), and "running already" would tell that tenant's port
        owner.may_take(where.name, where.read_json(where.launch_file), settings)
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
        return
    identity.may_start(where, earlier, program, replace=replace, agent=agent)


def _planned(name: str, spec: ServiceSpec, settings: Settings, *, agent: bool) -> list[str]:
    """The services `name` needs, in start order, checked before anything starts: every name known, no cycle, and
    none an agent may not start (a stopped one whose last launch held the user's secrets: identity.may_start)."""
    order = needs.start_order(name, spec.needs, settings)
    for need in order if agent else ():
        where = ServiceDir.of(need, settings)
        if not needs.running(where) and where.read_json(where.launch_file).get("secrets"):
            raise UsageError(
                f"service {name} needs {need}, which the user started with secrets: an agent cannot start it",
                fix=f"ask the user to run 'flakebot up {need}'",
            )
    return order


def _start_needed(name: str, order: list[str], settings: Settings, *, agent: bool) -> list[ServiceDir]:
    """Start each service of `order` that is not running, one at a time, each healthy before the next: the program
    it last ran when it ran here (recorded, never the catalog's), else the catalog's. The ones it started; when one
    does not become healthy, those are stopped again and a SandboxError names it."""
    started: list[ServiceDir] = []
    for need in order:
        where = ServiceDir.of(need, settings)
        try:
            owner.may_take(need, where.read_json(where.launch_file), settings)  # another tenant's is never reached
        except UsageError:
            _stop_all(started)
            raise
        if needs.running(where):
            continue
        try:
            if where.supervisor_alive():
                state = where.status().get("state")
                raise SandboxError(f"it is {state}, not healthy", fix=f"read 'flakebot logs {need}'")
            launch = where.read_json(where.launch_file)
            if agent and launch.get("secrets"):  # as _planned, at the start itself (the user may have started it since)
                raise UsageError(
                    f"service {need} was started by the user with secrets: an agent cannot start it",
                    fix=f"ask the user to run 'flakebot up {need}'",
                )
            if launch.get("binary"):
                relaunch(where, launch, forward.port_if_free(launch.get("host_port")), settings, agent=agent)
            else:
                up(need, settings, agent=agent)
        except FlakebotError as exc:
            _stop_all(started)
            raise SandboxError(
                f"service {name} needs {need}, which did not start: {exc.message}",
                fix=f"{exc.fix} ('flakebot up {need}' starts it alone)",
            ) from None
        logger.info("started %s, which %s needs", need, name)
        started.append(where)
    return started


def _stop_all(started: list[ServiceDir]) -> None:
    """Stop the services a failed start started, the last started first."""
    for where in reversed(started):
        with where.control_lock():
            stop_supervised(where)


def _healthy_or_stopped(
    where: ServiceDir, launch: dict[str, Any], listener: socket.socket | None = None
) -> dict[str, Any]:
    """Start `launch` (the control lock held); its status once healthy, else stopped again and a SandboxError."""
    status = start_supervised(where, launch, listener)
    if status.get("state") != "running":
        stopped = stop_supervised(where)
        raise SandboxError(
            f"service {where.name} did not become healthy: {status.get('message') or stopped.get('message')}",
            fix=f"read its log ({where.log}): " + output_quoted(tail(where.log, 5)),
        )
    return show(where)


def relaunch(
    where: ServiceDir,
    launch: dict[str, Any],
    port: int | None,
    settings: Settings,
    listener: socket.socket | None = None,
    *,
    agent: bool = False,
) -> dict[str, Any]:
    """Start exactly the program `launch` recorded (checked: identity.checked_binary) with its secrets, network and
    state, on `port` (None: a free one); the catalog is not read. What it needs starts first (as `up`, `agent` as
    there), reached at the ports those run on now. `listener`: its listening socket, taken from the supervisor before
    (restart): its port, held throughout."""
    spec = ServiceSpec.from_dict(launch["spec"])
    if handoff.mode(spec, forward.outbound_network(launch)) == "pasta":
        forward.pasta_program()
    program = identity.program_of(launch)
    binary = identity.checked_binary(where.name, program)
    started = _start_needed(where.name, _planned(where.name, spec, settings, agent=agent), settings, agent=agent)
    try:
        with where.control_lock():
            if where.supervisor_alive():
                raise UsageError(f"service {where.name} is running already", fix=f"'flakebot restart {where.name}'")
            host_port = (
                int(listener.getsockname()[1])
                if listener is not None
                else _host_port(port, where.name, settings, given=False)
            )
            again = {**launch, "binary": str(binary), "program": program, "host_port": host_port,
                     "needs": needs.reach(where.name, spec, settings)}  # fmt: skip
            status = _healthy_or_stopped(where, again, listener)
    except BaseException:
        _stop_all(started)
        raise
    return {**status, **_reach_again(where.name, status.get("port"), settings, agent=agent)}


def previous_version(earlier: dict[str, Any], version: str) -> str:
    """The version a start of `version` follows: the one the last launch ran when it differs (else its own previous)."""
    last = str(earlier.get("version") or "")
    return last if last and last != version else str(earlier.get("previous_version") or "")


def rollback(name: str, settings: Settings, *, agent: bool = False) -> dict[str, Any]:
    """Go back to the program the service ran before (its state kept), as its launch recorded it (not what the
    catalog's name@version means now): health-gated as an upgrade when it runs, a plain start (on its port when
    free) when it does not. `agent` (MCP): never for a service holding the user's secrets (identity.may_roll_back)."""
    where = ServiceDir.of(name, settings)
    launch = where.read_json(where.launch_file)
    identity.may_roll_back(name, launch, agent=agent)
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
        spec = ServiceSpec.from_dict(before["spec"])
        started = _start_needed(name, _planned(name, spec, settings, agent=agent), settings, agent=agent)
        try:
            with where.control_lock():
                running = where.read_json(where.launch_file)
                if running.get("version") != launch.get("version"):  # another command switched it meanwhile
                    raise UsageError(
                        f"service {name} changed while rolling back", fix=f"'flakebot rollback {name}' again"
                    )
                running = {**running, "needs": needs.reach(name, spec, settings)}
                return upgrade(where, manifest, binary, program, running, settings, secrets=secrets, network=network)
        except BaseException:
            _stop_all(started)
            raise
    back = {**launch, **{k: before.get(k) for k in identity.PROGRAM_FIELDS}, "program": program,
            "version": str(before.get("version") or previous), "previous_version": str(launch.get("version") or ""),
            "previous": identity.snapshot(launch)}  # fmt: skip
    return relaunch(where, back, forward.port_if_free(launch.get("host_port")), settings, agent=agent)


RESTORABLE = ("starting", "running", "restarting", "stopping", "lost")


def up_all(settings: Settings) -> list[dict[str, Any]]:
    """Start again every service that was up when its supervisor went away (a reboot, a kill): the program it ran
    (recorded), its port when it is still free, its secrets, network and state. Each one's status, or
    {"name", "error"} for one that did not start. Each starts after what it needs (which starts first when it was
    stopped)."""
    results: list[dict[str, Any]] = []
    lost = []
    for where in all_service_dirs(settings):
        status = show(where)
        if status.get("state") == "lost" or (status.get("state") in RESTORABLE and not status["supervised"]):
            lost.append(where)
    for where in needs.in_start_order(lost):
        status = show(where)
        if where.supervisor_alive():  # started already, as what a service before it needs
            results.append(status)
            continue
        try:
            launch = where.read_json(where.launch_file)
            results.append(relaunch(where, launch, forward.port_if_free(status.get("port")), settings))
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
    # its socket, when flakebot holds it: kept through the restart (connections wait, the port stays ours)
    held = handoff.take(where.handover) if where.supervisor_alive() else None
    try:
        dependents = down(name, settings)["stopped_dependents"]
        status = relaunch(where, launch, forward.port_if_free(launch.get("host_port")), settings, held)
    finally:
        if held is not None:
            held.close()
    for other in reversed(dependents):  # what needs it starts again after it, as systemd's Requires restarts them
        again = ServiceDir.of(other, settings)
        again_launch = again.read_json(again.launch_file)
        relaunch(again, again_launch, forward.port_if_free(again_launch.get("host_port")), settings)
    return {**status, "restarted_dependents": list(reversed(dependents))}


def check_up(ref: str, settings: Settings, port: int | None, *, agent: bool = False) -> None:
    """The checks `up` makes that need nothing built or started (a catalogued service by that name, a usable
    port, what it needs: known, no cycle, none an agent may not start), for a door that answers before the work
    starts."""
    manifest = service_manifest_of(ref, settings)
    where = ServiceDir.of(manifest["name"], settings)
    _planned(where.name, ServiceSpec.from_dict(manifest["service"]), settings, agent=agent)
    if agent:  # refused at once (before a job): no upgrade, no secret-holding launch (its program not read then)
        _may_up(where, ref, manifest, {}, where.read_json(where.launch_file), settings, replace=False, agent=True)
    if port is not None:
        _host_port(port, where.name, settings)


def _host_port(port: int | None, name: str, settings: Settings, *, given: bool = True) -> int:
    """The host port a start of service `name` listens on: `port` (the user's --port when `given`, else a recorded
    one, None when taken), else the one its running dependents still reach it at when free, else a free one; never
    a port running services reach as another service (needs.reached_ports)."""
    reached = needs.reached_ports(settings)
    others = {p: why for p, why in reached.items() if why[1] != name}
    if port is not None and port in others:
        if given:
            dependent, need = others[port]
            raise UsageError(
                f"port {port} is where running {dependent} reaches {need}",
                fix="pass another --port, or none for a free one",
            )
        port = None
    if port is None:
        kept = [p for p, why in reached.items() if why[1] == name and not forward.port_in_use(p)]
        if kept:
            return kept[0]
        chosen = forward.free_port()
        while chosen in others:
            chosen = forward.free_port()
        return chosen
    if not 1024 <= port <= 65535:
        raise UsageError(f"--port {port} is not a free unprivileged port", fix="pass --port between 1024 and 65535")
    if forward.port_in_use(port):
        raise UsageError(f"port {port} on 127.0.0.1 is in use", fix="pass another --port, or none for a free one")
    return port


def down(name: str, settings: Settings) -> dict[str, Any]:
    """Stop service `name`: its supervisor stops the service (SIGTERM, SIGKILL after the grace period) and exits;
    a supervisor that does not is killed, and so is anything it left. Every running service that needs it (directly
    or through another) is stopped first, dependents before what they need (systemd's Requires); what `name` itself
    needs keeps running. Its status after, with `stopped_dependents` in the order they stopped."""
    where = ServiceDir.of(name, settings)
    if not where.status():
        raise UsageError(f"no service {name} was started here", fix="list services with 'flakebot services'")
    stopped: list[str] = []
    _stop_dependents(name, settings, stopped, {name})
    with where.control_lock():
        return {**stop_supervised(where), "stopped_dependents": stopped}


def _stop_dependents(name: str, settings: Settings, stopped: list[str], visiting: set[str]) -> None:
    for where in needs.dependents(name, settings):
        if where.name in stopped or where.name in visiting:
            continue
        visiting.add(where.name)
        _stop_dependents(where.name, settings, stopped, visiting)
        with where.control_lock():
            stop_supervised(where)
        logger.info("stopped %s, which needs %s", where.name, name)
        stopped.append(where.name)


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
