"""Which tests a fork-mode step runs after a change: `affected_targets` on real crate layouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot.agent.verdict import affected_targets
from flakebot.errors import UnsafePath


def crate(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"Cargo.toml": '[package]\nname = "demo-tool"\nversion = "0.1.0"\n', **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_source_change_selects_unit_tests_and_the_integration_tests_that_use_the_crate(tmp_path: Path) -> None:
    root = crate(
        tmp_path,
        {
            "src/lib.rs": "",
            "src/main.rs": "",
            "tests/api.rs": "use demo_tool::parse;\n",
            "tests/cli.rs": 'let exe = env!("CARGO_BIN_EXE_demo-tool");\n',
            "tests/unrelated.rs": "#[test]\nfn arithmetic() {}\n",
            "tests/flakebot_acceptance.rs": "",
        },
    )
    assert affected_targets(root, ["src/lib.rs"]) == ["--lib", "--bins", "--test", "api", "--test", "cli"]


def test_a_changed_test_file_selects_only_that_test(tmp_path: Path) -> None:
    root = crate(
        tmp_path,
        {"src/lib.rs": "", "tests/unrelated.rs": "", "tests/suite/main.rs": "mod cases;\n", "tests/suite/cases.rs": ""},
    )
    assert affected_targets(root, ["tests/unrelated.rs"]) == ["--test", "unrelated"]
    assert affected_targets(root, ["tests/suite/cases.rs"]) == ["--test", "suite"]
    assert affected_targets(root, ["README.md"]) == []


def test_declared_binaries_and_tests_count(tmp_path: Path) -> None:
    manifest = '[package]\nname = "x"\nversion = "0.1.0"\n\n[[bin]]\nname = "tool"\npath = "src/tool.rs"\n\n[[test]]\nname = "e2e"\npath = "checks/e2e.rs"\n'
    root = crate(tmp_path, {"Cargo.toml": manifest, "src/tool.rs": "", "checks/e2e.rs": 'Command::cargo_bin("tool")'})
    assert affected_targets(root, ["Cargo.toml"]) == ["--bins", "--test", "e2e"]


def test_which_tests_run_is_read_from_the_crate_alone_never_through_a_link_or_a_path_outside(tmp_path: Path) -> None:
    # the sandbox (or the model's manifest) points an integration test's sources at the host: flakebot reads nothing
    # there, so host files cannot decide (or, for a path like "/main.rs", make the host walk its whole disk)
    host = tmp_path / "host"
    host.mkdir()
    (host / "main.rs").write_text("")
    (host / "notes.rs").write_text("demo_tool::secret\n")
    manifest = f'[package]\nname = "demo-tool"\nversion = "0.1.0"\n\n[[test]]\nname = "far"\npath = "{host}/main.rs"\n'
    root = crate(tmp_path / "crate", {"Cargo.toml": manifest, "src/lib.rs": "", "tests/suite/main.rs": "mod helper;\n"})
    (root / "tests/suite/helper.rs").symlink_to(host / "notes.rs")
    assert affected_targets(root, ["src/lib.rs"]) == ["--lib"]


def test_the_crates_targets_are_listed_from_its_own_directories_never_through_a_link(tmp_path: Path) -> None:
    # a sandboxed test swaps src/bin, src/main.rs and tests for links to the host's: flakebot lists nothing there,
    # so the host's file names cannot pick which tests a step runs (here --bins and the host's tests/api.rs)
    host = tmp_path / "host"
    for rel in ("bin/deploy.rs", "main.rs", "tests/api.rs"):
        (host / rel).parent.mkdir(parents=True, exist_ok=True)
        (host / rel).write_text("fn main() {}\n")
    root = crate(tmp_path / "crate", {"src/lib.rs": ""})
    (root / "src/bin").symlink_to(host / "bin")
    (root / "src/main.rs").symlink_to(host / "main.rs")
    (root / "tests").symlink_to(host / "tests")
    assert affected_targets(root, ["src/lib.rs", "tests/api.rs"]) == ["--lib"]


def test_a_forks_crate_directory_swapped_for_a_link_to_a_host_crate_is_refused(tmp_path: Path) -> None:
    # the fork's crate is tool/ in the workspace; a sandboxed test replaced tool/ with a link to a crate of the host's:
    # its manifest and test sources are never read, so they cannot pick the tests either
    host = crate(
        tmp_path / "host",
        {"src/main.rs": "fn main() {}\n", "tests/cli.rs": 'let exe = env!("CARGO_BIN_EXE_demo-tool");\n'},
    )
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "tool").symlink_to(host)
    with pytest.raises(UnsafePath, match="tool: is a symbolic link"):
        affected_targets(workspace / "tool", ["src/main.rs"], within=workspace)
