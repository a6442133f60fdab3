"""ToolSpec validation, --spec files, and the generated acceptance test run by real cargo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flakebot.agent.acceptance import ACCEPTANCE_TEST, rust_str, write_acceptance_test
from flakebot.cargo.runner import Cargo
from flakebot.errors import SpecError, UsageError
from flakebot.toolspec import ToolSpec, load_spec_file

UPPER_SPEC = {
    "name": "shout",
    "summary": "Upper-case text",
    "usage": "shout [--exclaim] [FILE]",
    "examples": [
        {"args": [], "stdin": "hi there\n", "stdout": "HI THERE\n", "exit_code": 0},
        {"args": ["--exclaim"], "stdin": 'a "quoted"\tline\n', "stdout": 'A "QUOTED"\tLINE!\n', "exit_code": 0},
        {
            "args": ["in.txt"],
            "files": {"in.txt": "from ünïcode file\n"},
            "stdout": "FROM ÜNÏCODE FILE\n",
            "exit_code": 0,
        },
        {"args": ["missing.txt"], "stdout": "", "exit_code": 2},
    ],
}

SHOUT_MAIN = r"""
use std::io::Read;
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let exclaim = args.iter().any(|a| a == "--exclaim");
    let file = args.iter().find(|a| !a.starts_with("--"));
    let text = match file {
        Some(path) => match std::fs::read_to_string(path) { Ok(t) => t, Err(_) => std::process::exit(2) },
        None => { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap(); s }
    };
    for line in text.lines() {
        println!("{}{}", line.to_uppercase(), if exclaim { "!" } else { "" });
    }
}
"""


def make_crate(root: Path, main_rs: str) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "Cargo.toml").write_text('[package]\nname = "shout"\nversion = "0.1.0"\nedition = "2021"\n')
    (root / "src/main.rs").write_text(main_rs)
    return root


def cargo_test(crate: Path, target: Path) -> subprocess.CompletedProcess[str]:
    return Cargo(target, offline=True).run(["test", "--test", "flakebot_acceptance"], crate, timeout=300)


@pytest.mark.slow
def test_acceptance_test_passes_for_a_correct_tool_and_fails_for_a_wrong_one(tmp_path: Path) -> None:
    spec = ToolSpec.from_dict(UPPER_SPEC)
    good = make_crate(tmp_path / "good", SHOUT_MAIN)
    frozen = write_acceptance_test(spec, good)
    assert list(frozen) == [ACCEPTANCE_TEST] and len(frozen[ACCEPTANCE_TEST]) == 64
    result = cargo_test(good, tmp_path / "target")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test result: ok. 4 passed" in result.stdout

    wrong = make_crate(tmp_path / "wrong", SHOUT_MAIN.replace("to_uppercase", "to_lowercase"))
    write_acceptance_test(spec, wrong)
    result = cargo_test(wrong, tmp_path / "target")
    assert result.returncode != 0
    assert "3 failed" in result.stdout  # only the missing-file example still passes


def test_rust_string_literal_escapes() -> None:
    assert rust_str('a"b\\c\nd\te') == '"a\\"b\\\\c\\nd\\te"'
    assert rust_str("\x01é") == '"\\u{1}é"'


def test_spec_validation_names_every_problem() -> None:
    bad = dict(UPPER_SPEC, name="Shout Tool", examples=UPPER_SPEC["examples"][:2])
    with pytest.raises(SpecError) as caught:
        ToolSpec.from_dict(bad)
    assert "kebab-case" in caught.value.message and "3 to 6" in caught.value.message
    escaping = dict(
        UPPER_SPEC,
        examples=[*UPPER_SPEC["examples"][:3], {"args": [], "files": {"../x": ""}, "stdout": "", "exit_code": 0}],
    )
    with pytest.raises(SpecError, match="relative"):
        ToolSpec.from_dict(escaping)


def test_spec_file_json_and_toml(tmp_path: Path) -> None:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(UPPER_SPEC))
    assert load_spec_file(path).name == "shout"
    toml = tmp_path / "spec.toml"
    toml.write_text(
        'name = "shout"\nsummary = "s"\nusage = "u"\n'
        + "".join('[[examples]]\nargs = []\nstdout = ""\nexit_code = 0\n' for _ in range(3))
    )
    assert len(load_spec_file(toml).examples) == 3
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(UsageError, match="does not parse"):
        load_spec_file(broken)
