"""A catalogued service as a NixOS module, and the check this machine can give it (no systemd as PID 1 here).

The module declares `services.flakebot-NAME` (enable, package, port) and a systemd service from the same
declaration the supervisor runs: DynamicUser, StateDirectory (systemd sets $STATE_DIRECTORY), Restart=on-failure
with the restart limit, TimeoutStopSec from the stop grace, and hardening that keeps what flakebot's sandbox keeps
(no capabilities, no outbound network: IPAddressAllow=localhost). The check evaluates the module text itself with
`nix eval` against a small stand-in for nixpkgs' `lib` (mkOption, mkIf, ...), renders the unit file NixOS would
write, and runs `systemd-analyze verify` on it, plus `systemd-analyze security --offline=true` for a score.
What only a NixOS host confirms: the module under the real module system, and the service started by systemd.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot.errors import NixError, UsageError
from flakebot.nix import command
from flakebot.services.declaration import ServiceSpec

HARDENING: dict[str, Any] = {
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "NoNewPrivileges": True,
    "PrivateTmp": True,
    "PrivateDevices": True,
    "PrivateUsers": True,
    "ProtectSystem": "strict",
    "ProtectHome": True,
    "ProtectKernelTunables": True,
    "ProtectKernelModules": True,
    "ProtectKernelLogs": True,
    "ProtectControlGroups": True,
    "ProtectClock": True,
    "ProtectHostname": True,
    "ProtectProc": "invisible",
    "ProcSubset": "pid",
    "RestrictNamespaces": True,
    "RestrictRealtime": True,
    "RestrictSUIDSGID": True,
    "LockPersonality": True,
    "MemoryDenyWriteExecute": True,
    "SystemCallArchitectures": "native",
    "SystemCallFilter": ["@system-service", "~@privileged @resources"],
    "RestrictAddressFamilies": ["AF_INET", "AF_INET6"],
    "IPAddressDeny": "any",
    "IPAddressAllow": "localhost",  # as under flakebot's supervisor: no outbound network
    "DevicePolicy": "closed",
    "UMask": "0077",
}

# Just enough of nixpkgs' lib for a module that declares options and sets config under mkIf.
LIB_STUB = """{
  mkEnableOption = description: { default = false; inherit description; };
  mkOption = option: option;
  mkIf = condition: value: if condition then value else { };
  types = { package = "package"; port = "port"; };
}"""


@dataclass(frozen=True)
class Verified:
    unit_name: str
    unit: str  # the unit file NixOS would write
    problems: list[str]  # systemd-analyze verify's complaints ([] : it passed)
    exposure: str  # systemd-analyze security's overall line


def unit_name(name: str) -> str:
    return f"flakebot-{name}"


def module_text(manifest: dict[str, Any]) -> str:
    """The NixOS module for catalogued service `manifest` (its package is an option: the flake's package)."""
    spec = ServiceSpec.from_dict(manifest["service"])
    name, program = manifest["name"], manifest["main_program"]
    for value in (name, program):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise UsageError(f"'{value}' cannot be named in a NixOS module", fix="catalog it under a plain name")
    unit = unit_name(name)
    restart = spec.restart
    service_config = {
        "DynamicUser": True,
        "StateDirectory": unit,
        "Restart": "on-failure",
        "RestartSec": max(1, round(restart.backoff_s)),
        "TimeoutStopSec": max(1, round(spec.stop_grace_s)),
        "KillMode": "mixed",  # SIGTERM to the main process (the service itself), SIGKILL to all after the timeout
        **HARDENING,
    }
    lines = [f"        {key} = {_nix(value)};" for key, value in service_config.items()]
    return f"""# NixOS module for the flakebot service {name}: import it, then set services.{unit}.enable and .package.
{{ config, lib, ... }}:
let
  cfg = config.services.{unit};
in
{{
  options.services.{unit} = {{
    enable = lib.mkEnableOption "the flakebot service {name}";
    package = lib.mkOption {{ type = lib.types.package; description = "The service's flake package (packages.<system>.default)."; }};
    port = lib.mkOption {{ type = lib.types.port; default = {spec.port}; description = "The port it listens on."; }};
  }};
  config = lib.mkIf cfg.enable {{
    systemd.services.{unit} = {{
      description = "flakebot service {name}";
      wantedBy = [ "multi-user.target" ];
      after = [ "network.target" ];
      environment.{spec.port_env} = toString cfg.port;
      startLimitIntervalSec = {round(restart.window_s)};
      startLimitBurst = {restart.limit};
      serviceConfig = {{
        ExecStart = "${{cfg.package}}/bin/{program}";
{chr(10).join(lines)}
      }};
    }};
  }};
}}
"""


def _nix(value: Any) -> str:
    """A Nix literal for a unit setting (bool, int, string or list of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[ " + " ".join(_nix(v) for v in value) + " ]"
    return json.dumps(str(value)).replace("${", "\\${")  # a JSON string is a Nix string once ${ is escaped


def evaluate(module: Path, name: str, store_path: str, port: int, timeout: float = 60) -> dict[str, Any]:
    """The module's systemd.services entry as `nix eval` computes it with the service enabled."""
    unit = unit_name(name)
    expr = (
        f"let lib = {LIB_STUB}; evaluated = import {json.dumps(str(module.resolve()))} {{ inherit lib; "
        f'config.services."{unit}" = {{ enable = true; package = {json.dumps(store_path)}; port = {port}; }}; }}; '
        f'in evaluated.config.systemd.services."{unit}"'
    )
    # through nix_argv, as every nix call that could build: the build users and Nix's sandbox, no stand-in override
    argv = command.nix_argv(["eval"], ["--impure", "--json", "--expr", expr], "pinned", None)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise NixError(
            f"nix eval of the NixOS module failed: {_first_error(done.stderr)}",
            fix="report it: the module flakebot wrote does not evaluate",
        )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _first_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("error:")), lines[0] if lines else "no output")


def unit_file(service: dict[str, Any]) -> str:
    """The unit file NixOS writes for a systemd.services entry (the options this module sets)."""
    unit = [f"Description={service['description']}", *(f"After={a}" for a in service.get("after", []))]
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


def _unit_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def verify(unit: str, name: str, timeout: float = 60) -> tuple[list[str], str]:
    """systemd-analyze verify's complaints about the unit ([] when none) and security's overall exposure line."""
    program = shutil.which("systemd-analyze")
    if program is None:
        raise UsageError(
            "systemd-analyze is not installed: the module cannot be checked here", fix="apt-get install systemd"
        )
    with tempfile.TemporaryDirectory(prefix="flakebot-unit-") as tmp:
        path = Path(tmp) / f"{unit_name(name)}.service"
        path.write_text(unit)
        done = subprocess.run([program, "verify", str(path)], capture_output=True, text=True, timeout=timeout)
        problems = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        if done.returncode != 0 and not problems:
            problems = [f"systemd-analyze verify exited {done.returncode}"]
        security = subprocess.run(
            [program, "security", "--offline=true", str(path)], capture_output=True, text=True, timeout=timeout
        )
        overall = [line for line in security.stdout.splitlines() if "Overall exposure" in line]
    return problems, (overall[-1].lstrip("→ ").strip() if overall else "")


def check(module: Path, manifest: dict[str, Any]) -> Verified:
    """Evaluate the module, render its unit and verify it."""
    spec = ServiceSpec.from_dict(manifest["service"])
    service = evaluate(module, manifest["name"], manifest["store_path"], spec.port)
    unit = unit_file(service)
    problems, exposure = verify(unit, manifest["name"])
    return Verified(unit_name(manifest["name"]), unit, problems, exposure)


def export_nixos(manifest: dict[str, Any], out_dir: Path, *, run_check: bool = True) -> dict[str, Any]:
    """Write the module into `out_dir` (made if missing) as flakebot-NAME.nix and check it; what was written, the
    check's verdict, and the NixOS configuration lines that use it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    module = out_dir / f"{unit_name(manifest['name'])}.nix"
    module.write_text(module_text(manifest))
    unit = unit_name(manifest["name"])
    result: dict[str, Any] = {
        "module": str(module),
        "configuration": (
            f"imports = [ ./{module.name} ];\n"
            f"services.{unit}.enable = true;\n"
            f"services.{unit}.package = inputs.{manifest['name']}.packages.${{pkgs.system}}.default;"
        ),
        "checked": run_check,
    }
    if run_check:
        verified = check(module, manifest)
        result.update(unit=verified.unit, problems=verified.problems, exposure=verified.exposure)
    return result
