"""flakebot's cargo runner: which crate source and network mode each registry setting gives cargo."""

from __future__ import annotations

import subprocess
from pathlib import Path

from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from tests.conftest import DEBIAN_REGISTRY


def test_registry_setting_picks_the_source(tmp_path: Path) -> None:
    online = Cargo.for_run(Settings(registry="crates-io"), tmp_path)
    assert online.config_args() == []
    local = Cargo.for_run(Settings(registry="local"), tmp_path)
    assert local.offline and local.registry_dir == DEBIAN_REGISTRY
    vendored = Cargo.for_run(Settings(registry=str(tmp_path / "vendor")), tmp_path)
    assert vendored.registry_dir == tmp_path / "vendor" and "--offline" in vendored.config_args()
    forced = Cargo.for_run(Settings(registry="crates-io", offline=True), tmp_path)
    assert forced.offline and forced.registry_dir == DEBIAN_REGISTRY


def test_settings_reach_cargo_without_touching_the_crate(tmp_path: Path) -> None:
    crate = tmp_path / "c"
    subprocess.run(["cargo", "init", "--bin", "--vcs", "none", "--name", "c", str(crate)], check=True, capture_output=True)
    cargo = Cargo.for_run(Settings(registry="local"), tmp_path / "target")
    added = cargo.run(["add", "anyhow"], crate, timeout=120)
    assert added.returncode == 0, added.stderr
    assert 'anyhow = "1' in (crate / "Cargo.toml").read_text()
    assert not (crate / ".cargo").exists()  # flakebot's source settings are flags, not files in the tool's tree
