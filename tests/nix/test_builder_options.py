"""The nix options the nix_builders setting becomes (flakebot.nix.builders.builder_options), per nixpkgs mode."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from flakebot.nix.builders import builder_options

FEATURE = "flakebot-toolchain-" + "0" * 32
TWO = f"ssh-ng://a x86_64-linux - 2 1 {FEATURE} ; ssh-ng://b x86_64-linux - 2 1 big-parallel,{FEATURE}"


def standin(root: Path, feature: str | None) -> Path:
    root.mkdir()
    (root / "host.json").write_text(json.dumps({"systemFeature": feature} if feature else {}))
    return root


def test_pinned_builds_take_the_setting_as_given() -> None:
    assert builder_options("pinned", "", None) == []
    assert builder_options("pinned", TWO, None) == [
        *("--option", "builders", TWO),
        *("--option", "builders-use-substitutes", "true"),
    ]


def test_stand_in_builds_without_builders_stay_here_as_before(tmp_path: Path) -> None:
    assert builder_options("host", "", standin(tmp_path / "plain", None)) == ["--option", "builders", ""]
    featured = standin(tmp_path / "featured", FEATURE)
    here = ["--option", "builders", "", "--option", "extra-system-features", FEATURE]
    assert builder_options("host", "", featured) == here  # a collected tool rebuilt with no builders: still here


def test_stand_in_builds_go_to_builders_that_list_the_feature(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    options = builder_options("host", TWO, standin(tmp_path / "s", FEATURE))
    assert options == [
        *("--option", "builders", TWO),
        *("--option", "builders-use-substitutes", "true"),
        *("--option", "extra-system-features", FEATURE),
    ]
    assert not caplog.records


def test_builders_without_the_feature_are_named_in_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    builder_options("host", "ssh-ng://a x86_64-linux - 2 1 big-parallel", standin(tmp_path / "s", FEATURE))
    assert f"no builder in nix_builders lists the toolchain feature {FEATURE}" in caplog.text


def test_a_stand_in_without_the_feature_ignores_builders(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert builder_options("host", TWO, standin(tmp_path / "s", None)) == ["--option", "builders", ""]
    assert "nix_builders is ignored" in caplog.text
