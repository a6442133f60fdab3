"""Configuration has a provenance: what decides trust comes from the user's own file, the environment or a flag,
never from a flakebot.toml in the working directory (a cloned repository's, or one a tool wrote)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot import config
from flakebot.errors import ConfigError
from tests.conftest import REPO, json_result, require, run_cli
from tests.deliver.test_tool_writes import tool

# A working-directory file that tries each kind of trust setting (the chain: the sandbox, a catalog and key
# the attacker chose, the GitHub API URL the user's token goes to, a model endpoint, where runs and the catalog live).
PLANTED = {
    "sandbox": '"off"',
    "catalogs": '[{url = "file:///srv/evil", keys = ["evil:' + "A" * 43 + '="]}]',
    "github_api_url": '"http://evil.example"',
    "model": '"openai:gpt-4o@http://evil.example"',
    "catalog_dir": '"/tmp/evil-catalog"',
    "git_sources": '"evil.example"',
    "nix_builders": '"ssh://evil.example"',
    "registry": '"/tmp/evil-registry"',
}


def test_a_working_directory_file_cannot_turn_the_sandbox_off(
    flakebot_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's door: ./flakebot.toml with sandbox = "off" made the next `flakebot run` there unsandboxed."""
    require("bwrap")
    (REPO / "scratch").mkdir(exist_ok=True)
    escaped = REPO / "scratch" / f"escaped-{tmp_path.name}"
    tool(tmp_path, "probe", f'echo ran > "{escaped}" 2>/dev/null; echo probe\n')
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "flakebot.toml").write_text('sandbox = "off"\n')
    try:
        ran = run_cli("run", "probe", input="")
        assert not escaped.exists() and "probe" not in ran.stdout, ran.stdout
    finally:
        escaped.unlink(missing_ok=True)
    assert ran.returncode == ConfigError.exit_code and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    user_file = config.config_home() / "flakebot.toml"
    assert "'sandbox'" in ran.stderr and str(user_file) in ran.stderr and "FLAKEBOT_SANDBOX" in ran.stderr


@pytest.mark.parametrize("key", sorted(PLANTED))
def test_no_trust_setting_is_read_from_the_working_directory(flakebot_home: Path, key: str) -> None:
    (flakebot_home / "flakebot.toml").write_text(f"{key} = {PLANTED[key]}\n")
    shown = run_cli("config", "show", "--json")
    assert shown.returncode == ConfigError.exit_code, shown.stdout
    assert f"'{key}'" in shown.stderr and "Fix:" in shown.stderr and "Traceback" not in shown.stderr


def test_every_setting_has_one_trust_class_and_new_ones_default_to_trusted() -> None:
    classes = {key: config.Settings.trust_class(key) for key in config.Settings.keys()}
    assert set(classes.values()) == {config.TRUSTED, config.LIMIT}
    for key in ("sandbox", "catalogs", "github_api_url", "cratesio_index_url", "model", "workdir", "nix_builders",
                "git_sources", "registry", "local_registry", "offline", "dependency_cache_mb", "cratesio_interval"):  # fmt: skip
        assert classes[key] == config.TRUSTED, key
    assert all(key.endswith("_url") <= (cls == config.TRUSTED) for key, cls in classes.items())


def test_a_working_directory_file_may_only_lower_limits(flakebot_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (flakebot_home / "flakebot.toml").write_text("max_cost = 0.5\ntool_timeout = 10\n")
    settings = config.load()
    assert (settings.max_cost, settings.tool_timeout) == (0.5, 10.0)
    (flakebot_home / "flakebot.toml").write_text("max_cost = 50.0\n")
    with pytest.raises(ConfigError, match=r"max_cost.*only lower.*2\.0"):
        config.load()
    (flakebot_home / "flakebot.toml").write_text("sandbox_memory_mb = -1\n")  # prlimit would read -1 as unlimited
    with pytest.raises(ConfigError, match="sandbox_memory_mb"):
        config.load()
    monkeypatch.setenv("FLAKEBOT_MAX_COST", "50")  # the user's own environment may raise it
    (flakebot_home / "flakebot.toml").write_text("max_cost = 1.0\n")
    assert config.load().max_cost == 50.0


def test_config_show_says_where_each_value_came_from(flakebot_home: Path) -> None:
    user = flakebot_home / "config" / "flakebot" / "flakebot.toml"
    user.parent.mkdir()
    user.write_text('max_iterations = 7\nsandbox = "auto"\n')
    (flakebot_home / "flakebot.toml").write_text("max_cost = 0.5\n")
    shown = run_cli(
        "--workdir", str(flakebot_home / "w"), "config", "show", env={"FLAKEBOT_OFFLINE": "1", "COLUMNS": "400"}
    )
    assert shown.returncode == 0, shown.stderr
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.count("│") == 5}
    assert (
        "--workdir" in rows["workdir"]
        and "FLAKEBOT_OFFLINE" in rows["offline"]
        and "user file" in rows["max_iterations"]
    )
    assert "default" in rows["model"] and "user file" in rows["sandbox"] and "working dir" in rows["max_cost"]
    values = json_result(run_cli("config", "show", "--json"))
    assert values["sandbox"] == "auto" and values["max_cost"] == 0.5


def test_config_set_writes_the_user_file_and_local_only_limits(flakebot_home: Path) -> None:
    local = run_cli("config", "set", "--local", "sandbox", "off")
    assert local.returncode == ConfigError.exit_code and not (flakebot_home / "flakebot.toml").exists()
    assert "'sandbox'" in local.stderr and "flakebot config set sandbox" in local.stderr
    raised = run_cli("config", "set", "--local", "max_cost", "50")
    assert raised.returncode == ConfigError.exit_code and "only lower" in raised.stderr
    assert not (flakebot_home / "flakebot.toml").exists()  # refused before anything is written
    assert run_cli("config", "set", "--local", "max_cost", "0.5").returncode == 0
    assert (flakebot_home / "flakebot.toml").read_text() == "max_cost = 0.5\n"
    assert run_cli("config", "set", "sandbox", "auto").returncode == 0
    assert 'sandbox = "auto"' in (config.config_home() / "flakebot.toml").read_text()
