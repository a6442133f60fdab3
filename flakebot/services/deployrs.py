"""`export NAME --deploy-rs`: a deploy-rs node (deploy.nodes.HOST with a NixOS system profile made by
deploy-rs.lib.<system>.activate.nixos) and the NixOS configuration it activates, importing the service flake's
nixosModules.default.

The check here has neither deploy-rs nor NixOS: it evaluates the written file with `nix eval` against the real
catalogued flake's nixosModules.default and stand-ins for nixpkgs.lib.nixosSystem (templates/standin/nixos.nix's
module system) and deploy-rs.lib (activate.nixos gives the evaluated configuration's systemd services), checks the
node's settings against the names deploy-rs' schema knows, and runs `systemd-analyze verify` on the service's unit
from the node's profile. What only deploy-rs and a NixOS host confirm: the system closure built with real nixpkgs,
its copy over SSH, activation, and the magic rollback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import UsageError
from flakebot.nix import command
from flakebot.services import nixos
from flakebot.services.declaration import ServiceSpec
from flakebot.services.exportfiles import ExportDir

HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9][A-Za-z0-9-]{0,62})*")
# deploy-rs' interface.json: generic settings (node and profile level), node and profile keys.
GENERIC = {"sshUser", "user", "sshOpts", "fastConnection", "autoRollback", "magicRollback", "confirmTimeout",
           "activationTimeout", "tempPath", "interactiveSudo", "remoteBuild", "sudo"}  # fmt: skip
NODE = GENERIC | {"hostname", "profilesOrder", "profiles"}
PROFILE = GENERIC | {"path", "profilePath"}

STAND_INS = """
  system = "{system}";
  nixosModules = import {modules};
  nixpkgs = {{ lib.nixosSystem = {{ system, modules, ... }}: nixosModules.evalModules {{
    inherit modules; specialArgs.pkgs = {{ inherit system; stdenv.hostPlatform.system = system; }}; }}; }};
  deploy-rs = {{ lib.{system} = {{
    activate.nixos = base: {{ standIn = "deploy-rs activate.nixos"; systemd = base.config.systemd.services; }};
    deployChecks = deploy: {{ }};
  }}; }};
"""


def host_attr(host: str) -> str:
    """The node's attribute name: the host with dots made dashes (deploy's `.#NODE.PROFILE` splits at dots)."""
    if not HOST.fullmatch(host) or len(host) > 253:
        raise UsageError(f"'{host}' is not a host name", fix="pass --host NAME (letters, digits, '-' and '.')")
    return host.replace(".", "-")


def deploy_text(manifest: dict[str, Any], host: str, *, network: bool = False) -> str:
    from flakebot.render import render

    name = manifest["name"]
    needs = ServiceSpec.from_dict(manifest["service"]).needs
    return render("deploy-rs.nix.j2", name=name, unit=nixos.unit_name(name), host=host, host_attr=host_attr(host),
                  network=network, needs=needs)  # fmt: skip


def evaluate(
    deploy_file: Path,
    manifest: dict[str, Any],
    host: str,
    settings: Settings,
    timeout: float = 120,
    needed: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The node as `nix eval` computes it: the written file applied to the catalogued flake's module and the
    stand-ins (nixpkgs.lib.nixosSystem, deploy-rs.lib); the services it needs (`needed`: name -> port) as a host
    module defining what their modules would."""
    flake, mode, standin = catalogued_flake(manifest, settings)
    stand_ins = STAND_INS.format(modules=json.dumps(str(nixos.modules_stand_in())), system=command.nix_system())
    apply = (
        f"serviceModule: let {stand_ins} deployment = import {json.dumps(str(deploy_file.resolve()))} {{ "
        f"self = deployment; inherit nixpkgs deploy-rs system; service.nixosModules.default = serviceModule; "
        f"hostModules = [ {nixos.needed_modules(needed)} ]; }}; "
        f"in deployment.deploy.nodes.{host_attr(host)}"
    )
    node: dict[str, Any] = nixos.eval_json(
        ["--impure", "--json", f"{flake}#nixosModules.default", "--apply", apply], mode, standin, timeout
    )
    return node


def catalogued_flake(manifest: dict[str, Any], settings: Settings) -> tuple[str, str, Path | None]:
    """(flake, nixpkgs mode, stand-in) of the catalogued service's flake, as its `nix run` command names them (the
    stand-in rendered again when the cache was cleaned)."""
    if manifest.get("nixpkgs_mode") == "host":
        from flakebot.nix.standin import ensure_standin

        ensure_standin(settings)
    return command.run_target(list(manifest["nix_run_argv"]))


def check_node(node: dict[str, Any], manifest: dict[str, Any], host: str) -> tuple[list[str], str]:
    """Problems with the evaluated node (unknown settings, the profile, the service's unit) and the unit text."""
    node_name = host_attr(host)
    problems = [f"deploy.nodes.{node_name}.{key} is not a deploy-rs setting" for key in sorted(set(node) - NODE)]
    if node.get("hostname") != host:
        problems.append(f"deploy.nodes.{node_name}.hostname is {node.get('hostname')!r}")
    profile = (node.get("profiles") or {}).get("system") or {}
    problems += [f"profile system: {key} is not a deploy-rs setting" for key in sorted(set(profile) - PROFILE)]
    path = profile.get("path") or {}
    unit_name = nixos.unit_name(manifest["name"])
    service = (path.get("systemd") or {}).get(unit_name)
    if service is None:
        return [*problems, f"the activated configuration has no systemd service {unit_name}"], ""
    unit = nixos.unit_file(service)
    if f"ExecStart={manifest['store_path']}/bin/{manifest['main_program']}" not in unit.splitlines():
        problems.append("the activated service does not run the catalogued store path")
    verify_problems, _ = nixos.verify(unit, manifest["name"], needs=ServiceSpec.from_dict(manifest["service"]).needs)
    return problems + verify_problems, unit


def export_deploy_rs(
    manifest: dict[str, Any],
    target: ExportDir,
    host: str,
    settings: Settings,
    *,
    run_check: bool = True,
    network: bool = False,
    needed: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Write flakebot-NAME-deploy.nix (and the module, flakebot-NAME.nix, for a configuration without the flake)
    into `target` and check the node. `network`: the node turns the service's outboundNetwork on."""
    ServiceSpec.from_dict(manifest["service"])
    unit = nixos.unit_name(manifest["name"])
    files = {
        f"{unit}-deploy.nix": deploy_text(manifest, host, network=network),
        f"{unit}.nix": nixos.module_text(manifest, network=network),
    }
    deploy_file, module = target.write_text(files)
    result: dict[str, Any] = {
        "deploy": str(deploy_file),
        "module": str(module),
        "host": host,
        "node": host_attr(host),
        "checked": run_check,
        "network": network,
        "needs": sorted(needed or {}),
    }
    if run_check:
        node = evaluate(deploy_file, manifest, host, settings, needed=needed)
        problems, unit_text = check_node(node, manifest, host)
        result.update(problems=problems, unit=unit_text, settings={k: v for k, v in node.items() if k != "profiles"})
    return result
