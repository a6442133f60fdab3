"""Mistakes a newcomer makes at the command line, through the real CLI: each ends in one `error: ... Fix: ...` line
and the documented exit code (one JSON object under --json), before any model call or build, leaving nothing."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flakebot import __version__, config
from flakebot.deliver.catalog import Catalog
from flakebot.errors import CatalogError, HostError, UsageError
from tests.conftest import FLAKEBOT, REPO, json_result, run_cli

SESSION = str(REPO / "flakebot/data/sessions/csv-dedup.json")
CRAFT = ("--model", f"scripted:{SESSION}", "--registry", "local", "--offline")


def _one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Fix: " in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def _no_runs(workdir: Path) -> None:
    runs = workdir / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())


def test_a_need_that_is_not_utf8_is_refused_before_a_run_exists(workdir: Path) -> None:
    argv = [os.fsencode(a) for a in (*FLAKEBOT, "craft")] + [b"need a \xff\xfe deduper"]
    argv += [os.fsencode(a) for a in CRAFT]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert "not valid UTF-8" in _one_error_line(result, UsageError.exit_code)
    _no_runs(workdir)


def test_a_need_too_long_is_refused_with_its_size(workdir: Path) -> None:
    result = run_cli("craft", "x" * 5000, *CRAFT, "--json")
    _one_error_line(result, UsageError.exit_code)
    error = json.loads(result.stdout.splitlines()[-1])
    assert error["type"] == "UsageError" and "5,000 characters" in error["error"]
    _no_runs(workdir)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--registry", "crates-io", "--offline"), "cannot be used offline"),
        (("--registry", "/nonexistent/registry"), "is not a directory"),
        (("--push",), "--push needs --fork"),
        (("--fork", "--offline"), "which an offline run does not reach"),
        (("--fork",), "--fork needs a GitHub token"),  # was ignored, the craft ending 0 without a fork
    ],
)
def test_conflicting_or_missing_inputs_fail_before_the_model_is_called(
    workdir: Path, flags: tuple[str, ...], words: str
) -> None:
    result = run_cli("craft", "need a CSV deduper", "--model", f"scripted:{SESSION}", *flags)
    assert words in _one_error_line(result, UsageError.exit_code)
    _no_runs(workdir)


def test_a_catalog_that_cannot_be_written_fails_before_the_build(workdir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    result = run_cli("craft", "need a CSV deduper", *CRAFT, env={"FLAKEBOT_CATALOG_DIR": str(blocker)})
    assert "catalog_dir" in _one_error_line(result, HostError.exit_code)
    _no_runs(workdir)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("/nonexistent/crate",), "/nonexistent/crate is not a directory"),
        (("./no-such-crate",), "./no-such-crate is not a directory"),
        (("tests/fixtures/kv-service", "--out", "NONEMPTY"), "already holds files that flakebot did not write"),
        (("tests/fixtures/kv-service", "--out", "AFILE"), "is not a directory"),
        (("tests/fixtures/kv-service", "--name", "Bad_Name", "--catalog"), "cannot name a catalogued tool"),
    ],
)
def test_package_refuses_what_needs_nothing_built_before_a_run_exists(
    workdir: Path, tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    (tmp_path / "nonempty").mkdir()
    (tmp_path / "nonempty" / "notes.txt").write_text("mine\n")
    (tmp_path / "a-file").write_text("mine\n")
    places = {"NONEMPTY": str(tmp_path / "nonempty"), "AFILE": str(tmp_path / "a-file")}
    result = run_cli("package", *(places.get(a, str(REPO / a) if a.startswith("tests/") else a) for a in args))
    assert words in _one_error_line(result, UsageError.exit_code)
    _no_runs(workdir)
    assert (tmp_path / "nonempty" / "notes.txt").read_text() == "mine\n"


def test_install_from_a_file_cache_that_is_not_there_says_so(tmp_path: Path) -> None:
    key = "someone-1:" + "A" * 43 + "="
    catalogs = f"file://{tmp_path / 'no-such-cache'} {key}"
    for args in (("install", "shout"), ("list", "--remote")):
        result = run_cli(*args, env={"FLAKEBOT_CATALOGS": catalogs})
        line = _one_error_line(result, CatalogError.exit_code)
        assert f"the shared catalog file://{tmp_path / 'no-such-cache'} does not exist" in line  # was: no tool 'shout'


def test_a_log_file_in_a_missing_directory_is_one_line() -> None:
    result = run_cli("--log-file", "/nonexistent/dir/flakebot.log", "runs")
    assert "cannot write the log file" in _one_error_line(result, UsageError.exit_code)


def test_version() -> None:
    result = run_cli("--version", check=True)
    assert result.stdout.strip() == f"flakebot {__version__}"


def test_rm_clean_and_config_set_speak_json(workdir: Path) -> None:
    assert json_result(run_cli("clean", "--all", "--json", check=True)) == {"removed": []}
    written = json_result(run_cli("config", "set", "max_iterations", "12", "--json", check=True))
    assert written["key"] == "max_iterations" and written["value"] == 12 and Path(written["file"]).is_file()
    missing = run_cli("rm", "no-such-tool", "--json")
    _one_error_line(missing, CatalogError.exit_code)
    assert json.loads(missing.stdout.splitlines()[-1])["type"] == "CatalogError"


def _catalogue_script(tmp_path: Path, name: str, body: str) -> Path:
    """A shell script standing in for a crafted binary, catalogued with its directory as the store path."""
    store = tmp_path / f"store-{name}"
    (store / "bin").mkdir(parents=True)
    (store / "bin" / name).write_text("#!/bin/sh\n" + body)
    (store / "bin" / name).chmod(0o755)
    (tmp_path / "flake").mkdir(exist_ok=True)
    manifest = {
        "name": name,
        "main_program": name,
        "store_path": str(store),
        "summary": "test",
        "nix_run_argv": ["nix"],
    }
    Catalog.open(config.load()).add(
        name, need=f"{name} around", flake_dir=tmp_path / "flake", manifest=manifest, usage_md=f"# {name}\n",
        store_path=str(store), run_id="r1", origin={},
    )  # fmt: skip
    return store


def test_run_json_hands_the_tool_the_callers_standard_input(tmp_path: Path) -> None:
    """Without --args-json, `run --json` passes stdin through as `run` does: an agent reading JSON must not get an
    empty answer where a person gets the right one."""
    _catalogue_script(tmp_path, "uniq-lines", "sort -u\n")
    plain = run_cli("run", "uniq-lines", input="b\na\nb\n", check=True)
    captured = json_result(run_cli("run", "uniq-lines", "--json", input="b\na\nb\n", check=True))
    assert plain.stdout == captured["stdout"] == "a\nb\n"


def test_a_damaged_manifest_is_one_line_under_show_and_run(tmp_path: Path) -> None:
    _catalogue_script(tmp_path, "hello", "echo hello\n")
    entry = Catalog.open(config.load()).get("hello")
    (Path(entry["dir"]) / "manifest.json").write_text('{"name": "hel')  # cut short, as a full disk leaves it
    for argv in (("show", "hello"), ("run", "hello"), ("run", "hello", "--json")):
        assert "is damaged" in _one_error_line(run_cli(*argv), CatalogError.exit_code)


def test_a_second_craft_of_a_need_in_flight_says_which_run_has_it(workdir: Path, tmp_path: Path) -> None:
    """The first craft waits on a slow model reply (holding its run's lock); the second, of the same need in other
    words, is refused at once naming the first run instead of paying for the same work again."""
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"format": 1, "stages": {"spec": [{"fault": {"kind": "slow", "seconds": 120}}]}}))
    first = subprocess.Popen(
        [*FLAKEBOT, "craft", "need a CSV deduper", "--model", f"scripted:{slow}", "--registry", "local", "--offline"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from tests.conftest import wait_for

        state = wait_for(lambda: next((workdir / "runs").glob("*/state.json"), None), timeout=60)
        run_id = state.parent.name
        wait_for(lambda: json.loads(state.read_text()).get("status") == "running", timeout=60)
        second = run_cli("craft", "Need a csv deduper!", "--model", f"scripted:{SESSION}", "--registry", "local")
        assert f"already running: run {run_id}" in _one_error_line(second, 4)
        assert len(list((workdir / "runs").iterdir())) == 1
    finally:
        first.terminate()
        first.wait(timeout=60)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("max_iterations", "-5", "above 0"), ("model_timeout", "0", "above 0"), ("max_cost", "nan", "0 or more")],
)
def test_config_set_checks_bounds_as_every_source_does(key: str, value: str, words: str, flakebot_home: Path) -> None:
    """A value that would break every later craft is refused where it is written, not when a craft reads it."""
    result = run_cli("config", "set", key, "--", value)
    assert words in _one_error_line(result, 3)
    assert not (flakebot_home / "config/flakebot/flakebot.toml").exists()
    env = run_cli("config", "show", env={f"FLAKEBOT_{key.upper()}": value})
    assert words in _one_error_line(env, 3)
