"""Cargo diagnostics from real compiler errors and real test failures, run in the real sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from flakebot.cargo.diagnostics import MAX_DIAGNOSTICS, CargoReport, cut_middle, run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.errors import UsageError
from flakebot.sandbox import open_sandbox
from tests.conftest import DEBIAN_REGISTRY, require

MANIFEST = '[package]\nname = "demo"\nversion = "0.1.0"\nedition = "2021"\n'


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("target")  # shared: the crates below compile incrementally


def cargo_on(
    crate: Path, target: Path, subcommand: str, lib: str, *, manifest: str = MANIFEST, extra: list[str] | None = None
) -> CargoReport:
    require("bwrap", "cargo")
    crate.mkdir(exist_ok=True)
    (crate / "src").mkdir(exist_ok=True)
    (crate / "Cargo.toml").write_text(manifest)
    (crate / "src/lib.rs").write_text(lib)
    sandbox = open_sandbox(
        "required", workspace=crate, writable=[target], readable=[DEBIAN_REGISTRY], timeout=300, adopt=True
    )
    cargo = Cargo(target_dir=target, offline=True, registry_dir=DEBIAN_REGISTRY)
    report = run_cargo(sandbox, cargo, subcommand, cwd=crate, extra=extra)
    print(report.summary())
    return report


def raw_json_count(crate: Path, target: Path, code: str) -> int:
    """How often cargo's own JSON output repeats a diagnostic code (outside any sandbox)."""
    cargo = Cargo(target_dir=target, offline=True, registry_dir=DEBIAN_REGISTRY)
    result = cargo.run(["test", "--no-run", "--message-format=json"], crate)
    return result.stdout.count(f'"code":"{code}"')


@pytest.mark.slow
def test_missing_import_and_type_mismatch(tmp_path: Path, target: Path) -> None:
    lib = "pub fn total(xs: &[i32]) -> usize {\n    let m: HashMap<i32, i32> = HashMap::new();\n    let s: String = 5;\n    count + xs.len()\n}\n"
    report = cargo_on(tmp_path / "demo", target, "test", lib)
    assert not report.ok and report.error_count == 4
    summary = report.summary()
    for code in ("E0425", "E0433", "E0308"):
        assert f"error[{code}]" in summary
    # rendered, with the source line
    assert "src/lib.rs:3:21" in summary and "expected `String`, found integer" in summary
    assert summary.count("error[E0308]") == 1, "deduplicated"
    assert summary.count("cannot find type `HashMap`") == 1, "a repeated message is rendered once"
    assert "  also at src/lib.rs:2:32 (error[E0433]): let m: HashMap<i32, i32> = HashMap::new();" in summary
    assert not [line for line in summary.splitlines() if line.strip() in ("", "|")], "no empty gutter lines"
    assert raw_json_count(tmp_path / "demo", target, "E0308") >= 2, "cargo itself reports it for lib and lib test"
    assert [d.level for d in report.diagnostics] == ["error"] * 4
    assert report.diagnostics[0].location == "src/lib.rs:2:12", "first errors first"
    assert "error[E0308] mismatched types @ src/lib.rs" in report.failure_key()
    assert report.cargo_errors == [], "'could not compile' repeats the diagnostics"


@pytest.mark.slow
def test_repeats_in_one_file_name_it_once(tmp_path: Path, target: Path) -> None:
    """A renamed function's call sites: the first rendered, the others each a line under one `also in FILE`."""
    lib = "pub fn a() -> usize {\n    old(1)\n}\npub fn b() -> usize {\n    old(2) + old(3)\n}\n"
    report = cargo_on(tmp_path / "demo", target, "build", lib)
    summary = report.summary()
    assert summary.count("cannot find function `old`") == 1
    assert "--> src/lib.rs:2:5" in summary
    assert "  also in src/lib.rs:\n    5:5: old(2) + old(3)\n    5:14: old(2) + old(3)" in summary
    assert "also at" not in summary and summary.count("src/lib.rs") == 2


@pytest.mark.slow
def test_borrow_error(tmp_path: Path, target: Path) -> None:
    lib = "pub fn f() -> usize {\n    let v = vec![1];\n    let w = v;\n    v.len() + w.len()\n}\n"
    report = cargo_on(tmp_path / "demo", target, "check", lib)
    assert report.error_count == 1 and report.errors[0].code == "E0382"
    assert "borrow of moved value: `v`" in report.summary()
    assert report.failure_key() == frozenset({"error[E0382] borrow of moved value: `v` @ src/lib.rs"})


@pytest.mark.slow
def test_failing_assertion_and_panic(tmp_path: Path, target: Path) -> None:
    lib = """
pub fn total(xs: &[i32]) -> i32 { let unused = 1; xs.iter().sum::<i32>() + 1 }

#[cfg(test)]
mod tests {
    #[test]
    fn adds() { println!("printed by the test"); assert_eq!(super::total(&[1, 2]), 3); }
    #[test]
    fn passes() {}
    #[test]
    fn indexes() { let v: Vec<i32> = vec![]; let _ = v[3]; }
    #[test]
    #[ignore]
    fn later() {}
}
"""
    report = cargo_on(tmp_path / "demo", target, "test", lib)
    assert not report.ok and report.error_count == 0 and report.warning_count == 1
    assert (report.passed, report.failed, report.ignored) == (1, 2, 1)
    failures = dict(report.failed_tests)
    assert set(failures) == {"tests::adds", "tests::indexes"}
    assert "left: 4" in failures["tests::adds"] and "right: 3" in failures["tests::adds"]
    assert "printed by the test" in failures["tests::adds"]
    assert "index out of bounds" in failures["tests::indexes"]
    assert "RUST_BACKTRACE" not in report.summary()
    assert report.summary().startswith("cargo test: FAILED (1 passed, 2 failed, 1 ignored; 1 warning)")
    assert report.failure_key() == frozenset({"test tests::adds", "test tests::indexes"})


@pytest.mark.slow
def test_green_and_broken_manifest(tmp_path: Path, target: Path) -> None:
    green = cargo_on(tmp_path / "demo", target, "test", "#[test]\nfn fine() {}\n")
    assert green.ok and green.passed == 1 and green.failure_key() == frozenset()
    assert green.summary().startswith("cargo test: ok (1 passed, 0 failed, 0 ignored)")
    broken = cargo_on(tmp_path / "demo", target, "check", "", manifest="[package\nname = 1\n")
    assert not broken.ok and broken.cargo_errors
    assert "error: unclosed table, expected `]`\n --> Cargo.toml:1:9\n  |\n1 | [package" in broken.summary()
    assert broken.failure_key() == frozenset({"cargo error: unclosed table, expected `]`"})


@pytest.mark.slow
def test_timeout_is_reported(tmp_path: Path, target: Path) -> None:
    require("bwrap", "cargo")
    crate = tmp_path / "demo"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(MANIFEST)
    (crate / "src/lib.rs").write_text(
        "#[test]\nfn slow() { std::thread::sleep(std::time::Duration::from_secs(600)); }\n"
    )
    sandbox = open_sandbox("required", workspace=crate, writable=[target], readable=[DEBIAN_REGISTRY], adopt=True)
    report = run_cargo(
        sandbox, Cargo(target_dir=target, offline=True, registry_dir=DEBIAN_REGISTRY), "test", cwd=crate, timeout=3
    )
    assert report.timed_out and not report.ok
    assert report.summary().startswith("cargo test: timed out (killed)")
    assert "timeout" in report.failure_key()


@pytest.mark.slow
def test_many_errors_are_capped(tmp_path: Path, target: Path) -> None:
    lib = "pub fn f() -> i32 {\n" + "".join(f"    let _v{i}: i32 = missing_{i};\n" for i in range(40)) + "    0\n}\n"
    report = cargo_on(tmp_path / "demo", target, "check", lib)
    assert report.error_count == 40 and len(report.diagnostics) == MAX_DIAGNOSTICS
    summary = report.summary(max_chars=3000)
    assert len(summary) <= 3000
    assert "error[E0425]: cannot find value `missing_0` in this scope" in summary
    assert "more errors not shown" in summary
    assert len(report.failure_key()) == MAX_DIAGNOSTICS + 1 and "errors: 40" in report.failure_key(), (
        "errors beyond the cap still count"
    )


def test_cut_middle_states_what_it_dropped() -> None:
    text = "\n".join(f"line {i}" for i in range(100))
    cut = cut_middle(text, 11)
    lines = cut.splitlines()
    assert len(lines) == 11
    assert lines[0] == "line 0" and lines[-1] == "line 99"
    assert lines[5] == "[... 90 lines dropped ...]"
    assert cut_middle("a\nb", 5) == "a\nb"


def test_report_from_unknown_subcommand_is_refused() -> None:
    with pytest.raises(UsageError, match="unsupported cargo subcommand 'publish'"):
        run_cargo(None, None, "publish", cwd=Path("."))  # type: ignore[arg-type]


@pytest.mark.slow
def test_crashed_test_binary_is_reported(tmp_path: Path, target: Path) -> None:
    report = cargo_on(tmp_path / "demo", target, "test", "#[test]\nfn aborts() { std::process::abort(); }\n")
    assert not report.ok and report.failed_tests == []
    assert "SIGABRT" in report.summary() and "process didn't exit successfully" in report.summary()
    assert any("test failed" in key for key in report.failure_key())
