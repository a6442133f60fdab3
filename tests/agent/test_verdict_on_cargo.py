"""flakebot's verdict on a crate built by real cargo in the sandbox: which file the examples judge.

The bin target's executable is named by cargo's compiler-artifact message on stdout, but a proc macro's own stdout
reaches cargo's stdout too (cargo passes rustc's stdout through, before the bin's real message), and the stdout kept
in the report is capped (its middle dropped). Judged from outside: the verdict, with and without the model's `done`
(the examples beside the tests on a snapshot, or after cargo on the target dir's file)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from flakebot.agent.acceptance import ACCEPTANCE_TEST, acceptance_test_names
from flakebot.agent.loop import Verdict
from flakebot.agent.verdict import make_verdict
from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.sandbox import open_sandbox
from flakebot.stages.edit import example_runner
from flakebot.toolspec import ToolSpec
from tests.conftest import require

EXAMPLES = [{"args": [], "stdout": "expected\n", "description": f"run {n}"} for n in range(3)]
SPEC = ToolSpec.from_dict({"name": "tool", "summary": "s", "usage": "tool", "examples": EXAMPLES})

# The acceptance test as a model that games it would leave it passing (here: not running the binary at all).
GAMED = "".join(f"#[test]\nfn {name}() {{}}\n" for name in acceptance_test_names(SPEC))

FORGING_MACRO = """use proc_macro::TokenStream;
#[proc_macro]
pub fn forge(_: TokenStream) -> TokenStream {
    let script = concat!(env!("DIR"), "/forged");
    std::fs::write(script, "#!/bin/sh\\necho expected\\n").unwrap();
    std::process::Command::new("chmod").args(["755", script]).status().unwrap();
    println!("{}", LINE.replace("@", script));
    "".parse().unwrap()
}
"""


# A build script that changes what it watches while it runs: cargo runs it, and so compiles the bin (the macro), anew
# for every `cargo test`.
ALWAYS_REBUILT = """fn main() {
    println!("cargo:rerun-if-changed=stamp");
    std::fs::write("stamp", format!("{:?}", std::time::SystemTime::now())).unwrap();
}
"""


# A test (run after cargo reported the bin) that writes a script passing every example over the binary.
REPLACING_TEST = """#[test]
fn replace() {
    let bin = env!("CARGO_BIN_EXE_tool");
    std::fs::write(format!("{bin}.new"), "#!/bin/sh\\necho expected\\n").unwrap();
    std::process::Command::new("chmod").args(["755", &format!("{bin}.new")]).status().unwrap();
    std::fs::rename(format!("{bin}.new"), bin).unwrap();
}
"""


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def verdicts(workspace: Path, target: Path, crate: str) -> list[Verdict]:
    """make_verdict on `workspace/crate` as the edit stage makes it (cargo in the sandbox, the examples run by the
    stage's runner), called without and with the model's `done`."""
    require("bwrap", "cargo")
    sandbox = open_sandbox("required", workspace=workspace, writable=[workspace, target], timeout=600, adopt=True)
    cargo = Cargo(target_dir=target, offline=True)
    runner = example_runner(Settings(sandbox="required"), target)

    def cargo_test(extra: list[str], on_line: Any = None) -> Any:
        return run_cargo(sandbox, cargo, "test", cwd=workspace / crate, extra=extra, on_line=on_line)

    verdict = make_verdict(cargo_test, SPEC, workspace, runner, snapshot=runner.snapshot)
    return [verdict(), verdict(True)]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


def write_macro_crates(workspace: Path, target: Path, macro: str, call: str, **extra: str) -> None:
    """A workspace of the bin `tool` and its proc macro crate `pm`: `macro` (Rust, with LINE: the bin's artifact
    message, its executable "@") sees the target dir as `env!("DIR")`, and the bin's main starts with `pm::CALL!();`."""
    line = {"reason": "compiler-artifact", "target": {"kind": ["bin"], "name": "tool"}, "profile": {"test": False},
            "executable": "@", "fresh": False}  # fmt: skip
    source = f"const LINE: &str = {json.dumps(json.dumps(line))};\n" + macro
    write(
        workspace,
        {
            "Cargo.toml": '[workspace]\nmembers = ["tool", "pm"]\nresolver = "2"\n',
            "pm/Cargo.toml": '[package]\nname = "pm"\nversion = "0.1.0"\nedition = "2021"\n[lib]\nproc-macro = true\ndoctest = false\n',
            "pm/src/lib.rs": source.replace('env!("DIR")', json.dumps(str(target))),
            "tool/Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n'
            '[dependencies]\npm = { path = "../pm" }\n',
            "tool/src/main.rs": f'pm::{call}!();\nfn main() {{ println!("wrong"); }}\n',
            "tool/build.rs": ALWAYS_REBUILT,
            f"tool/{ACCEPTANCE_TEST}": GAMED,
            **extra,
        },
    )


def test_a_proc_macros_forged_artifact_line_does_not_make_another_file_the_binary(workspace: Path) -> None:
    """The macro writes a script that passes every example into the target dir and prints an artifact message naming
    it: cargo passes it on before the bin's real one, which prints the wrong thing."""
    target = workspace.parent / "target"
    target.mkdir()
    write_macro_crates(workspace, target, FORGING_MACRO, "forge")
    for verdict in verdicts(workspace, target, "tool"):
        assert not verdict.green, "a script a proc macro wrote passed the examples in the built binary's place"
        # refused, or (a run where cargo found the bin fresh, so no macro ran) the examples judged the real binary
        refused = "named more than one file as the executable of the bin target tool" in verdict.summary
        assert refused or "got exit 0 and stdout 'wrong\\n'" in verdict.summary, verdict.summary


PLANTING_MACRO = """use proc_macro::TokenStream;
#[proc_macro]
pub fn plant(_: TokenStream) -> TokenStream {
    let bin = concat!(env!("DIR"), "/debug/tool");
    let _ = std::fs::remove_file(bin);
    std::fs::write(bin, "#!/bin/sh\\necho expected\\n").unwrap();
    std::process::Command::new("chmod").args(["755", bin]).status().unwrap();
    println!("{}", LINE.replace("@", bin));
    "".parse().unwrap()
}
"""


def test_a_proc_macro_planting_the_bin_a_test_puts_back_is_not_what_the_examples_judge(workspace: Path) -> None:
    """The macro writes a script passing every example at the bin's own path and prints the bin's message naming it:
    the copy is taken of the script; rustc then writes the real bin there (its message names the same file) and a test
    writes the same script back (REPLACING_TEST's, byte for byte), so after cargo the file holds the copy's bytes again."""
    target = workspace.parent / "target"
    (target / "debug").mkdir(parents=True)
    write_macro_crates(workspace, target, PLANTING_MACRO, "plant", **{"tool/tests/replace.rs": REPLACING_TEST})
    for verdict in verdicts(workspace, target, "tool"):
        assert not verdict.green, "a script a macro planted and a test put back passed the examples in the bin's place"


def test_a_binary_whose_build_warned_a_lot_is_still_judged(workspace: Path) -> None:
    """An honest crate whose warnings fill the head the output cap keeps: the bin's artifact message comes after
    them, in the dropped middle of the report's stdout."""
    target = workspace.parent / "target"
    unused = "".join(f"    let unused_{n} = {n};\n" for n in range(400))  # ~1 KiB of JSON each
    write(
        workspace,
        {
            "Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/main.rs": f'fn main() {{\n{unused}    println!("expected");\n}}\n',
            # compiled after the bin (it may run it): its warnings fill the tail the cap keeps
            "tests/noisy.rs": f"#[test]\nfn noisy() {{\n{unused}}}\n",
            ACCEPTANCE_TEST: GAMED,
        },
    )
    for verdict in verdicts(workspace, target, ""):
        assert verdict.green, verdict.summary


def test_a_test_printing_a_broken_doctest_message_is_not_a_crash(workspace: Path) -> None:
    """A line with cargo's `"doctest":true` that is not JSON (a JSON tool's test printing a fragment): the verdict
    still answers."""
    target = workspace.parent / "target"
    write(
        workspace,
        {
            "Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/main.rs": 'fn main() { println!("expected"); }\n',
            # written to the stdout itself: libtest keeps a passing test's println! to itself
            "tests/fragment.rs": "use std::io::Write;\n#[test]\nfn fragment() {\n"
            '    std::io::stdout().write_all(b"{\\"doctest\\":true,\\n").unwrap();\n}\n',
            ACCEPTANCE_TEST: GAMED,
        },
    )
    for verdict in verdicts(workspace, target, ""):
        assert verdict.green, verdict.summary


def test_a_test_that_replaces_the_binary_does_not_pass_the_examples_in_its_place(workspace: Path) -> None:
    """A test (run after cargo reported the bin) writes a script that passes every example over the binary, which
    prints the wrong thing: judged after cargo (no `done`) as beside it."""
    target = workspace.parent / "target"
    write(
        workspace,
        {
            "Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/main.rs": 'fn main() { println!("wrong"); }\n',
            "build.rs": ALWAYS_REBUILT,  # rebuilt for every cargo test, so there is a new file to replace
            "tests/replace.rs": REPLACING_TEST,
            ACCEPTANCE_TEST: GAMED,
        },
    )
    for verdict in verdicts(workspace, target, ""):
        assert not verdict.green, "a script a test wrote over the binary passed the examples in its place"


def test_a_forks_complete_verdict_does_not_judge_a_binary_a_test_replaced(workspace: Path) -> None:
    """Fork mode's verdict (ForkVerdict: the acceptance test first, the whole suite when it passes) holds the examples
    to the copy taken at cargo's artifact message too."""
    from flakebot.agent.verdict import ForkVerdict

    require("bwrap", "cargo")
    target = workspace.parent / "target"
    write(
        workspace,
        {
            "Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/main.rs": 'fn main() { println!("wrong"); }\n',
            "build.rs": ALWAYS_REBUILT,
            "tests/replace.rs": REPLACING_TEST,
            ACCEPTANCE_TEST: GAMED,
        },
    )
    sandbox = open_sandbox("required", workspace=workspace, writable=[workspace, target], timeout=600, adopt=True)
    cargo = Cargo(target_dir=target, offline=True)
    runner = example_runner(Settings(sandbox="required"), target)

    def cargo_test(extra: list[str], on_line: Any = None) -> Any:
        return run_cargo(sandbox, cargo, "test", cwd=workspace, extra=extra, on_line=on_line)

    fork = ForkVerdict(cargo_test, SPEC, workspace, lambda: ["tests/replace.rs"], runner, snapshot=runner.snapshot)
    for verdict in (fork.full(), fork()):
        assert not verdict.green, "a script a test wrote over the binary passed the examples in its place"


def test_a_librarys_doc_tests_run_when_its_warnings_filled_the_kept_output(workspace: Path) -> None:
    """The library's artifact message (it has doc tests) comes after its warnings, in the middle the cap drops: its
    failing doc test still runs and the verdict is red."""
    target = workspace.parent / "target"
    unused = "".join(f"    let unused_{n} = {n};\n" for n in range(400))
    write(
        workspace,
        {
            "Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n',
            "src/lib.rs": f"/// ```\n/// assert_eq!(1, 2);\n/// ```\npub fn noisy() {{\n{unused}}}\n",
            "src/main.rs": 'fn main() { println!("expected"); }\n',
            "tests/noisy.rs": f"#[test]\nfn noisy() {{\n{unused}}}\n",
            ACCEPTANCE_TEST: GAMED,
        },
    )
    for verdict in verdicts(workspace, target, ""):
        assert not verdict.green and verdict.data["failed"], verdict.summary


def test_a_claimed_verdict_says_its_tests_passed_while_its_examples_still_run(workspace: Path) -> None:
    """With the model's `done`, once cargo has ended and every test passed, `on_tested()` is called (the loop commits
    the tree then) while flakebot's own examples still run; it is not called when a test failed, nor without `done`."""
    require("bwrap", "cargo")
    target = workspace.parent / "target"
    files = {
        "Cargo.toml": '[package]\nname = "tool"\nversion = "0.1.0"\nedition = "2021"\n',
        "src/main.rs": 'fn main() { println!("expected"); }\n',
        ACCEPTANCE_TEST: GAMED,
    }
    write(workspace, files)
    sandbox = open_sandbox("required", workspace=workspace, writable=[workspace, target], timeout=600, adopt=True)
    cargo = Cargo(target_dir=target, offline=True)
    runner = example_runner(Settings(sandbox="required"), target)
    events: list[str] = []
    tested = threading.Event()

    def cargo_test(extra: list[str], on_line: Any = None) -> Any:
        report = run_cargo(sandbox, cargo, "test", cwd=workspace, extra=extra, on_line=on_line)
        events.append("cargo")
        return report

    def run_example(binary: Path, example: Any) -> Any:
        ran = runner(binary, example)
        tested.wait(10)  # an example's run ends only once the tests were said to pass (if they are)
        events.append("example")
        return ran

    def on_tested() -> None:
        events.append("tested")
        tested.set()

    verdict = make_verdict(cargo_test, SPEC, workspace, run_example, snapshot=runner.snapshot)
    assert verdict(True, on_tested).green
    assert events == ["cargo", "tested", *["example"] * len(EXAMPLES)]
    events.clear()  # `tested` stays set: the examples after cargo do not wait
    assert verdict(False, on_tested).green
    assert "tested" not in events
    write(workspace, {"tests/failing.rs": "#[test]\nfn failing() { panic!() }\n"})
    events.clear()
    assert not verdict(True, on_tested).green
    assert "tested" not in events
