"""Settings: precedence, types, unknown keys, bad TOML, comment-preserving writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot import config
from flakebot.errors import ConfigError
from tests.conftest import json_result, run_cli


def test_precedence_file_then_env_then_flags(flakebot_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (flakebot_home / "config" / "flakebot").mkdir()
    (flakebot_home / "config" / "flakebot" / "flakebot.toml").write_text(
        "max_iterations = 7\nmax_cost = 1.5\noffline = true\n"
    )
    (flakebot_home / "flakebot.toml").write_text("max_cost = 0.5\n")
    monkeypatch.setenv("FLAKEBOT_OFFLINE", "false")
    settings = config.load({"max_iterations": "9", "model": None})
    assert (settings.max_iterations, settings.max_cost, settings.offline) == (9, 0.5, False)
    assert settings.model == ""


def test_unknown_key_in_file_fails_at_start(flakebot_home: Path) -> None:
    (flakebot_home / "flakebot.toml").write_text("max_iteratoins = 3\n")
    result = run_cli("config", "show")
    assert result.returncode == ConfigError.exit_code
    assert "unknown config key 'max_iteratoins'" in result.stderr


def test_config_show_prints_every_setting_with_its_meaning(flakebot_home: Path) -> None:
    """A meaning such as git_sources' `scheme://host[:port][/path]` is shown as text, not read as rich markup."""
    result = run_cli("config", "show")
    assert result.returncode == 0, result.stderr
    assert "git_sources" in result.stdout and "files read:" in result.stdout and "Traceback" not in result.stderr


def test_invalid_toml_names_the_file(flakebot_home: Path) -> None:
    bad = flakebot_home / "flakebot.toml"
    bad.write_text("max_cost = = 2\n")
    result = run_cli("runs")
    assert result.returncode == ConfigError.exit_code
    assert str(bad) in result.stderr and "not valid TOML" in result.stderr
    assert bad.read_text() == "max_cost = = 2\n"


def test_wrong_type_and_bad_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="must be an integer"):
        config.load({"max_iterations": "many"})
    monkeypatch.setenv("FLAKEBOT_SANDBOX", "maybe")
    with pytest.raises(ConfigError, match="FLAKEBOT_SANDBOX.*one of required, auto, off"):
        config.load()


def test_config_set_keeps_comments_and_show_reflects_it(flakebot_home: Path) -> None:
    path = flakebot_home / "config" / "flakebot" / "flakebot.toml"
    path.parent.mkdir()
    path.write_text("# my settings\nmax_cost = 1.0  # dollars\n")
    result = run_cli("config", "set", "max_iterations", "12")
    assert result.returncode == 0, result.stderr
    text = path.read_text()
    assert "# my settings" in text and "# dollars" in text and "max_iterations = 12" in text
    shown = json_result(run_cli("config", "show", "--json"))
    assert shown["max_iterations"] == 12 and shown["max_cost"] == 1.0


def test_config_set_refuses_unknown_key_and_writes_nothing(flakebot_home: Path) -> None:
    result = run_cli("config", "set", "colour", "blue")
    assert result.returncode == ConfigError.exit_code
    assert not (flakebot_home / "config" / "flakebot" / "flakebot.toml").exists()


def test_usage_errors_are_one_message_and_exit_2() -> None:
    for argv in (("runs", "--bogus"), ("craft",), ("craft", "x", "--max-iterations", "many")):
        result = run_cli(*argv)
        assert result.returncode == 2
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], result.stderr
    assert "No such option: --bogus" in run_cli("runs", "--bogus").stderr
    helped = run_cli()  # no command: the help, as typer gives it
    assert "Usage: flakebot" in helped.stdout + helped.stderr and "error:" not in helped.stderr


def test_the_sandbox_is_required_unless_asked_otherwise() -> None:
    assert config.load().sandbox == "required"
    assert config.load({"sandbox": "off"}).sandbox == "off"


def test_runs_default_to_the_state_directory_and_a_set_workdir_still_wins(
    flakebot_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLAKEBOT_WORKDIR")
    assert config.load().path("workdir") == flakebot_home / "state/flakebot"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(flakebot_home / "user"))
    assert config.load().path("workdir") == flakebot_home / "user/.local/state/flakebot"
    (flakebot_home / "config/flakebot").mkdir()
    (flakebot_home / "config/flakebot/flakebot.toml").write_text('workdir = "scratch"\n')  # the user's own file
    assert config.load().path("workdir") == flakebot_home / "scratch"  # relative: from the current directory
    monkeypatch.setenv("FLAKEBOT_WORKDIR", str(flakebot_home / "elsewhere"))
    assert config.load().path("workdir") == flakebot_home / "elsewhere"
