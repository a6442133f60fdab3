"""The model's tools on a real workspace: paths kept inside, edits checked, frozen and steering files refused, cargo in bubblewrap."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from flakebot.agent.acceptance import Frozen
from flakebot.agent.loop import StopLoop
from flakebot.agent.tools import MAX_FILE_BYTES, Toolbox
from flakebot.cargo.runner import Cargo
from flakebot.errors import EditError
from flakebot.sandbox import open_sandbox
from tests.conftest import DEBIAN_REGISTRY, require
from tests.fakes.fsyncs import recorded_fsyncs

MANIFEST = '[package]\nname = "demo"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n'
LIB = """pub fn add(a: i32, b: i32) -> i32 {
    a + b
}

pub fn sub(a: i32, b: i32) -> i32 {
    a - b
}
"""
ACCEPTANCE = "#[test]\nfn adds() {\n    assert_eq!(demo::add(2, 2), 4);\n}\n"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace"
    (workspace / "src").mkdir(parents=True)
    (workspace / "tests").mkdir()
    (workspace / ".git").mkdir()
    (workspace / ".git/config").write_text("[core]\n")
    (workspace / "Cargo.toml").write_text(MANIFEST)
    (workspace / "src/lib.rs").write_text(LIB)
    (workspace / "tests/acceptance.rs").write_text(ACCEPTANCE)
    return workspace


def toolbox(ws: Path, **kwargs: object) -> Toolbox:
    require("bwrap")
    target = ws.parent / "target"
    frozen = Frozen(ws, {"tests/acceptance.rs": hashlib.sha256(ACCEPTANCE.encode()).hexdigest()})
    sandbox = open_sandbox(
        "required",
        workspace=ws,
        writable=[target],
        readable=[DEBIAN_REGISTRY],
        timeout=300,
        frozen=frozen.paths(),
        adopt=True,
    )
    return Toolbox(
        ws, sandbox, Cargo(target_dir=target, offline=True, registry_dir=DEBIAN_REGISTRY), frozen=frozen, **kwargs
    )  # type: ignore[arg-type]


def test_schemas_are_openai_function_tools(ws: Path) -> None:
    schemas = toolbox(ws).schemas()
    names = [s["function"]["name"] for s in schemas]
    expected = [
        "list_files",
        "read_file",
        "search",
        "write_file",
        "edit_file",
        "cargo_check",
        "run_tests",
        "add_dependency",
        "done",
    ]
    assert names == expected
    for schema in schemas:
        assert schema["type"] == "function" and schema["function"]["description"]
        params = schema["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    json.dumps(schemas)
    read_only = [s["function"]["name"] for s in toolbox(ws, read_only=True).schemas()]
    assert read_only == ["list_files", "read_file", "search", "cargo_check", "run_tests", "done"]


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/etc/passwd", "absolute path '/etc/passwd' refused"),
        ("../outside.txt", "contains '..'"),
        ("src/../../outside.txt", "contains '..'"),
        ("~/.ssh/id_rsa", "absolute path"),
        ("link-out/secret.txt", "leads outside the workspace"),
        ("secret-link", "leads outside the workspace"),
        ("", "the path is empty"),
    ],
)
def test_paths_leading_out_are_refused(ws: Path, path: str, problem: str) -> None:
    outside = ws.parent / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "secret.txt").write_text("top secret\n")
    (ws / "link-out").symlink_to(outside)
    (ws / "secret-link").symlink_to(outside / "secret.txt")
    tools = toolbox(ws)
    for name, args in [
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": "x\n"}),
        ("list_files", {"path": path}),
    ]:
        result = tools.call(name, args)
        print(name, path, "->", result.text)
        assert not result.ok and problem in result.text
        assert result.data["error"] in ("refused", "bad_arguments")
    assert (outside / "secret.txt").read_text() == "top secret\n"
    assert not (ws.parent / "outside.txt").exists()


def test_git_directory_is_not_writable(ws: Path) -> None:
    result = toolbox(ws).call("write_file", {"path": ".git/hooks/pre-commit", "content": "#!/bin/sh\n"})
    assert not result.ok and "inside .git" in result.text
    assert not (ws / ".git/hooks").exists()


@pytest.mark.parametrize("path", ["vendor/.git/config", "sub/.git", ".GIT/config", "a/.Git/hooks/pre-commit"])
def test_every_file_tool_refuses_a_git_part_anywhere_in_any_case(ws: Path, path: str) -> None:
    (ws / "vendor/.git").mkdir(parents=True)
    (ws / "vendor/.git/config").write_text("[core]\n\tfsmonitor = planted\n")
    tools = toolbox(ws)
    calls = [
        ("write_file", {"path": path, "content": "[core]\n"}),
        ("edit_file", {"path": path, "search": "planted", "replace": "x"}),
        ("read_file", {"path": path}),
        ("search", {"pattern": "fsmonitor", "path": path}),
        ("list_files", {"path": path}),
    ]
    for name, arguments in calls:
        result = tools.call(name, arguments)
        assert not result.ok and "has a .git part" in result.text and "any case" in result.text, (name, result.text)
    assert (ws / "vendor/.git/config").read_text() == "[core]\n\tfsmonitor = planted\n"
    assert not (ws / "sub").exists() and not (ws / ".GIT").exists() and not (ws / "a").exists()
    listing = tools.call("list_files", {}).text
    assert ".git" not in listing.lower()
    assert tools.call("search", {"pattern": "fsmonitor"}).data["matches"] == 0


def test_list_read_search(ws: Path) -> None:
    tools = toolbox(ws)
    (ws / "target").mkdir()
    (ws / "target/junk.rs").write_text("fn junk() {}\n")
    listing = tools.call("list_files", {})
    assert listing.ok and listing.text.splitlines() == ["Cargo.toml", "src/lib.rs", "tests/acceptance.rs"]
    read = tools.call("read_file", {"path": "src/lib.rs", "start_line": 5, "end_line": "6"})
    assert read.ok
    assert read.text.splitlines() == [
        "src/lib.rs: lines 5-6 of 7 (more: call read_file with start_line=7)",
        "     5\tpub fn sub(a: i32, b: i32) -> i32 {",
        "     6\t    a - b",
    ]
    found = tools.call("search", {"pattern": r"pub fn \w+"})
    assert found.text.splitlines() == [
        "src/lib.rs:1: pub fn add(a: i32, b: i32) -> i32 {",
        "src/lib.rs:5: pub fn sub(a: i32, b: i32) -> i32 {",
    ]
    bad = tools.call("search", {"pattern": "fn ("})
    assert not bad.ok and "invalid regular expression 'fn ('" in bad.text
    missing = tools.call("read_file", {"path": "src/main.rs"})
    assert not missing.ok and "not a file in the workspace" in missing.text


def test_a_file_the_sandbox_made_huge_is_neither_read_nor_edited_whole(ws: Path) -> None:
    """A test the model wrote can leave a sparse file of gigabytes in the workspace (the sandbox's per-file limit is
    2 GiB): the host's tools read at most MAX_FILE_BYTES of it, so they refuse it in one line (search skips it)
    instead of holding it whole in the host's memory."""
    tools = toolbox(ws)
    with open(ws / "src/huge.rs", "wb") as huge:
        huge.truncate(3 << 30)  # 3 GiB of holes: costs no disk, and read whole, 3 GiB of the host's memory
    for name, args in (("read_file", {"path": "src/huge.rs"}),
                       ("edit_file", {"path": "src/huge.rs", "search": "a", "replace": "b"})):  # fmt: skip
        refused = tools.call(name, args)
        assert not refused.ok and f"larger than {MAX_FILE_BYTES} bytes" in refused.text, refused.text
    found = tools.call("search", {"pattern": "pub fn add"})
    assert found.text.splitlines() == ["src/lib.rs:1: pub fn add(a: i32, b: i32) -> i32 {"]
    assert (ws / "src/huge.rs").stat().st_size == 3 << 30  # refused, not touched


def test_bad_calls_come_back_as_results(ws: Path) -> None:
    tools = toolbox(ws)
    cases = [
        ("rm_rf", {}, "unknown tool 'rm_rf'; available tools: list_files, read_file"),
        ("read_file", {}, "bad arguments for read_file: missing required argument 'path'"),
        ("read_file", {"path": 3}, "'path' must be a string, got int"),
        ("read_file", {"path": "src/lib.rs", "start_line": "five"}, "'start_line' must be a integer"),
        (
            "read_file",
            {"path": "src/lib.rs", "lines": 3},
            "unexpected argument 'lines' (accepted: path, start_line, end_line)",
        ),
        ("add_dependency", {"name": "anyhow", "features": "std"}, "'features' must be an array of strings"),
        ("edit_file", ["src/lib.rs"], "arguments must be a JSON object, got list"),
    ]
    for name, args, text in cases:
        result = tools.call(name, args)  # type: ignore[arg-type]
        assert not result.ok and text in result.text, result.text


def test_edit_file_exact_replace(ws: Path) -> None:
    result = toolbox(ws).call(
        "edit_file", {"path": "src/lib.rs", "search": "    a - b\n", "replace": "    a.saturating_sub(b)\n"}
    )
    assert result.ok, result.text
    assert "edited src/lib.rs at line 6" in result.text and "     6\t    a.saturating_sub(b)" in result.text
    assert (ws / "src/lib.rs").read_text() == LIB.replace("a - b", "a.saturating_sub(b)")
    assert result.data == {"path": "src/lib.rs", "line": 6, "removed": 2, "added": 2, "tool": "edit_file"}


def test_the_models_writes_are_not_synced(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """write_file and edit_file replace the file atomically without an fsync: a crash's resume redoes the edit stage
    from its base commit, so the workspace needs none (cargo's own writes there have none). The real fsync runs."""
    synced = recorded_fsyncs(monkeypatch)
    tools = toolbox(ws)
    assert tools.call("write_file", {"path": "src/extra.rs", "content": "pub fn one() -> i32 {\n    1\n}\n"}).ok
    assert tools.call("edit_file", {"path": "src/lib.rs", "search": "    a + b\n", "replace": "    b + a\n"}).ok
    assert (ws / "src/extra.rs").read_text() == "pub fn one() -> i32 {\n    1\n}\n"
    assert (ws / "src/lib.rs").read_text() == LIB.replace("a + b", "b + a")
    assert [path for path in synced if path.startswith(str(ws))] == []


def test_edit_file_without_match_shows_the_closest_lines(ws: Path) -> None:
    tools = toolbox(ws)
    result = tools.call(
        "edit_file", {"path": "src/lib.rs", "search": "pub fn sub(a: i32, b: i32) -> i64 {\n    a - b", "replace": "x"}
    )
    print(result.text)
    assert not result.ok
    assert "`search` was not found in src/lib.rs. The closest lines" in result.text and "are 5-6" in result.text
    assert "     5\tpub fn sub(a: i32, b: i32) -> i32 {" in result.text
    indented = tools.call("edit_file", {"path": "src/lib.rs", "search": "a + b", "replace": "b + a"})
    assert indented.ok, "a unique substring is enough"
    spaces = tools.call(
        "edit_file", {"path": "src/lib.rs", "search": "pub fn sub(a: i32, b: i32) -> i32 {\n  a - b\n}", "replace": "x"}
    )
    assert not spaces.ok and "only in whitespace or indentation" in spaces.text
    assert (ws / "src/lib.rs").read_text() == LIB.replace("a + b", "b + a")


def test_edit_file_with_several_matches_asks_for_context(ws: Path) -> None:
    result = toolbox(ws).call(
        "edit_file",
        {"path": "src/lib.rs", "search": "(a: i32, b: i32) -> i32 {", "replace": "(a: i64, b: i64) -> i64 {"},
    )
    assert not result.ok
    assert "matches 2 times in src/lib.rs (at lines 1, 5); include more surrounding lines" in result.text
    assert (ws / "src/lib.rs").read_text() == LIB


@pytest.mark.parametrize(
    "placeholder",
    ["    // ... existing code ...", "// rest of the file unchanged", "...", "    /* ... */", "// existing code here"],
)
def test_placeholders_are_refused(ws: Path, placeholder: str) -> None:
    tools = toolbox(ws)
    edit = tools.call(
        "edit_file", {"path": "src/lib.rs", "search": "    a - b\n", "replace": f"    a - b + 1\n{placeholder}\n"}
    )
    assert not edit.ok and "is a placeholder" in edit.text
    write = tools.call("write_file", {"path": "src/lib.rs", "content": f"pub fn add() {{}}\n{placeholder}\n"})
    assert not write.ok and "write_file needs the complete file" in write.text
    assert (ws / "src/lib.rs").read_text() == LIB


def test_real_comments_and_existing_placeholders_are_allowed(ws: Path) -> None:
    tools = toolbox(ws)
    (ws / "src/odd.rs").write_text("// ... existing code\nfn a() {}\n")
    kept = tools.call(
        "edit_file",
        {
            "path": "src/odd.rs",
            "search": "// ... existing code\nfn a() {}",
            "replace": "// ... existing code\nfn a() { b() }",
        },
    )
    assert kept.ok, "the placeholder was already in the replaced text"
    comment = tools.call(
        "write_file",
        {"path": "src/new.rs", "content": "// Existing tests cover the edge cases below.\npub fn f() {}\n"},
    )
    assert comment.ok and comment.data["created"] and (ws / "src/new.rs").exists()


def test_frozen_file_is_refused_and_a_change_is_tampering(ws: Path) -> None:
    tools = toolbox(ws)
    refused = tools.call("edit_file", {"path": "tests/acceptance.rs", "search": "4", "replace": "5"})
    assert not refused.ok and "tests/acceptance.rs is frozen" in refused.text
    (ws / "alias.rs").symlink_to(ws / "tests/acceptance.rs")
    via_link = tools.call("write_file", {"path": "alias.rs", "content": "fn nothing() {}\n"})
    assert not via_link.ok and "frozen" in via_link.text
    tools.frozen.check()  # unchanged: nothing happens
    (ws / "tests/acceptance.rs").write_text("// emptied by a build script\n")
    with pytest.raises(StopLoop, match="tests/acceptance.rs was changed") as stop:
        tools.frozen.check()
    assert stop.value.status == "tampered"


def test_a_tests_dir_swapped_for_a_link_counts_as_changed(ws: Path) -> None:
    """Sandboxed code could swap tests/ for a link to an identical copy outside; the check does not follow it."""
    tools = toolbox(ws)
    outside = ws.parent / "elsewhere"
    outside.mkdir()
    (outside / "acceptance.rs").write_text(ACCEPTANCE)
    (ws / "tests/acceptance.rs").unlink()
    (ws / "tests").rmdir()
    (ws / "tests").symlink_to(outside)
    assert tools.frozen.changed() == ["tests/acceptance.rs"]


def test_files_that_steer_cargo_or_rustup_are_refused(ws: Path) -> None:
    tools = toolbox(ws)
    for path in (".cargo/config.toml", "sub/.cargo/config", "rust-toolchain.toml", "rust-toolchain"):
        refused = tools.call("write_file", {"path": path, "content": "[build]\nrustc-wrapper = '/tmp/x'\n"})
        assert not refused.ok and "refused" in refused.text, path
        assert not (ws / path).exists()


def test_frozen_hash_mismatch_is_an_error(ws: Path) -> None:
    with pytest.raises(EditError, match="frozen file tests/acceptance.rs does not match its recorded sha256"):
        Frozen(ws, {"tests/acceptance.rs": "0" * 64})


def test_done_and_bad_dependency_names(ws: Path) -> None:
    tools = toolbox(ws)
    done = tools.call("done", {"summary": "adds numbers"})
    assert done.ok and done.data["done"] and done.data["summary"] == "adds numbers"
    bad = tools.call("add_dependency", {"name": "serde; rm -rf /"})
    assert not bad.ok and "is not a crate name" in bad.text
    bad_version = tools.call("add_dependency", {"name": "serde", "version": "latest"})
    assert not bad_version.ok and "is not a version requirement" in bad_version.text


@pytest.mark.slow
def test_cargo_tools_and_add_dependency_offline(ws: Path) -> None:
    require("cargo")
    tools = toolbox(ws)
    green = tools.call("run_tests", {})
    assert green.ok and green.data["green"], green.text
    assert green.text.startswith("cargo test: ok (1 passed, 0 failed")
    write = tools.call(
        "write_file",
        {"path": "src/lib.rs", "content": LIB + "pub fn parse(s: &str) -> anyhow::Result<i32> { Ok(s.parse()?) }\n"},
    )
    assert write.ok
    broken = tools.call("cargo_check", {})
    assert broken.ok and not broken.data["green"]
    assert "E0433" in broken.text and "anyhow" in broken.text
    added = tools.call("add_dependency", {"name": "anyhow"})
    print(added.text)
    assert added.ok, added.text
    assert "anyhow" in (ws / "Cargo.toml").read_text()
    fixed = tools.call("cargo_check", {})
    assert fixed.data["green"], fixed.text
    missing = tools.call("add_dependency", {"name": "no-such-crate-xyz"})
    assert not missing.ok and "no-such-crate-xyz" in missing.text


@pytest.mark.slow
def test_a_test_cannot_rewrite_the_frozen_file(ws: Path) -> None:
    """Code run by cargo test inside the sandbox can write the workspace, but not the frozen file bound read-only over it."""
    require("cargo")
    tools = toolbox(ws)
    sneaky = (
        LIB
        + '\n#[test]\nfn sneaky() {\n    std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/acceptance.rs"), "").unwrap();\n}\n'
    )
    assert tools.call("write_file", {"path": "src/lib.rs", "content": sneaky}).ok
    result = tools.call("run_tests", {"filter": "sneaky"})
    assert not result.data["green"] and "Read-only file system" in result.text, result.text
    assert (ws / "tests/acceptance.rs").read_text() == ACCEPTANCE and tools.frozen.changed() == []


@pytest.mark.slow
def test_the_models_test_runs_start_from_the_loops_dependencies(ws: Path) -> None:
    """run_tests calls the edit stage's hook first (the loop's dependencies seeded, or seeded again after the model
    changed them), as the verdict's own `cargo test` does; a check, which builds no dependency the tests use, does not."""
    require("cargo")
    calls: list[str] = []
    tools = toolbox(ws, before_test=lambda: calls.append("seeded"))
    assert tools.call("cargo_check", {}).ok and calls == []
    assert tools.call("run_tests", {}).data["green"] and calls == ["seeded"]
    assert tools.call("run_tests", {"filter": "adds"}).ok and calls == ["seeded", "seeded"]
