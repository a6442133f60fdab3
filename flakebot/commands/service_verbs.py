"""The service commands: package-service, up (an upgrade when another version runs), services, logs, down, restart,
rollback, export, and service_request (one HTTP request to a service, for agents). Their work is flakebot.services';
this module declares them for every door (table.py) and checks what needs nothing started."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Hints, Param
from flakebot.errors import UsageError

if TYPE_CHECKING:
    from flakebot.services.declaration import ServiceSpec
    from flakebot.services.lifecycle import Examples

# A service's status as an agent needs it (no pids or host paths).
AGENT_FIELDS = ("name", "version", "previous_version", "state", "health", "port", "inner_port", "network",
                "needs", "socket", "restarts", "uptime_s", "message")  # fmt: skip
MOST_LOG_LINES = 500  # an agent's logs at most; a person's are the log's own bound

Service = Annotated[str, Param("A service's name.", positional=True)]
ServiceRef = Annotated[str, Param("A catalogued service: NAME or NAME@VERSION.", positional=True)]


def package_service(
    target: Annotated[str, Param("A crate directory (PATH) or a crate name from the registry.", positional=True)],
    port: Annotated[int, Param("The port it listens on inside its own network namespace.")] = 8080,
    port_env: Annotated[str, Param("The environment variable that tells it the port.")] = "PORT",
    health: Annotated[str, Param("Health check: an HTTP path answering 2xx, or 'tcp'.")] = "/health",
    stop_grace: Annotated[float, Param("Seconds from SIGTERM to SIGKILL when it stops.")] = 10.0,
    start_timeout: Annotated[float, Param("Seconds a start may take to become healthy.")] = 30.0,
    socket: Annotated[
        str, Param("How its port reaches it: 'handoff' (it accepts on fd 3, LISTEN_FDS) or 'pasta' (it binds PORT).")
    ] = "pasta",
    name: Annotated[str | None, Param("Catalog name (default: the binary's).")] = None,
    needs: Annotated[
        list[str] | None,
        Param(
            "A service it needs, started (healthy) before it, at $FLAKEBOT_<NAME>_URL (repeatable).", cli=("--needs",)
        ),
    ] = None,
    bin_name: Annotated[str | None, Param("The binary, when the crate has several.", cli=("--bin",))] = None,
    offline: Annotated[bool | None, Param("Local registry only.", cli=("--offline/--online",))] = None,
    examples: Annotated[
        str | None,
        Param('Requests to check: JSON {"first": [...], "after_restart": [...]} (docs/services.md).'),
    ] = None,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Package a crate as a service: flake, nix build, lifecycle check, catalog.

    The lifecycle check runs the built program: its health check, the --examples requests, SIGTERM, and its state
    kept over a restart. The service is catalogued for 'flakebot up'. --needs NAME: 'flakebot up' starts NAME first
    and this service reaches it at $FLAKEBOT_<NAME>_URL (docs/services.md)."""
    from flakebot.deliver.howto import how_to_use
    from flakebot.services.declaration import Health, ServiceSpec
    from flakebot.services.lifecycle import Examples

    spec = ServiceSpec(port=port, port_env=port_env, health=Health.parse(health), stop_grace_s=stop_grace,
                       start_s=start_timeout, needs=tuple(needs or ()), socket=socket)  # fmt: skip
    cases = Examples.load(Path(examples)) if examples else None
    overrides = {"offline": offline} if offline is not None else {}
    entry = _catalogued(
        target, spec, settings_or_default(settings), name=name, bin_name=bin_name, overrides=overrides, examples=cases
    )
    return {**entry, **how_to_use(entry["name"], "service")}  # a service: started with up, not called as a tool


def _catalogued(
    target: str,
    spec: ServiceSpec,
    settings: config.Settings,
    *,
    name: str | None = None,
    bin_name: str | None = None,
    overrides: dict[str, Any] | None = None,
    examples: Examples | None = None,
) -> dict[str, Any]:
    """Package the crate at `target` (a directory or a crate name), check its lifecycle (with `examples`) and
    catalog it as a service; its catalog entry. A service whose lifecycle fails is not catalogued (NixError)."""
    from flakebot import preflight
    from flakebot.commands.wrap import package_request
    from flakebot.deliver.catalog import Catalog
    from flakebot.errors import NixError
    from flakebot.pipeline.request import RunRequest
    from flakebot.services.catalogued import catalog_version, service_manifest, usage_markdown
    from flakebot.services.layout import checked_name
    from flakebot.services.lifecycle import check_lifecycle

    preflight.check_writable_dir(settings.path("catalog_dir"), "catalog_dir")  # as package --catalog: before a run
    if name is not None:  # before any build: a name `up` would refuse is refused here
        checked_name(name, fix="pass --name with lower-case letters, digits, '-' and '_'")
        _not_needing_itself(name, spec)
    # the flake carries the service's outputs beside its package: declaration, NixOS module, OCI image
    outputs = {"name": name, "spec": spec.to_dict()}
    request = RunRequest(target=target, bin=bin_name, settings=overrides or {}, service_flake=outputs)
    built = package_request(request, settings=settings)
    name = checked_name(name or built.main_program, fix="pass --name NAME (lower-case letters, digits, '-', '_')")
    _not_needing_itself(name, spec)
    report = check_lifecycle(Path(built.bin_path), spec, settings, examples)
    if not report.ok:
        raise NixError(
            f"service {name} failed its lifecycle check: {report.first_problem()}",
            fix="a service must answer its health check, exit 0 on SIGTERM and keep its state in $STATE_DIRECTORY; "
            "its output: " + report.last_output(),
            lifecycle=report.to_dict(),
            flake_dir=built.flake_dir,
        )
    manifest = {**service_manifest(name, built.to_dict(), spec), "lifecycle": report.steps}
    if examples is not None:
        manifest["lifecycle_examples"] = examples.to_dict()  # as a crafted service keeps them: an upgrade checks them
    return Catalog.open(settings).add(
        name,
        need=f"service {name}",
        flake_dir=Path(built.flake_dir),
        manifest=manifest,
        usage_md=usage_markdown(manifest),
        store_path=built.store_path,
        run_id=built.run_id,
        origin={"kind": "package", "target": target},
        dependencies_path=built.dependencies_path,
        version=catalog_version(built.to_dict().get("version")),
    )


def _not_needing_itself(name: str, spec: ServiceSpec) -> None:
    if name in spec.needs:
        raise UsageError(f"service {name} cannot need itself", fix=f"drop --needs {name}")


def up(
    service: Annotated[
        str | None, Param("A catalogued service: NAME or NAME@VERSION.", positional=True, mcp_required=True)
    ] = None,
    port: Annotated[
        int | None,
        Param(
            "Host port on 127.0.0.1 (default: a free one).",
            mcp_help="Host port on 127.0.0.1 (1024-65535); null for a free one.",
            least=1024,
            most=65535,
        ),
    ] = None,
    every: Annotated[
        bool,
        Param(
            "Start again every service that was up when its supervisor went away.",
            cli=("--all",),
            doors=frozenset({"cli", "api"}),
        ),
    ] = False,
    secret: Annotated[
        list[str] | None,
        Param(
            "KEY=FILE: the file's content as $CREDENTIALS_DIRECTORY/KEY, read-only (repeatable).",
            doors=frozenset({"cli", "api"}),
        ),
    ] = None,
    network: Annotated[
        bool,
        Param(
            "Let it reach the outside (never the host's 127.0.0.1); kept by restart, upgrade and --all.",
            cli=("--network",),
            mcp_help="true: the service may reach the outside (never the host's 127.0.0.1), kept over its restarts "
            "and upgrades; false or absent: no network.",
        ),
    ] = False,
    replace: Annotated[
        bool,
        Param(
            "Start the catalog's program although the service last ran another one with secrets.",
            cli=("--replace",),
            doors=frozenset({"cli", "api"}),
        ),
    ] = False,
    settings: config.Settings | None = None,
    agent: bool = False,
) -> dict[str, Any]:
    """Start a service under its own supervisor, sandboxed, its port on 127.0.0.1; returns once it is healthy.

    NAME@VERSION while another version runs upgrades it: checked on a copy of its state first, never replacing
    the running version when it fails (exit 43). The program started is recorded: restart, --all and rollback
    run that program, whatever the catalog's name means later."""
    from flakebot.services import control, credentials

    settings = settings_or_default(settings)
    if every and service:
        raise UsageError(
            "up NAME and up --all cannot be combined", fix="flakebot up NAME for one service, or flakebot up --all"
        )
    if not every and not service:
        raise UsageError("name one service or pass --all", fix="flakebot up NAME, or flakebot up --all")
    if every and network:
        raise UsageError(
            "--all starts each service as it last ran (with or without network)",
            fix="flakebot up --all, then 'flakebot down NAME' and 'flakebot up NAME --network' for one service",
        )
    if every:
        return {"services": control.up_all(settings)}
    assert service is not None
    control.check_up(service, settings, port, agent=agent)  # what needs nothing started, before anything starts
    secrets = credentials.parse(list(secret or []), Path.cwd())
    # an agent's up never upgrades a running service nor starts one the user gave secrets (identity.py)
    return control.up(service, settings, port=port, secrets=secrets, network=network, replace=replace, agent=agent)


def _check_up(
    service: str | None = None,
    port: int | None = None,
    every: bool = False,
    settings: config.Settings | None = None,
    agent: bool = False,
) -> None:
    """What up needs nothing started for: a catalogued service, a port it may have, what it needs (before a job
    exists)."""
    from flakebot.services import control

    if service and not every:
        control.check_up(service, settings_or_default(settings), port, agent=agent)


def list_services(settings: config.Settings | None = None) -> dict[str, Any]:
    """List services started here: state, port, health, restarts, uptime, outbound network."""
    from flakebot.services.control import statuses

    return {"services": statuses(settings_or_default(settings))}


def service_logs(
    service: Service,
    lines: Annotated[
        int,
        Param(
            "How many of the last lines.",
            cli=("--lines", "-n"),
            mcp_help="How many of the last lines (1-500, default 50).",
        ),
    ] = 50,
    follow: Annotated[
        bool, Param("Keep printing new lines (Ctrl-C stops).", cli=("--follow", "-f"), doors=frozenset({"cli", "api"}))
    ] = False,
    settings: config.Settings | None = None,
    agent: bool = False,
) -> dict[str, Any]:
    """Print a service's log (its output and the supervisor's notes), redacted.

    From Python, with follow: the result's `following` yields the lines written after these."""
    from flakebot.services import control

    settings = settings_or_default(settings)
    if agent:
        found = [line[:2000] for line in control.logs(service, settings, lines=lines, most=MOST_LOG_LINES)]
    else:
        found = control.logs(service, settings, lines=lines)
    result: dict[str, Any] = {"service": service, "lines": found}
    if follow:
        result["following"] = _following(service, settings)
    return result


def _following(service: str, settings: config.Settings) -> Iterator[str]:
    from flakebot.services import control

    yield from control.follow(service, settings)


def down(service: Service, settings: config.Settings | None = None) -> dict[str, Any]:
    """Stop a service: SIGTERM, SIGKILL after its grace period; nothing left running, its port freed."""
    from flakebot.services.control import down as stop

    return stop(service, settings_or_default(settings))


def restart(service: Service, settings: config.Settings | None = None) -> dict[str, Any]:
    """Stop a service and start it again: the same version, port, secrets, network and state."""
    from flakebot.services.control import restart as again

    return again(service, settings_or_default(settings))


def rollback(service: Service, settings: config.Settings | None = None, agent: bool = False) -> dict[str, Any]:
    """Go back to the version the service ran before, its state kept (health-gated as an upgrade)."""
    from flakebot.services.control import rollback as back

    # an agent's rollback never hands the user's secrets to another program (identity.may_roll_back)
    return back(service, settings_or_default(settings), agent=agent)


def export_service(
    service: ServiceRef,
    nixos: Annotated[bool, Param("A NixOS module (checked with systemd-analyze).", cli=("--nixos",))] = False,
    oci: Annotated[bool, Param("An OCI image layout (nixpkgs' dockerTools).", cli=("--oci",))] = False,
    deploy_rs: Annotated[
        bool, Param("A deploy-rs node and the NixOS configuration it activates.", cli=("--deploy-rs",))
    ] = False,
    out: Annotated[str, Param("Directory to write into (made when missing).", cli=("--out", "-o"))] = ".",
    host: Annotated[str, Param("--deploy-rs: the node's host name.")] = "server",
    force: Annotated[bool, Param("Replace files an earlier export wrote.", cli=("--force",))] = False,
    run_check: Annotated[
        bool, Param("nix eval what was written, systemd-analyze verify units.", cli=("--check/--no-check",))
    ] = True,
    network: Annotated[
        bool,
        Param("It needs outbound network (as `up --network`; on too when it last ran so here).", cli=("--network",)),
    ] = False,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Write what another engine takes to run the service: --nixos (a NixOS module), --oci (an OCI image
    layout), --deploy-rs (a deploy-rs node); each checked here as far as this machine can (docs/services.md)."""
    from flakebot.services.export import TARGETS
    from flakebot.services.export import export_service as export

    chosen = [target for target, given in zip(TARGETS, (nixos, oci, deploy_rs), strict=True) if given]
    if len(chosen) != 1:
        raise UsageError(
            "say what to export, one at a time", fix=f"flakebot export {service} --nixos|--oci|--deploy-rs"
        )
    result = export(
        service, chosen[0], Path(out), settings_or_default(settings), host=host, force=force, run_check=run_check,
        network=network,
    )  # fmt: skip
    return {**result, "checked": run_check}


def service_request(
    service: Annotated[str, Param("The service's name.")],
    method: Annotated[str, Param("GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS.")],
    path: Annotated[
        str, Param("The path and query on the service, starting with '/' (printable ASCII, percent-encode the rest).")
    ],
    body: Annotated[str | None, Param("The request body (text, at most 1 MiB).")] = None,
    content_type: Annotated[str | None, Param("The body's Content-Type.")] = None,
    timeout_seconds: Annotated[int | None, Param("For the whole exchange (default 10, at most 60).")] = None,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Send one HTTP request to a running service through flakebot (to 127.0.0.1 and that service's own port
    only; redirects are returned, not followed) and return its status, content type and body (at most 1 MiB)."""
    from flakebot.services import proxy

    if timeout_seconds and not 0 < timeout_seconds <= proxy.MAX_TIMEOUT:  # before float(): 10**400 is valid JSON
        raise UsageError("timeout_seconds is out of range", fix=f"pass 1 to {proxy.MAX_TIMEOUT:g} (seconds)")
    timeout = float(timeout_seconds) if timeout_seconds else proxy.DEFAULT_TIMEOUT
    answer = proxy.request(
        service, settings_or_default(settings), method, path, body=body or "", content_type=content_type or None,
        timeout=timeout,
    )  # fmt: skip
    return {"service": service, **answer}


def _agent_status(status: dict[str, Any]) -> dict[str, Any]:
    return {k: status.get(k) for k in AGENT_FIELDS}


def _agent_start(status: dict[str, Any]) -> dict[str, Any]:
    """A start's status for an agent, with the dependents it started again (control._reach_again), when any."""
    moved = ("restarted_dependents", "stopped_dependents")
    return {**_agent_status(status), **{k: status[k] for k in moved if k in status}}


def _agent_statuses(result: dict[str, Any]) -> dict[str, Any]:
    return {"services": [_agent_status(s) for s in result["services"]]}


def _listening(status: dict[str, Any]) -> str:
    return f"http://127.0.0.1:{status['port']}"


def _up_text(result: dict[str, Any]) -> str:
    if "services" in result:  # up --all
        lines = [
            f"{r['name']}: {r.get('error') or 'healthy on 127.0.0.1:' + str(r['port'])}" for r in result["services"]
        ]
        return "\n".join(lines) or "nothing to start again"
    was = f", previous version {result['previous_version']}" if result.get("previous_version") else ""
    net = "outbound network" if result.get("network") else "no network"
    how = "its socket handed in" if result.get("socket") == "handoff" else "forwarded by pasta"
    return (
        f"{result['name']} {result['version']} healthy on {_listening(result)} "
        f"(state: {result['state_dir']}{was}; {net}; {how})"
    )


def _down_text(result: dict[str, Any]) -> str:
    first = result.get("stopped_dependents") or []
    before = f"stopped first, as they need it: {', '.join(first)}\n" if first else ""
    return f"{before}{result['name']} {result['state']}; state kept in {result.get('state_dir')}"


def _export_text(result: dict[str, Any]) -> str:
    network = "outbound network: on" if result.get("network") else "outbound network: none"
    if result["target"] == "oci":
        note = (
            ""
            if result["portable"]
            else "\n(built with the host stand-in: it carries this machine's loader and libraries)"
        )
        port, needs = result["port"], result.get("needs") or {}
        needed = (
            f"\nit needs {', '.join(needs)} (label io.flakebot.needs): run each, and pass "
            + " ".join(f"-e {variable}=http://HOST:PORT" for variable in needs.values())
            if needs
            else ""
        )
        return (
            f"wrote {result['layout']} (tag {result['tag']}, {result['layers']} layers, user {result['user']}){note}"
            f"\n{network} (label io.flakebot.network; a container engine gives network unless told otherwise)"
            f"{needed}\nrun it: podman run -p 127.0.0.1:{port}:{port} oci:{result['layout']}:{result['tag']}"
        )
    problems = result.get("problems") or []
    verdict = "not checked" if not result["checked"] else ("; ".join(problems) or "systemd-analyze verify: passed")
    if result["target"] == "nixos":
        socket = (
            "\nits socket unit holds the port and hands it in as fd 3 (socket: handoff)" if result.get("socket") else ""
        )
        needs = f"\nstarted after what it needs: {', '.join(result['needs'])}" if result.get("needs") else ""
        return (
            f"wrote {result['module']}\n{verdict}\n{result.get('exposure', '')}{socket}{needs}\n{network}\n"
            f"in your NixOS configuration:\n{result['configuration']}"
        )
    return (
        f"wrote {result['deploy']}\nwrote {result['module']}\n{verdict} (evaluated with stand-ins for nixosSystem and"
        " deploy-rs: only deploy-rs on a NixOS host confirms activation and rollback)\n"
        f"use it from your deployment flake as its first lines say; then: deploy .#{result['node']}"
    )


def _logs_data(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "following"}


COMMANDS = [
    Command(
        "package-service",
        package_service,
        text=lambda e: (
            f"catalogued service {e['name']} {e['version']}: {e['store_path']}\nstart it: flakebot up {e['name']}"
        ),
    ),
    Command(
        "up",
        up,
        mcp="service_up",
        hints=Hints("Start or upgrade a service", open_world=True),  # `network` may give it the outside
        long=True,
        agent=_agent_start,
        text=_up_text,
        exit_code=lambda r: 40 if any("error" in s for s in r.get("services", [])) else 0,
        working="starting {service} (health-gated)",
        check=_check_up,
        mcp_description="Start a catalogued service (sandboxed, no network unless `network` is true, its state kept "
        "across restarts and versions) and answer once it is healthy, with its status. It never replaces the program "
        "of a service that runs (an upgrade to NAME@VERSION is the user's `flakebot up NAME@VERSION`) and never "
        "starts one the user gave secrets (the user's `flakebot restart NAME`). Reach it with service_request. Can "
        "run as an MCP task; otherwise it answers once the service is healthy (seconds; at most the service's start "
        "timeout).",
    ),
    Command(
        "services",
        list_services,
        mcp="services",
        hints=Hints("List services", read_only=True, idempotent=True),
        agent=_agent_statuses,
        mcp_description="List the services started here: version (and the previous one), state, port, network, "
        "health, restarts, uptime.",
    ),
    Command(
        "logs",
        service_logs,
        mcp="service_logs",
        hints=Hints("Read a service's log", read_only=True, idempotent=True),
        data=_logs_data,
        mcp_description="The last lines of a service's log (its output and the supervisor's notes, redacted).",
    ),
    Command(
        "down",
        down,
        mcp="service_down",
        hints=Hints("Stop a service", destructive=True, idempotent=True),
        agent=lambda s: {**_agent_status(s), "stopped_dependents": s.get("stopped_dependents", [])},
        text=_down_text,
        working="stopping {service}",
        mcp_description="Stop a service: SIGTERM, SIGKILL after its grace period; its state is kept for the next "
        "start. Every running service that needs it is stopped first (listed in stopped_dependents).",
    ),
    Command(
        "restart",
        restart,
        text=lambda s: f"{s['name']} {s['version']} healthy again on {_listening(s)}",
        working="restarting {service}",
    ),
    Command(
        "rollback",
        rollback,
        mcp="service_rollback",
        # it swaps the running program (destructive); a second call goes back again (to the version just left)
        hints=Hints("Roll a service back to its previous version", destructive=True),
        long=True,
        agent=_agent_start,
        mcp_description="Go back to the program the service ran before (as recorded when it ran, not what the "
        "catalog holds now), its state kept: health-gated as an upgrade when it runs (the running version keeps "
        "serving when the previous one fails its check), a plain start when stopped. Calling it again goes forward "
        "again. Never for a service the user started with secrets (the user's `flakebot rollback NAME`).",
        text=lambda s: (
            f"{s['name']} back to {s['version']} (from {s.get('previous_version')}), healthy on {_listening(s)}"
        ),
        working="rolling {service} back (health-gated)",
    ),
    Command("export", export_service, text=_export_text, exit_code=lambda r: 50 if r.get("problems") else 0),
    Command(
        "request",
        service_request,
        mcp="service_request",
        hints=Hints("Send an HTTP request to a service", destructive=True),
        doors=frozenset({"mcp", "api"}),
    ),
]
