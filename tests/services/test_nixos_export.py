"""The NixOS module of a service: the module text evaluated by real nix, its unit checked by real systemd-analyze."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from flakebot.errors import NixError
from flakebot.nix import service_outputs
from flakebot.services import deployrs, nixos
from flakebot.services.declaration import ServiceSpec
from flakebot.services.exportfiles import ExportDir
from tests.conftest import require


@pytest.fixture
def manifest(tmp_path: Path) -> dict[str, Any]:
    """A service's manifest whose store path holds a real executable (verify checks ExecStart exists)."""
    require("nix", "systemd-analyze")
    program = tmp_path / "out" / "bin" / "kv-service"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o755)
    spec = ServiceSpec(port=9090, port_env="KV_PORT", stop_grace_s=4)
    return {"name": "kv-service", "main_program": "kv-service", "store_path": str(program.parents[1]),
            "service": spec.to_dict()}  # fmt: skip


def test_the_module_evaluates_to_a_unit_systemd_accepts_and_scores_hardened(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    result = nixos.export_nixos(manifest, ExportDir(tmp_path / "export"))
    assert result["problems"] == []
    unit = result["unit"]
    for line in ('Environment="KV_PORT=9090"', "DynamicUser=true", "StateDirectory=flakebot-kv-service",
                 "Restart=on-failure", "TimeoutStopSec=4", "IPAddressDeny=any", "StartLimitBurst=5",
                 f"ExecStart={manifest['store_path']}/bin/kv-service"):  # fmt: skip
        assert line in unit.splitlines(), line
    assert " OK " in result["exposure"]  # systemd-analyze security --offline: exposure 1.1 of 10


def test_verify_catches_a_broken_module(manifest: dict[str, Any], tmp_path: Path) -> None:
    module = tmp_path / "flakebot-kv-service.nix"
    module.write_text(nixos.module_text(manifest).replace('"on-failure"', '"sometimes"'))
    assert any("restart specifier" in p for p in nixos.check(module, manifest).problems)
    gone = {**manifest, "store_path": str(tmp_path / "collected")}
    assert any("not executable" in p for p in nixos.check(module, gone).problems)
    module.write_text(nixos.module_text(manifest).replace("toString cfg.port", "cfg.nowhere"))
    with pytest.raises(NixError, match="nix eval of the NixOS module failed"):
        nixos.check(module, manifest)


def test_the_module_offers_what_a_nixpkgs_module_user_sets(manifest: dict[str, Any], tmp_path: Path) -> None:
    """listenAddress, port, openFirewall, credentialFiles and allowedAddresses reach the unit and the firewall."""
    module = tmp_path / "flakebot-kv-service.nix"
    module.write_text(nixos.module_text(manifest))
    store, program = manifest["store_path"], manifest["main_program"]
    options = {"listenAddress": "0.0.0.0", "openFirewall": True, "allowedAddresses": ["192.168.1.0/24"],
               "credentialFiles": {"db": "/run/keys/db-password"}}  # fmt: skip
    service = nixos.evaluate(module, "kv-service", store, 9191, program, options=options)
    lines = nixos.unit_file(service).splitlines()
    for line in ('Environment="LISTEN_ADDRESS=0.0.0.0"', 'Environment="KV_PORT=9191"', "IPAddressDeny=any",
                 "IPAddressAllow=192.168.1.0/24", "LoadCredential=db:/run/keys/db-password"):  # fmt: skip
        assert line in lines, line
    assert "IPAddressAllow=localhost" not in lines  # the user's list replaces the default
    assert nixos.verify(nixos.unit_file(service), "kv-service")[0] == []
    firewall = nixos.evaluate(module, "kv-service", store, 9191, program, options=options,
                              attribute="networking.firewall.allowedTCPPorts")  # fmt: skip
    assert firewall == [9191]
    with pytest.raises(NixError, match="allowedTCPPorts' is used but not defined"):  # off: no port opened
        nixos.evaluate(module, "kv-service", store, 9191, program, attribute="networking.firewall.allowedTCPPorts")
    # the defaults: loopback only, no outbound network
    lines = nixos.unit_file(nixos.evaluate(module, "kv-service", store, 9090, program)).splitlines()
    assert {'Environment="LISTEN_ADDRESS=127.0.0.1"', "IPAddressDeny=any", "IPAddressAllow=localhost"} <= set(lines)


def test_every_option_path_the_module_names_is_one_it_declares(manifest: dict[str, Any], tmp_path: Path) -> None:
    module = tmp_path / "flakebot-kv-service.nix"
    text = nixos.module_text(manifest)
    module.write_text(text)
    lib = json.dumps(str(nixos.modules_stand_in()))
    expr = (f'builtins.attrNames ((import {json.dumps(str(module))}) {{ config.services."flakebot-kv-service" = {{ }}; '
            f'lib = import {lib}; }}).options.services."flakebot-kv-service"')  # fmt: skip
    declared = set(nixos.eval_json(["--impure", "--json", "--expr", expr], "pinned", None, 60))
    assert {"enable", "package", "listenAddress", "port", "openFirewall", "credentialFiles"} <= declared
    named = set(re.findall(r"(?<!systemd\.)services\.flakebot-kv-service\.([A-Za-z]+)", text))
    assert named and named <= declared, named - declared  # the old comment named serviceConfig, which is not one
    assert "systemd.services.flakebot-kv-service.serviceConfig.LoadCredential" in text  # the real path of that


@pytest.mark.parametrize("network", [False, True])
def test_outbound_network_is_carried_into_the_module_the_node_and_the_image(
    manifest: dict[str, Any], tmp_path: Path, network: bool
) -> None:
    """Exported with --network: no IP filter in the unit, the node turns it on, the image's label says outbound;
    without: IPAddressDeny=any and the label says none."""
    result = nixos.export_nixos(manifest, ExportDir(tmp_path / "nixos"), network=network)
    assert result["problems"] == [] and result["network"] is network
    lines = result["unit"].splitlines()
    closed = {"IPAddressDeny=any", "IPAddressAllow=localhost"}
    assert (closed & set(lines)) == (set() if network else closed)
    assert not any(line.startswith("PrivateNetwork=") for line in lines)
    text = (tmp_path / "nixos" / "flakebot-kv-service.nix").read_text()
    assert f"default = {'true' if network else 'false'};" in text
    node = deployrs.deploy_text(manifest, "web1", network=network)
    assert ("services.flakebot-kv-service.outboundNetwork = true;" in node) is network
    image = service_outputs.image_text("kv-service", "0.1.0", "kv-service", manifest["service"], network=network)
    assert f'"io.flakebot.network" = "{"outbound" if network else "none"}";' in image
    assert '"LISTEN_ADDRESS=0.0.0.0"' in image


def test_a_service_that_needs_another_starts_after_it_and_finds_it_at_its_url(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    """`needs` reach the unit as systemd orders services (Requires + After) and the URL as flakebot gives it
    (FLAKEBOT_<NAME>_URL), read from the needed service's own module; without that module, one line says what to
    import."""
    needing = {**manifest, "service": ServiceSpec(port=9090, port_env="KV_PORT", needs=("kv-store",)).to_dict()}
    result = nixos.export_nixos(needing, ExportDir(tmp_path / "export"), needed={"kv-store": 7070})
    assert result["problems"] == [] and result["needs"] == ["kv-store"]
    lines = result["unit"].splitlines()
    for line in ('Environment="FLAKEBOT_KV_STORE_URL=http://127.0.0.1:7070"', "After=flakebot-kv-store.service",
                 "Requires=flakebot-kv-store.service"):  # fmt: skip
        assert line in lines, line
    assert "./flakebot-kv-store.nix" in result["configuration"].splitlines()[0]  # one imports line for both
    module = Path(result["module"])
    with pytest.raises(NixError, match=r"needs the flakebot service kv-store: import and enable its module"):
        nixos.evaluate(module, "kv-service", manifest["store_path"], 9090, "kv-service")
    # the user's own URL (another machine's service) is taken as it is
    service = nixos.evaluate(module, "kv-service", manifest["store_path"], 9090, "kv-service",
                             options={"needs": {"kv-store": "http://10.0.0.5:7070"}})  # fmt: skip
    assert service["environment"]["FLAKEBOT_KV_STORE_URL"] == "http://10.0.0.5:7070"
    # a service without needs is the module it was
    plain = nixos.module_text(manifest)
    assert "needs" not in plain and "requires" not in plain


def test_a_handoff_service_gets_its_socket_from_systemd(manifest: dict[str, Any], tmp_path: Path) -> None:
    """`socket: handoff`: a socket unit on the service's address and port, the service requiring it, both verified
    by systemd-analyze; the socket unit carries the service's IP filter (the socket is systemd's)."""
    handoff = {**manifest, "service": ServiceSpec(port=9090, port_env="KV_PORT", socket="handoff").to_dict()}
    result = nixos.export_nixos(handoff, ExportDir(tmp_path / "export"))
    assert result["problems"] == []
    socket = result["socket"].splitlines()
    for line in ("ListenStream=127.0.0.1:9090", "IPAddressDeny=any", "IPAddressAllow=localhost",
                 "WantedBy=sockets.target"):  # fmt: skip
        assert line in socket, line
    unit = result["unit"].splitlines()
    assert "Requires=flakebot-kv-service.socket" in unit and "After=flakebot-kv-service.socket" in unit
    # a configuration's address and port reach the socket, not only the service's variables
    module = Path(result["module"])
    opened = nixos.evaluate(module, "kv-service", manifest["store_path"], 9191, "kv-service",
                            options={"listenAddress": "0.0.0.0", "outboundNetwork": True},
                            attribute='systemd.sockets."flakebot-kv-service"')  # fmt: skip
    assert nixos.socket_file(opened).splitlines()[4:6] == ["ListenStream=0.0.0.0:9191", ""]
    assert "socket" not in nixos.export_nixos(manifest, ExportDir(tmp_path / "pasta"))  # pasta: no socket unit


def test_the_deployment_flake_a_deploy_rs_export_shows_for_a_service_with_needs_parses(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    """The lines a deploy-rs export shows for the user's flake, with what the service needs, are Nix that parses:
    the `needed` set names each needed flake's input, so `outputs` binds them (was `inputs.kv-store`, unbound:
    "undefined variable 'inputs'") and each has its own input line; a name starting with a digit (a service name
    may) is quoted (was a syntax error)."""
    require("nix")
    import subprocess

    for name, need in (("kv-service", "kv-store"), ("9kv", "2db")):
        needing = {
            **manifest,
            "name": name,
            "service": ServiceSpec(port=9090, port_env="KV_PORT", needs=(need,)).to_dict(),
        }
        text = deployrs.deploy_text(needing, "web1")
        header = text.split("In your deployment flake:\n", 1)[1].split("\n#\n# then", 1)[0]
        flake = "{\n" + "\n".join(line.removeprefix("#").strip() for line in header.splitlines()) + "\n}\n"
        (tmp_path / "flake.nix").write_text(flake)
        parsed = subprocess.run(["nix-instantiate", "--parse", str(tmp_path / "flake.nix")], capture_output=True,
                                text=True)  # fmt: skip
        assert parsed.returncode == 0, (flake, parsed.stderr)
        assert f'inputs."{need}".url = "<' in flake, flake


def test_the_configuration_lines_of_an_export_parse_for_names_starting_with_a_digit(tmp_path: Path) -> None:
    """The configuration lines `export --nixos` gives (the service and what it needs, from their flakes' inputs)
    are Nix that parses for any service name, one starting with a digit too (was inputs.9kv: a syntax error)."""
    require("nix")
    import subprocess

    lines = nixos.configuration_lines("9kv", "./flakebot-9kv.nix", {"2db": 7070})
    (tmp_path / "configuration.nix").write_text("{ inputs, pkgs, ... }: {\n" + lines + "\n}\n")
    parsed = subprocess.run(["nix-instantiate", "--parse", str(tmp_path / "configuration.nix")], capture_output=True,
                            text=True)  # fmt: skip
    assert parsed.returncode == 0, (lines, parsed.stderr)


def test_systemd_analyze_gets_no_secret_of_flakebot_s_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A front or worker checking a module has the team database's URL and the model keys in its environment:
    systemd-analyze (a host program like nix) gets the host's variables and its unit path, not those."""
    bin_dir, seen = tmp_path / "bin", tmp_path / "env"
    bin_dir.mkdir()
    stand_in = bin_dir / "systemd-analyze"  # records what the module check hands the program it finds on PATH
    stand_in.write_text(f"#!/bin/sh\nenv >> {seen}\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FLAKEBOT_DATABASE_URL", "postgresql://flakebot:pw-of-the-team@db/flakebot")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-model-key-123456")
    nixos.verify("[Service]\nExecStart=/bin/true\n", "kv-service")
    env = seen.read_text()
    assert "SYSTEMD_UNIT_PATH=" in env and "PATH=" in env, env
    assert "pw-of-the-team" not in env and "sk-ant-model-key" not in env, env
