"""The NixOS module of a service: the module text evaluated by real nix, its unit checked by real systemd-analyze."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flakebot.errors import NixError
from flakebot.services import nixos
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
