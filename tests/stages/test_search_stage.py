"""Registry choice, the auto fallback, the search stage in a real pipeline, and `flakebot search` end to end."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot import api, config
from flakebot.config import Settings
from flakebot.crates.cratesio import CratesIo
from flakebot.crates.local import LocalRegistry
from flakebot.crates.registries import open_registry
from flakebot.errors import SearchError, UsageError
from flakebot.pipeline import engine as pipeline
from flakebot.pipeline.engine import Stage, StageContext
from flakebot.pipeline.request import RunRequest
from flakebot.stages.search import search_stage
from tests.conftest import DEBIAN_REGISTRY, json_result, run_cli
from tests.fakes.crates_server import CratesServer

LOCAL = str(DEBIAN_REGISTRY)  # the tests' own registry (tests/fakes/registry.py)
CLOSED = "http://127.0.0.1:9"  # nothing listens: connection refused, instantly


def spec_stage(ctx: StageContext) -> dict:
    """The test's spec: its search query is the request's name, when given."""
    return {"search_query": ctx.request.name} if ctx.request.name else {}


SEARCH_ONLY = [Stage("spec", spec_stage), Stage("search", search_stage)]


@pytest.fixture
def server() -> Iterator[CratesServer]:
    with CratesServer() as running:
        yield running


def server_settings(server: CratesServer, **extra: object) -> Settings:
    return Settings(
        cratesio_api_url=server.url, cratesio_interval=0.0, cratesio_details=0, local_registry=LOCAL, **extra
    )  # type: ignore[arg-type]


def test_open_registry_by_name(tmp_path: Path) -> None:
    settings = Settings(local_registry=LOCAL)
    assert isinstance(open_registry(settings, "local"), LocalRegistry)
    assert isinstance(open_registry(settings, "crates-io"), CratesIo)
    by_path = open_registry(settings, str(DEBIAN_REGISTRY))
    assert isinstance(by_path, LocalRegistry) and by_path.path == DEBIAN_REGISTRY
    assert isinstance(open_registry(Settings(offline=True, local_registry=LOCAL)), LocalRegistry)
    assert isinstance(open_registry(Settings(registry="local", local_registry=LOCAL)), LocalRegistry)
    assert open_registry(settings, "auto").name == "crates-io"


@pytest.mark.parametrize(
    ("settings", "registry", "message"),
    [
        (Settings(offline=True), "crates-io", "cannot be searched offline"),
        (Settings(), "pypi", "unknown registry 'pypi'"),
        (Settings(local_registry="/nonexistent/registry"), "local", "does not exist"),
    ],
)
def test_open_registry_refuses(settings: Settings, registry: str, message: str) -> None:
    with pytest.raises(SearchError, match=message):
        open_registry(settings, registry)


def test_auto_falls_back_to_local_with_one_notice(caplog: pytest.LogCaptureFixture) -> None:
    registry = open_registry(Settings(cratesio_api_url=CLOSED, cratesio_interval=0.0, local_registry=LOCAL))
    with caplog.at_level(logging.WARNING, logger="flakebot"):
        found = registry.search("csv")
        assert registry.get("hexyl").bin_names == ["hexyl"]
    assert registry.name == "local" and found[0].crate.name == "csv"
    [notice] = caplog.records
    assert (
        "cannot connect to 127.0.0.1" in notice.getMessage()
        and f"searching the local registry {DEBIAN_REGISTRY}" in notice.getMessage()
    )
    assert "\n" not in notice.getMessage()


def test_auto_uses_crates_io_when_it_answers(server: CratesServer) -> None:
    registry = open_registry(server_settings(server))
    assert [c.crate.name for c in registry.search("postgres")] == ["postgres"]
    assert registry.name == "crates-io" and len(server.requests()) == 1


def test_auto_does_not_fall_back_on_a_real_error(server: CratesServer) -> None:
    server.route("/api/v1/crates")  # no replies: 404 for everything
    with pytest.raises(SearchError, match="404"):
        open_registry(server_settings(server)).search("csv")


def test_api_search_offline_and_limit(server: CratesServer) -> None:
    found = api.search("csv", offline=True, limit=1, settings=server_settings(server))
    assert [(c.crate.name, c.crate.source) for c in found] == [("csv", "local")]
    assert server.requests() == []
    with pytest.raises(UsageError, match="'limit' must be at least 1, got 0"):  # the API names its own keyword
        api.search("csv", registry="local", limit=0)


@pytest.mark.parametrize(
    ("spec_query", "need", "query", "expected"),
    [(None, "hex dump viewer", "hex dump viewer", "hexyl"), ("csv", "a tool for tables", "csv", "csv")],
)
def test_search_stage_in_a_pipeline(
    workdir: Path, spec_query: str | None, need: str, query: str, expected: str
) -> None:
    request = RunRequest(need=need, registry="local", name=spec_query)
    run = pipeline.start(f"{__name__}:SEARCH_ONLY", workdir, config.load(), request)
    output = run.state["outputs"]["search"]
    assert output["registry"] == "local" and output["query"] == query
    names = [c["name"] for c in output["candidates"]]
    assert expected in names[:3] and 1 <= len(names) <= 10
    assert all(c["why"] and c["path"].startswith(str(DEBIAN_REGISTRY)) for c in output["candidates"])
    saved = json.loads((run.dir / "state.json").read_text())
    assert saved["outputs"]["search"] == output


def test_search_stage_fails_when_nothing_matches(workdir: Path) -> None:
    with pytest.raises(SearchError, match="no crate in local matches 'kubernetes operator'") as info:
        pipeline.start(
            f"{__name__}:SEARCH_ONLY", workdir, config.load(), RunRequest(need="kubernetes operator", registry="local")
        )
    assert info.value.stage == "search"


# ---------------------------------------------------------------- the CLI, in a subprocess


@pytest.mark.parametrize(
    ("query", "expected", "within"),
    [("csv", "csv", 1), ("hex dump viewer", "hexyl", 3), ("parse command line arguments", "clap", 3)],
)
def test_cli_search_local_json(query: str, expected: str, within: int) -> None:
    result = run_cli("search", query, "--registry", "local", "--json", check=True)
    rows = json_result(result)["candidates"]
    assert expected in [r["name"] for r in rows[:within]]
    assert all(r["why"] and r["source"] == "local" and "score" in r for r in rows)


def test_cli_search_table() -> None:
    result = run_cli(
        "search", "hex dump viewer", "--registry", "local", "--limit", "2", check=True, env={"COLUMNS": "200"}
    )
    for heading in ("crate", "version", "bin?", "licence", "downloads", "why", "description"):
        assert heading in result.stdout
    assert "hexyl" in result.stdout and "A command-line hex viewer" in result.stdout


def test_cli_search_falls_back_with_a_notice() -> None:
    result = run_cli("search", "csv", "--json", "--limit", "1", check=True, env={"FLAKEBOT_CRATESIO_API_URL": CLOSED})
    assert json_result(result)["candidates"][0]["name"] == "csv"
    # rich wraps at 80 columns
    assert f"searching the local registry {DEBIAN_REGISTRY} instead" in " ".join(result.stderr.split())


def test_cli_search_crates_io(server: CratesServer) -> None:
    env = {"FLAKEBOT_CRATESIO_API_URL": server.url, "FLAKEBOT_CRATESIO_DETAILS": "0"}
    result = run_cli("search", "postgres", "--registry", "crates-io", "--json", check=True, env=env)
    assert json_result(result)["candidates"][0]["downloads"] == 535491
    assert (
        run_cli("search", "postgres", "--registry", "crates-io", "--json", check=True, env=env).stdout == result.stdout
    )
    assert len(server.requests()) == 1  # the second process was answered from the disk cache


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["the of a", "--registry", "local"], "has only common words"),
        (["csv", "--registry", "{empty}"], "is not a cargo directory source"),
        (["csv", "--registry", "{file}"], "is not a directory"),
        (["csv", "--registry", "crates-io", "--offline"], "cannot be searched offline"),
    ],
)
def test_cli_search_bad_input(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    args = [a.format(empty=tmp_path / "empty", file=tmp_path / "file") for a in args]
    result = run_cli("search", *args)
    assert result.returncode == 10, result.stderr
    assert message in result.stderr and "Fix:" in result.stderr and result.stdout == ""


def test_cli_search_of_nothing_is_every_doors_blank_check() -> None:
    result = run_cli("search", "", "--registry", "local")
    assert result.returncode == 2, result.stderr  # a usage error (table.check_values), before any registry is read
    assert "'QUERY' is required" in result.stderr and "Fix:" in result.stderr and result.stdout == ""
