"""The service commands: package-service, up, services, logs, down, restart, rollback, export (registered on the app
by register())."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for programs instead of text.")]


def register(app: typer.Typer, settings: Any) -> None:
    """Add the service commands to `app`; `settings()` gives the loaded settings (the app's globals)."""

    @app.command("package-service")
    def package_service_cmd(
        target: Annotated[str, typer.Argument(help="A crate directory (PATH) or a crate name from the registry.")],
        port: Annotated[int, typer.Option(help="The port it listens on inside its own network namespace.")] = 8080,
        port_env: Annotated[str, typer.Option(help="The environment variable that tells it the port.")] = "PORT",
        health: Annotated[str, typer.Option(help="Health check: an HTTP path answering 2xx, or 'tcp'.")] = "/health",
        stop_grace: Annotated[float, typer.Option(help="Seconds from SIGTERM to SIGKILL when it stops.")] = 10.0,
        start_timeout: Annotated[float, typer.Option(help="Seconds a start may take to become healthy.")] = 30.0,
        name: Annotated[str | None, typer.Option(help="Catalog name (default: the binary's).")] = None,
        bin_name: Annotated[str | None, typer.Option("--bin", help="The binary, when the crate has several.")] = None,
        offline: Annotated[bool | None, typer.Option("--offline/--online", help="Local registry only.")] = None,
        examples: Annotated[
            str | None,
            typer.Option(help='Requests to check: JSON {"first": [...], "after_restart": [...]} (docs/services.md).'),
        ] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Package a crate as a flake (nix build, smoke run), check its lifecycle (health, examples, SIGTERM, state
        kept over a restart) and catalog it as a service for 'flakebot up'."""
        from pathlib import Path

        from flakebot.commands.package_service import package_service
        from flakebot.services.declaration import Health, ServiceSpec
        from flakebot.services.lifecycle import Examples

        spec = ServiceSpec(port=port, port_env=port_env, health=Health.parse(health), stop_grace_s=stop_grace,
                           start_s=start_timeout)  # fmt: skip
        cases = Examples.load(Path(examples)) if examples else None
        overrides = {"offline": offline} if offline is not None else {}
        entry = package_service(
            target, spec, settings(), name=name, bin_name=bin_name, overrides=overrides, examples=cases
        )
        _say(as_json, entry, f"catalogued service {entry['name']} {entry['version']}: {entry['store_path']}\n"
             f"start it: flakebot up {entry['name']}")  # fmt: skip

    @app.command("up")
    def up_cmd(
        service: Annotated[str | None, typer.Argument(help="A catalogued service: NAME or NAME@VERSION.")] = None,
        port: Annotated[int | None, typer.Option(help="Host port on 127.0.0.1 (default: a free one).")] = None,
        every: Annotated[
            bool, typer.Option("--all", help="Start again every service that was up when its supervisor went away.")
        ] = False,
        secret: Annotated[
            list[str] | None,
            typer.Option(help="KEY=FILE: the file's content as $CREDENTIALS_DIRECTORY/KEY, read-only (repeatable)."),
        ] = None,
        network: Annotated[
            bool,
            typer.Option(
                "--network",
                help="Let it reach the outside (never the host's 127.0.0.1); kept by restart, upgrade and --all.",
            ),
        ] = False,
        replace: Annotated[
            bool,
            typer.Option(
                "--replace",
                help="Start the catalog's program although the service last ran another one with secrets.",
            ),
        ] = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Start a service under its own supervisor, sandboxed, its port on 127.0.0.1; returns once it is healthy.
        NAME@VERSION while another version runs upgrades it: checked on a copy of its state first, never replacing
        the running version when it fails (exit 43). The program started is recorded: restart, --all and rollback
        run that program, whatever the catalog's name means later."""
        from flakebot.errors import UsageError
        from flakebot.services.control import up, up_all

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
            restored = up_all(settings())
            lines = [f"{r['name']}: {r.get('error') or 'healthy on 127.0.0.1:' + str(r['port'])}" for r in restored]
            _say(as_json, {"services": restored}, "\n".join(lines) or "nothing to start again")
            if any("error" in r for r in restored):
                raise typer.Exit(40)
            return
        assert service is not None
        from pathlib import Path

        from flakebot.services import credentials

        secrets = credentials.parse(list(secret or []), Path.cwd())
        with _working(as_json, f"starting {service} (health-gated)", service, settings):
            status = up(service, settings(), port=port, secrets=secrets, network=network, replace=replace)
        was = f", previous version {status['previous_version']}" if status.get("previous_version") else ""
        net = "outbound network" if status.get("network") else "no network"
        _say(as_json, status, f"{status['name']} {status['version']} healthy on http://127.0.0.1:{status['port']} "
             f"(state: {status['state_dir']}{was}; {net})")  # fmt: skip

    @app.command("services")
    def services_cmd(as_json: JsonOpt = False) -> None:
        """List services started here: state, port, health, restarts, uptime, outbound network."""
        from flakebot.services.control import statuses

        found = statuses(settings())
        if as_json:
            _say(True, {"services": found}, "")
            return
        from flakebot.cli.display import print_services
        from flakebot.cli.live import out

        if not found:
            out.print("No services: start one with 'flakebot up NAME'.")
            return
        print_services(found)

    @app.command("logs")
    def logs_cmd(
        service: Annotated[str, typer.Argument(help="A service's name.")],
        lines: Annotated[int, typer.Option("--lines", "-n", help="How many of the last lines.")] = 50,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")] = False,
    ) -> None:
        """Print a service's log (its output and the supervisor's notes), redacted."""
        from flakebot.services import control

        for line in control.logs(service, settings(), lines=lines):
            typer.echo(line)
        if follow:
            try:
                for line in control.follow(service, settings()):
                    typer.echo(line)
            except KeyboardInterrupt:
                return

    @app.command("down")
    def down_cmd(service: Annotated[str, typer.Argument(help="A service's name.")], as_json: JsonOpt = False) -> None:
        """Stop a service: SIGTERM, SIGKILL after its grace period; nothing left running, its port freed."""
        from flakebot.services.control import down

        with _working(as_json, f"stopping {service}", service, settings):
            status = down(service, settings())
        _say(as_json, status, f"{status['name']} {status['state']}; state kept in {status.get('state_dir')}")

    @app.command("restart")
    def restart_cmd(
        service: Annotated[str, typer.Argument(help="A service's name.")], as_json: JsonOpt = False
    ) -> None:
        """Stop a service and start it again: the same version, port, secrets, network and state."""
        from flakebot.services.control import restart

        with _working(as_json, f"restarting {service}", service, settings):
            status = restart(service, settings())
        _say(
            as_json, status, f"{status['name']} {status['version']} healthy again on http://127.0.0.1:{status['port']}"
        )

    @app.command("rollback")
    def rollback_cmd(
        service: Annotated[str, typer.Argument(help="A service's name.")], as_json: JsonOpt = False
    ) -> None:
        """Go back to the version the service ran before, its state kept (health-gated as an upgrade)."""
        from flakebot.services.control import rollback

        with _working(as_json, f"rolling {service} back (health-gated)", service, settings):
            status = rollback(service, settings())
        _say(as_json, status, f"{status['name']} back to {status['version']} (from {status.get('previous_version')}), "
             f"healthy on http://127.0.0.1:{status['port']}")  # fmt: skip

    @app.command("export")
    def export_cmd(
        service: Annotated[str, typer.Argument(help="A catalogued service: NAME or NAME@VERSION.")],
        nixos: Annotated[bool, typer.Option("--nixos", help="A NixOS module (checked with systemd-analyze).")] = False,
        oci: Annotated[bool, typer.Option("--oci", help="An OCI image layout (nixpkgs' dockerTools).")] = False,
        deploy_rs: Annotated[
            bool, typer.Option("--deploy-rs", help="A deploy-rs node and the NixOS configuration it activates.")
        ] = False,
        out: Annotated[str, typer.Option("--out", "-o", help="Directory to write into (made when missing).")] = ".",
        host: Annotated[str, typer.Option(help="--deploy-rs: the node's host name.")] = "server",
        force: Annotated[bool, typer.Option("--force", help="Replace files an earlier export wrote.")] = False,
        run_check: Annotated[
            bool, typer.Option("--check/--no-check", help="nix eval what was written, systemd-analyze verify units.")
        ] = True,
        as_json: JsonOpt = False,
    ) -> None:
        """Write what another engine takes to run the service: --nixos (a NixOS module), --oci (an OCI image
        layout), --deploy-rs (a deploy-rs node); each checked here as far as this machine can (docs/services.md)."""
        from pathlib import Path

        from flakebot.errors import UsageError
        from flakebot.services.export import TARGETS, export_service

        chosen = [target for target, given in zip(TARGETS, (nixos, oci, deploy_rs), strict=True) if given]
        if len(chosen) != 1:
            raise UsageError(
                "say what to export, one at a time", fix=f"flakebot export {service} --nixos|--oci|--deploy-rs"
            )
        result = export_service(service, chosen[0], Path(out), settings(), host=host, force=force, run_check=run_check)
        _say(as_json, result, _export_text(result, run_check))
        if result.get("problems"):
            raise typer.Exit(50)


def _export_text(result: dict[str, Any], run_check: bool) -> str:
    if result["target"] == "oci":
        note = "" if result["portable"] else "\n(built with the host stand-in: it runs on this machine only)"
        return (
            f"wrote {result['layout']} (tag {result['tag']}, {result['layers']} layers, user {result['user']}){note}"
            f"\nunpack it: umoci unpack --image {result['layout']}:{result['tag']} BUNDLE"
        )
    problems = result.get("problems") or []
    verdict = "not checked" if not run_check else ("; ".join(problems) or "systemd-analyze verify: passed")
    if result["target"] == "nixos":
        return (
            f"wrote {result['module']}\n{verdict}\n{result.get('exposure', '')}\n"
            f"in your NixOS configuration:\n{result['configuration']}"
        )
    return (
        f"wrote {result['deploy']}\nwrote {result['module']}\n{verdict} (evaluated with stand-ins for nixosSystem and"
        " deploy-rs: only deploy-rs on a NixOS host confirms activation and rollback)\n"
        f"use it from your deployment flake as its first lines say; then: deploy .#{result['node']}"
    )


@contextmanager
def _working(as_json: bool, text: str, service: str, settings: Any) -> Iterator[None]:
    """A live line on stderr while a service command works (a terminal only); Ctrl-C says where it left the
    service instead of the craft's advice."""
    from flakebot.cli.live import console
    from flakebot.errors import Interrupted

    try:
        if as_json or not console.is_terminal:
            yield
        else:
            with console.status(text):
                yield
    except KeyboardInterrupt:
        from flakebot.services.control import statuses

        name = service.partition("@")[0]
        state = next((s["state"] for s in statuses(settings()) if s["name"] == name), "not started")
        raise Interrupted(
            f"interrupted: {name} is {state}", fix=f"see 'flakebot services'; 'flakebot down {name}' stops it"
        ) from None


def _say(as_json: bool, result: dict[str, Any], text: str) -> None:
    if as_json:
        from flakebot.cli.jsonout import json_result

        json_result(result)
        return
    typer.echo(text)


__all__ = ["register"]
