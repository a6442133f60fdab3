"""A catalogued service as a NixOS module, and the check this machine can give it.

The module declares `services.flakebot-NAME` as a nixpkgs module user expects it (enable, package, listenAddress,
port, openFirewall, credentialFiles -> LoadCredential, outboundNetwork and allowedAddresses) and a systemd service
from the same declaration the supervisor runs: DynamicUser, StateDirectory (systemd sets $STATE_DIRECTORY),
Restart=on-failure with the restart limit, TimeoutStopSec from the stop grace, and hardening that keeps what
flakebot's sandbox keeps (no capabilities; no outbound network unless exported with --network: IPAddressDeny=any,
IPAddressAllow=localhost). The check evaluates the module text itself with `nix eval` against a small stand-in for
nixpkgs' `lib` (mkOption, mkIf, ...), renders the unit file NixOS would write, and runs `systemd-analyze verify` on
it, plus `systemd-analyze security --offline=true` for a score. What only a NixOS host confirms: the module under
the real module system.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.errors import NixError, UsageError
from flakebot.nix import command, service_outputs
from flakebot.render import template_dir
from flakebot.services.declaration import ServiceSpec
from flakebot.services.exportfiles import ExportDir

# The user's own definitions the check adds: the service enabled, a package, and a credential (credentialFiles, as a
# configuration passes secrets; the module makes it this LoadCredential entry).
CHECK_CREDENTIAL = "token:/run/keys/flakebot-check-token"


@dataclass(frozen=True)
class Verified:
    unit_name: str
    unit: str  # the unit file NixOS would write
    socket: str  # its socket unit ("" : none; a `socket: handoff` service has one)
    problems: list[str]  # systemd-analyze verify's complaints ([] : it passed)
    exposure: str  # systemd-analyze security's overall line


def unit_name(name: str) -> str:
    return service_outputs.unit_name(name)


def module_text(manifest: dict[str, Any], *, network: bool = False) -> str:
    """The NixOS module for catalogued service `manifest` (its package is an option: the flake's package); the
    same text as the flake's nixosModules.default imports (flakebot.nix.service_outputs). `network`: its
    outboundNetwork option defaults to on (export --network)."""
    ServiceSpec.from_dict(manifest["service"])  # a malformed declaration fails here, before any text
    return service_outputs.module_text(manifest["name"], manifest["service"], network=network)


def modules_stand_in() -> Path:
    """The stand-in for nixpkgs' lib and NixOS's module system (templates/standin/nixos.nix)."""
    return template_dir() / "standin" / "nixos.nix"


def _user_module(unit: str, port: int, package: str | None, options: dict[str, Any] | None = None) -> str:
    """The definitions a NixOS configuration would make: enable, port, a credential, the package (when given) and
    any other `options` of services.UNIT (JSON values, read by builtins.fromJSON)."""
    key, _, file = CHECK_CREDENTIAL.partition(":")
    given = {"enable": True, "port": port, "credentialFiles": {key: file}, **(options or {})}
    package_set = f"{{ package = {package}; }}" if package else "{ }"
    return f"{{ services.{json.dumps(unit)} = builtins.fromJSON {json.dumps(json.dumps(given))} // {package_set}; }}"


def needed_modules(needed: dict[str, int] | None) -> str:
    """The definitions the modules of the services it needs would make (their listenAddress and port), as Nix
    modules in a list's text: what the dependent's module reads of them."""
    return "".join(
        f' {{ services.{json.dumps(unit_name(name))} = {{ listenAddress = "127.0.0.1"; port = {int(port)}; }}; }}'
        for name, port in (needed or {}).items()
    )


def _evaluated(unit: str, modules: str, attribute: str = "") -> str:
    """A Nix function of the module under test: its systemd.services entry (or `attribute` of the configuration)
    evaluated with the stand-in."""
    lib = json.dumps(str(modules_stand_in()))
    return (
        f"module: ((import {lib}).evalModules {{ modules = [ module {modules} ]; "
        f'specialArgs.pkgs = {{ system = "{command.nix_system()}"; stdenv.hostPlatform.system = "{command.nix_system()}"; }}; }})'
        f".config.{attribute or f'systemd.services.{json.dumps(unit)}'}"
    )


def evaluate(
    module: Path,
    name: str,
    store_path: str,
    port: int,
    program: str = "",
    timeout: float = 60,
    *,
    options: dict[str, Any] | None = None,
    attribute: str = "",
    needed: dict[str, int] | None = None,
) -> Any:
    """The module's systemd.services entry (or `attribute` of the configuration, e.g.
    networking.firewall.allowedTCPPorts) as `nix eval` computes it with the service enabled, its package the
    catalogued store path (with meta.mainProgram, as a flake's package has it) and `options` set; `needed` (name ->
    port): the services it needs, as their own modules define them (on loopback, at their declared port)."""
    unit = unit_name(name)
    package = (
        f'{{ type = "derivation"; outPath = {json.dumps(store_path)}; '
        f"meta.mainProgram = {json.dumps(program or name)}; }}"
    )
    evaluated = _evaluated(unit, _user_module(unit, port, package, options) + needed_modules(needed), attribute)
    expr = f"({evaluated}) (import {json.dumps(str(module.resolve()))})"
    return eval_json(["--impure", "--json", "--expr", expr], "pinned", None, timeout)


def evaluate_flake(
    flake: str, mode: str, standin: Path | None, name: str, port: int, timeout: float = 120
) -> dict[str, Any]:
    """The flake's nixosModules.default evaluated the same way, its package left to the module's default (the
    flake's own packages.<system>.default)."""
    unit = unit_name(name)
    apply = _evaluated(unit, _user_module(unit, port, None))
    service: dict[str, Any] = eval_json(
        ["--impure", "--json", f"{flake}#nixosModules.default", "--apply", apply], mode, standin, timeout
    )
    return service


def eval_json(args: list[str], mode: str, standin: Path | None, timeout: float) -> Any:
    # through nix_argv, as every nix call that could build: the build users and Nix's sandbox
    argv = command.nix_argv(["eval"], args, mode, standin)
    done = launcher.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        error = _first_error(done.stderr)
        old_flake = "does not provide attribute" in error and "nixosModules" in error
        raise NixError(
            f"nix eval of the NixOS module failed: {error}",
            fix="package the service again (its flake predates nixosModules.default): flakebot package-service PATH"
            if old_flake
            else "report it: the module flakebot wrote does not evaluate",
        )
    return json.loads(done.stdout)


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("error:")), lines[0] if lines else "no output")


def unit_file(service: dict[str, Any]) -> str:
    """The unit file NixOS writes for a systemd.services entry (the options this module sets)."""
    unit = [f"Description={service['description']}", *(f"After={a}" for a in service.get("after", []))]
    unit += [f"Requires={r}" for r in service.get("requires", [])]
    unit += [
        f"StartLimitIntervalSec={service['startLimitIntervalSec']}",
        f"StartLimitBurst={service['startLimitBurst']}",
    ]
    body = [f'Environment="{key}={value}"' for key, value in sorted(service.get("environment", {}).items())]
    for key, value in service["serviceConfig"].items():
        values = value if isinstance(value, list) else [value]
        body += [f"{key}={_unit_value(v)}" for v in values]
    install = [f"WantedBy={w}" for w in service.get("wantedBy", [])]
    return "\n".join(["[Unit]", *unit, "", "[Service]", *body, "", "[Install]", *install, ""])


def socket_file(socket: dict[str, Any]) -> str:
    """The socket unit NixOS writes for a systemd.sockets entry (the options this module sets)."""
    body = [f"ListenStream={stream}" for stream in socket.get("listenStreams", [])]
    for key, value in socket.get("socketConfig", {}).items():
        body += [f"{key}={_unit_value(v)}" for v in (value if isinstance(value, list) else [value])]
    install = [f"WantedBy={w}" for w in socket.get("wantedBy", [])]
    return "\n".join(["[Unit]", f"Description={socket['description']}", "", "[Socket]", *body, "", "[Install]",
                      *install, ""])  # fmt: skip


def _unit_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def verify(
    unit: str, name: str, timeout: float = 60, needs: tuple[str, ...] = (), socket: str = ""
) -> tuple[list[str], str]:
    """systemd-analyze verify's complaints about the unit ([] when none) and security's overall exposure line.
    `needs`: the services its unit requires, present as units of their own (each verified by its own export);
    `socket`: its socket unit's text (a `socket: handoff` service), verified beside it."""
    program = shutil.which("systemd-analyze")
    if program is None:
        raise UsageError(
            "systemd-analyze is not installed: the module cannot be checked here", fix="apt-get install systemd"
        )
    with tempfile.TemporaryDirectory(prefix="flakebot-unit-") as tmp:
        path = Path(tmp) / f"{unit_name(name)}.service"
        path.write_text(unit)
        if socket:
            path.with_suffix(".socket").write_text(socket)
        for need in needs:
            (Path(tmp) / f"{unit_name(need)}.service").write_text(f"[Service]\nExecStart={program}\n")
        # a host program: the host's variables (never the team database's URL or a model key), the unit path after them
        found = launcher.host_env({"SYSTEMD_UNIT_PATH": f"{tmp}:"})  # and the default paths after it
        done = launcher.run([program, "verify", str(path)], capture_output=True, text=True, timeout=timeout, env=found)
        problems = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        if done.returncode != 0 and not problems:
            problems = [f"systemd-analyze verify exited {done.returncode}"]
        security = launcher.run(
            [program, "security", "--offline=true", str(path)], capture_output=True, text=True, timeout=timeout
        )
        overall = [line for line in security.stdout.splitlines() if "Overall exposure" in line]
    return problems, (overall[-1].lstrip("→ ").strip() if overall else "")


def check(module: Path, manifest: dict[str, Any], needed: dict[str, int] | None = None) -> Verified:
    """Evaluate the module (beside the services it needs, `needed`: name -> port), render its unit and verify it."""
    spec = ServiceSpec.from_dict(manifest["service"])
    service: dict[str, Any] = evaluate(
        module, manifest["name"], manifest["store_path"], spec.port, manifest.get("main_program", ""), needed=needed
    )
    unit = unit_file(service)
    socket = ""
    if spec.socket == "handoff":
        attribute = f"systemd.sockets.{json.dumps(unit_name(manifest['name']))}"
        socket = socket_file(
            evaluate(
                module,
                manifest["name"],
                manifest["store_path"],
                spec.port,
                manifest.get("main_program", ""),
                needed=needed,
                attribute=attribute,
            )  # fmt: skip
        )
    problems, exposure = verify(unit, manifest["name"], needs=tuple(needed or {}), socket=socket)
    return Verified(unit_name(manifest["name"]), unit, socket, problems, exposure)


def export_nixos(
    manifest: dict[str, Any],
    target: ExportDir,
    *,
    run_check: bool = True,
    network: bool = False,
    needed: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Write the module into `target` as flakebot-NAME.nix and check it; what was written, the check's verdict,
    and the NixOS configuration lines that use it. An existing file is replaced only when `target` was opened with
    force. `network`: the service's outbound network is on by default (export --network); `needed`: the services
    it needs (name -> port), whose modules a configuration imports beside it."""
    unit = unit_name(manifest["name"])
    [module] = target.write_text({f"{unit}.nix": module_text(manifest, network=network)})
    result: dict[str, Any] = {
        "module": str(module),
        "configuration": configuration_lines(manifest["name"], f"./{module.name}", needed),
        "checked": run_check,
        "network": network,
        "needs": sorted(needed or {}),
    }
    if run_check:
        verified = check(module, manifest, needed)
        result.update(unit=verified.unit, problems=verified.problems, exposure=verified.exposure)
        if verified.socket:
            result["socket"] = verified.socket
    return result


def configuration_lines(name: str, module: str, needed: dict[str, int] | None = None) -> str:
    """The NixOS configuration lines that import the module and run the service from its flake (input NAME), and
    the same for each service it needs (their modules: `flakebot export NEED --nixos`)."""
    services = [(name, module), *((need, f"./{unit_name(need)}.nix") for need in needed or {})]
    lines = [f"imports = [ {' '.join(path for _, path in services)} ];"]
    for service, _ in services:
        unit = unit_name(service)
        lines += [
            f"services.{unit}.enable = true;",
            f'services.{unit}.package = inputs."{service}".packages.${{pkgs.system}}.default;',
        ]
    return "\n".join(lines)
