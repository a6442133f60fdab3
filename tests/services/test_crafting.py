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
from flakebot.services.crafting import ServiceNeed, from_answer, load_service_spec
from flakebot.services.lifecycle import Examples
from flakebot.toolspec import ToolSpec, load_spec_file
from tests.conftest import require, run_cli
from tests.fakes.service_sessions import LINKS, LINKS_SPEC, build_links

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


# ------------------------------------------------------------------ headers


def test_a_spec_with_request_and_answer_headers_is_accepted_and_kept(tmp_path: Path) -> None:
    """Before headers an example with `headers_out` was refused: 'Exchange.__init__() got an unexpected keyword
    argument'."""
    redirect = {"method": "GET", "path": "/a", "status": 302, "headers": {"X-User": "ada"},
                "headers_out": {"Location": "/kv/a", "content-type": "text/plain"}}  # fmt: skip
    spec = service_spec(first=[*GOOD["first"], redirect])
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec.to_dict()))  # as --spec FILE, and as state.json keeps it
    exchange = ServiceNeed.from_dict(load_spec_file(path).service).examples.first[1]
    assert exchange.headers == {"X-User": "ada"}
    assert exchange.headers_out == {"Location": "/kv/a", "content-type": "text/plain"}
    left_out = {"method": "GET", "path": "/a", "body": None, "headers": None, "headers_out": None}  # strict mode
    assert ServiceNeed.from_dict(service_spec(first=[left_out]).service).examples.first[0].headers_out == {}


def test_a_spec_and_a_manifest_from_before_headers_read_as_no_headers() -> None:
    """Records written before headers (state.json's spec, a manifest's lifecycle_examples) have no such keys."""
    old = {"first": [{"method": "PUT", "path": "/kv/a", "body": "1", "status": 200, "body_out": "stored\n"}],
           "after_restart": [{"method": "GET", "path": "/kv/a", "status": 200, "body_out": "1"}]}  # fmt: skip
    examples = Examples.from_dict(old)
    assert [(e.headers, e.headers_out) for e in examples.first + examples.after_restart] == [({}, {}), ({}, {})]
    service = {"protocol": "http", "declaration": from_answer(GOOD)["declaration"], "examples": old}
    spec = ToolSpec.from_dict({"name": "kv-store", "summary": "a store", "examples": [], "service": service})
    assert "headers: &[]" in render_acceptance_test(spec)
    assert "headers" not in json.dumps(from_answer(GOOD))  # and one without headers is written as before them


@pytest.mark.parametrize(
    ("headers", "problem"),
    [
        ({"Loc ation": "/a"}, "headers_out name 'Loc ation' is not an HTTP token"),
        ({"Location:": "/a"}, "is not an HTTP token"),
        ({"Location": "/a\r\nSet-Cookie: x=1"}, "the value holds CR or LF"),
        ({"Location": "/a\n"}, "the value holds CR or LF"),
        ({"Location": " /a"}, "without leading or trailing spaces"),
        ({"Location": "/é"}, "is not printable ASCII"),
        ({"Location": "/" + "a" * 1024}, "at most 1024"),
        ({"X" * 65: "1"}, "at most 64 characters"),
        ({f"X-{n}": "1" for n in range(9)}, "has 9 headers (at most 8)"),
        ({"Location": "/a", "location": "/b"}, "name 'location' is given twice"),
        ({"Location": 302}, "the value must be a string, got int"),
        (["Location", "/a"], "must be an object {NAME: VALUE}, got list"),
    ],
)
def test_a_bad_header_in_a_spec_is_refused_naming_it(headers: Any, problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        service_spec(first=[{"method": "GET", "path": "/a", "status": 302, "headers_out": headers}])
    assert problem in refused.value.message and "Fix" not in refused.value.message
    assert "HTTP token" in refused.value.fix


@pytest.mark.parametrize(
    ("example", "problem"),
    [
        ({"method": "GET", "path": "/a", "headers": {"Content-Length": "9"}}, "'Content-Length' is set by the check"),
        ({"method": "GET", "path": "/a", "header": {"Location": "/b"}}, "unknown field 'header'"),
        ({"method": "GET", "path": "/a", "status": "302"}, "status '302'"),
        ({"path": "/a"}, "an example has no method"),
    ],
)
def test_a_malformed_example_is_refused_naming_it_not_with_a_type_error(example: dict[str, Any], problem: str) -> None:
    with pytest.raises(SpecError) as refused:
        service_spec(first=[example])
    assert problem in refused.value.message and "__init__" not in refused.value.message


def test_a_bad_header_in_a_spec_file_is_one_error_line(tmp_path: Path) -> None:
    """Through the CLI: `error: ... Fix: ...`, exit 42 (SpecError), no traceback and no TypeError."""
    require("cargo")
    spec = service_spec().to_dict()
    spec["service"]["examples"]["first"][0]["headers_out"] = {"Location": "/a\r\nX-Injected: 1"}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    script = tmp_path / "no-model.json"
    script.write_text(json.dumps({"format": 1, "stages": {}}))
    done = run_cli("craft", "--service", "short links", "--spec", str(path), "--model", f"scripted:{script}",
                   "--registry", "local", "--offline", "--stop-after", "spec")  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 42 and len(errors) == 1, done.stderr
    assert "headers_out Location: the value holds CR or LF. Fix: give headers as {NAME: VALUE}" in errors[0]
    assert "Traceback" not in done.stderr and "TypeError" not in done.stderr


def test_model_text_in_headers_reaches_the_lifecycle_test_as_literals_only(tmp_path: Path) -> None:
    require("rustc")
    escape = '"); } #[test] fn injected() { panic!("x"); } fn y() { let _ = ("'
    spec = service_spec(
        first=[{"method": "GET", "path": "/a", "headers": {"X-A": escape}, "headers_out": {"X-B": escape + "\\"}}]
    )
    listed = run_rust_test(tmp_path, render_acceptance_test(spec), Path("/bin/false"), "--list")
    assert listed.stdout.splitlines()[0] == f"{SERVICE_TEST}: test" and "injected" not in listed.stdout


def run_rust_test(tmp_path: Path, source: str, service: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The frozen test compiled with rustc as cargo would (CARGO_BIN_EXE_ naming `service`), then run."""
    (tmp_path / "flakebot_acceptance.rs").write_text(source)
    binary = tmp_path / "lifecycle"
    env = {**os.environ, "CARGO_BIN_EXE_kv-store": str(service), f"CARGO_BIN_EXE_{LINKS}": str(service)}
    built = subprocess.run(
        ["rustc", "--edition", "2021", "--test", "-o", str(binary), str(tmp_path / "flakebot_acceptance.rs")],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("variant", "expect", "failure"),
    [
        ("", {}, ""),
        ("no-location", {}, 'GET /docs: header Location: [], expected "https://example.org/docs"'),
        # the value is compared exactly: the same link in another case is another link
        ("", {"Location": "https://example.org/DOCS"}, 'header Location: ["https://example.org/docs"], expected'),
    ],
)
def test_the_frozen_test_holds_a_built_service_to_its_headers(
    tmp_path: Path, variant: str, expect: dict[str, str], failure: str
) -> None:
    """The frozen lifecycle test (compiled as cargo test would) against the template-made links service, built
    with cargo: green when it sends what the spec names (Location asked for as `location` after the restart, an
    extra header beside it), red naming the header when its redirect has no Location or another value."""
    require("rustc", "cargo")
    answer = {k: v for k, v in LINKS_SPEC.items() if k in ("first", "after_restart", "stop_grace_s", "start_s")}
    if expect:
        answer["first"] = [{**e, "headers_out": expect} if e["path"] == "/docs" else e for e in answer["first"]]
    spec = ToolSpec.from_dict({"name": LINKS, "summary": "links", "examples": [], "service": from_answer(answer)})
    ran = run_rust_test(tmp_path, render_acceptance_test(spec), build_links(tmp_path, variant))
    if not failure:
        assert ran.returncode == 0, ran.stdout + ran.stderr
    else:
        assert ran.returncode != 0 and failure in ran.stdout + ran.stderr, ran.stdout + ran.stderr


def test_the_edit_prompts_show_an_examples_headers_and_read_records_without_them() -> None:
    from flakebot.render import render

    redirect = {"method": "GET", "path": "/a", "status": 302, "headers_out": {"Location": "/kv/a"}}
    with_headers = service_spec(first=[*GOOD["first"], redirect])
    old = service_spec()  # its examples' records have no headers keys, as one written before headers
    assert "headers" not in json.dumps(old.service["examples"])
    origin = {"method": "new", "crate": "kv-store", "library": None}
    shown = render("prompts/edit_task.j2", spec=with_headers, need="a store", origin=origin, files="src/main.rs")
    assert '- GET /a -> status 302, headers {"Location": "/kv/a"}' in shown
    assert "- GET /kv/a -> status 200, body" in render(
        "prompts/edit_task.j2", spec=old, need="a store", origin=origin, files="src/main.rs"
    )
    assert '.header("Location", "/there")' in render("prompts/edit.j2", spec=old, acceptance="tests/x.rs")


def test_a_model_whose_spec_has_a_bad_header_is_told_the_rule_and_asked_again(tmp_path: Path, workdir: Path) -> None:
    """Through the real spec stage and the scripted model behind the stub server."""
    bad = {**LINKS_SPEC, "first": [{**LINKS_SPEC["first"][1], "headers_out": {"Location": "/a\r\nSet-Cookie: x"}}]}
    calls = [{"tool_calls": [{"name": "submit_service_spec", "arguments": answer}]} for answer in (bad, LINKS_SPEC)]
    script = tmp_path / "spec.json"
    script.write_text(json.dumps({"format": 1, "stages": {"spec": calls}}))
    done = run_cli("craft", "--service", "short links", "--model", f"scripted:{script}", "--registry", "local",
                   "--offline", "--stop-after", "spec", "--json")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:]
    [transcript] = [path.read_text() for path in (workdir / "runs").glob("*/transcript.jsonl")]
    assert (
        "error: submit_service_spec: example GET /docs: headers_out Location: the value holds CR or LF. " in transcript
    )
    assert "Fix: give headers as {NAME: VALUE}: NAME an HTTP token" in transcript


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"name": "kv", "summary": "a store", "usage": "kv"}, "has no service part"),
        ({"name": "kv", "summary": "a store", "examples": [{"args": [], "stdout": "x"}]}, "has no service part"),
        ({"summary": "a store", "service": {"declaration": {"health": "/health"}}}, "missing or malformed field"),
        ({"name": "kv", "summary": "s", "service": {"declaration": {"health": "/health"}}}, "0 first examples given"),
    ],
)
def test_a_service_spec_file_gets_a_services_advice_before_any_run(
    flakebot_home: Path, tmp_path: Path, spec: dict[str, Any], said: str
) -> None:
    """craft --service --spec FILE: a spec file that is no service's is refused before a run exists, with the advice
    for a service's spec (not a tool's 3-6 command-line examples); a health check written as "/health" is read."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    script = tmp_path / "no-model.json"
    script.write_text(json.dumps({"format": 1, "stages": {}}))
    done = run_cli("craft", "--service", "a kv store", "--spec", str(path), "--model", f"scripted:{script}",
                   "--registry", "local", "--offline")  # fmt: skip
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 42 and len(errors) == 1, done.stderr
    assert said in errors[0], errors[0]
    assert "a service's spec file is" in errors[0] or "after_restart examples" in errors[0], errors[0]
    assert "3-6 examples" not in errors[0] and "Health()" not in errors[0]
    assert not (flakebot_home / "work" / "runs").exists() or not any((flakebot_home / "work" / "runs").iterdir())


def test_a_spec_file_declares_what_the_service_needs_and_a_bad_name_is_refused(tmp_path: Path) -> None:
    """`needs` in a crafted service's declaration, as package-service --needs gives it (tests/services/test_needs.py
    runs it)."""
    spec = service_spec().to_dict()
    spec["service"]["declaration"]["needs"] = ["kv-service", "metrics_db"]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    needed = ServiceNeed.from_dict(load_service_spec(path).service).declaration.needs
    assert needed == ("kv-service", "metrics_db")
    spec["service"]["declaration"]["needs"] = ["kv-service", "Kv Service"]
    path.write_text(json.dumps(spec))
    with pytest.raises(SpecError) as refused:
        load_service_spec(path)
    assert "needs 'Kv Service': not a service name" in refused.value.message
