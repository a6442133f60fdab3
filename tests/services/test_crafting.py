"""The spec of a crafted service (flakebot.services.crafting) and its frozen lifecycle test: what a spec must say,
and that the model's words in it reach the Rust test only as string literals (compiled here with rustc)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flakebot.agent.acceptance import SERVICE_TEST, acceptance_test_names, render_acceptance_test
from flakebot.errors import SpecError
from flakebot.services.crafting import ServiceNeed, from_answer
from flakebot.toolspec import ToolSpec, load_spec_file
from tests.conftest import require

GOOD: dict[str, Any] = {
    "first": [{"method": "PUT", "path": "/kv/a", "body": "1", "status": 200, "body_out": "stored\n"}],
    "after_restart": [{"method": "GET", "path": "/kv/a", "status": 200, "body_out": "1"}],
}


def service_spec(**answer: Any) -> ToolSpec:
    return ToolSpec.from_dict(
        {"name": "kv-store", "summary": "a store", "examples": [], "service": from_answer({**GOOD, **answer})}
    )


def test_a_service_spec_says_protocol_port_health_state_stop_and_both_lives() -> None:
    spec = service_spec(health="tcp", port_env="LISTEN_PORT", stop_grace_s=3)
    need = ServiceNeed.from_dict(spec.service)
    assert need.protocol == "http" and need.declaration.port_env == "LISTEN_PORT"
    assert need.declaration.health.kind == "tcp" and need.declaration.stop_grace_s == 3
    assert [e.path for e in need.examples.after_restart] == ["/kv/a"]
    assert acceptance_test_names(spec) == [SERVICE_TEST]
    assert ToolSpec.from_dict(spec.to_dict()).service == spec.service  # as state.json keeps it


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"after_restart": []}, "at least one request whose answer must survive a restart"),
        ({"first": []}, "0 first examples given"),
        ({"health": "health"}, "neither an HTTP path nor 'tcp'"),
        ({"port_env": "STATE_DIRECTORY"}, "is taken"),
        ({"protocol": "gopher"}, "protocol 'gopher'"),
        ({"first": [{"method": "BREW", "path": "/pot"}]}, "is not a request"),
        ({"stop_grace_s": 600}, "stop_grace_s must be"),
    ],
)
def test_a_service_spec_missing_a_part_is_refused_naming_it(answer: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        service_spec(**answer)
    assert problem in refused.value.message


def test_a_spec_file_carries_the_service_part(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(service_spec().to_dict()))
    spec = load_spec_file(path)
    assert ServiceNeed.from_dict(spec.service).examples.first[0].path == "/kv/a"


def test_model_text_reaches_the_lifecycle_test_as_literals_only(tmp_path: Path) -> None:
    """A spec model's path, body and expected body that try to close the string and add a test of their own."""
    require("rustc")
    escape = '"); } #[test] fn injected() { panic!("x"); } fn y() { let _ = ("'
    spec = service_spec(
        first=[
            {"method": "PUT", "path": "/kv/" + escape, "body": escape + "\\\n{}", "status": 200, "body_out": escape}
        ],
        after_restart=[{"method": "GET", "path": "/health", "status": 200, "body_out": "\\u{0}"}],
    )
    source = tmp_path / "flakebot_acceptance.rs"
    source.write_text(render_acceptance_test(spec))
    binary = tmp_path / "lifecycle"
    env = {**os.environ, "CARGO_BIN_EXE_kv-store": "/bin/false"}  # what cargo would set: the built service
    built = subprocess.run(
        ["rustc", "--edition", "2021", "--test", "-o", str(binary), str(source)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    listed = subprocess.run([str(binary), "--list"], capture_output=True, text=True, timeout=60)
    assert listed.stdout.splitlines()[0] == f"{SERVICE_TEST}: test" and "injected" not in listed.stdout
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)  # /bin/false as the service
    assert ran.returncode != 0 and "exited" in ran.stdout + ran.stderr
