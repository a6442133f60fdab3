"""What the model reads after `cargo test`. `CargoReport.summary()` against the raw `cargo test` output.

A small but realistic crate (a library with 20 unit tests and a doc test, a binary, 5 acceptance tests
running the binary, two leftover warnings) is broken in five typical ways: a missing import, a type
mismatch, a borrow error, failing assertions, and a renamed function used in many places. For each, with a
warm target dir as in the loop, the raw `cargo test` output (stdout + stderr, what a naive agent feeds
back) and the summary are compared in prompt tokens.

Token estimate: ceil(characters / 4), the usual rule of thumb for English and code with BPE tokenizers
(no tokenizer is installed here; both sides use the same estimator, so the ratio is what counts).

Also measured: bubblewrap's cost per command, as sandboxed / unsandboxed `cargo test` after a one-line edit.
Goal: the median of the per-case summary/raw token ratios <= 0.3 (each case is reported too; a pooled ratio
would let one long raw output hide the cases where the summary saves little).
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakebot.cargo.diagnostics import run_cargo
from flakebot.cargo.runner import Cargo
from flakebot.sandbox import BwrapSandbox, open_sandbox

GOAL_RATIO = 0.3
REGISTRY = Path("/usr/share/cargo/registry")
MANIFEST = '[package]\nname = "textstat"\nversion = "0.1.0"\nedition = "2021"\n'

LIB = """//! Small text statistics.
use std::collections::HashSet;
use std::fmt::Write;

/// Words in `text`, split on whitespace.
///
/// ```
/// assert_eq!(textstat::words("a b  c"), vec!["a", "b", "c"]);
/// ```
pub fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

pub fn word_count(text: &str) -> usize {
    words(text).len()
}

pub fn unique_words(text: &str) -> usize {
    let seen: HashSet<&str> = words(text).into_iter().collect();
    seen.len()
}

pub fn dedup_lines(text: &str) -> Vec<String> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if seen.insert(line.to_string()) {
            out.push(line.to_string());
        }
    }
    out
}

pub fn longest_word(text: &str) -> Option<&str> {
    words(text).into_iter().max_by_key(|w| w.len())
}

pub fn report(text: &str) -> String {
    let mut out = String::new();
    let unused = 0;
    writeln!(out, "words: {}", word_count(text)).unwrap();
    writeln!(out, "unique: {}", unique_words(text)).unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test] fn words_simple() { assert_eq!(words("a b"), vec!["a", "b"]); }
    #[test] fn words_empty() { assert!(words("").is_empty()); }
    #[test] fn words_tabs() { assert_eq!(words("a\\tb"), vec!["a", "b"]); }
    #[test] fn count_one() { assert_eq!(word_count("hello"), 1); }
    #[test] fn count_many() { assert_eq!(word_count("a b c d"), 4); }
    #[test] fn count_spaces() { assert_eq!(word_count("  a   b "), 2); }
    #[test] fn unique_all() { assert_eq!(unique_words("a b c"), 3); }
    #[test] fn unique_repeat() { assert_eq!(unique_words("a a b"), 2); }
    #[test] fn unique_empty() { assert_eq!(unique_words(""), 0); }
    #[test] fn dedup_keeps_order() { assert_eq!(dedup_lines("b\\na\\nb"), vec!["b", "a"]); }
    #[test] fn dedup_empty() { assert!(dedup_lines("").is_empty()); }
    #[test] fn dedup_all_same() { assert_eq!(dedup_lines("x\\nx\\nx"), vec!["x"]); }
    #[test] fn dedup_distinct() { assert_eq!(dedup_lines("x\\ny"), vec!["x", "y"]); }
    #[test] fn longest_simple() { assert_eq!(longest_word("a bbb cc"), Some("bbb")); }
    #[test] fn longest_empty() { assert_eq!(longest_word(""), None); }
    #[test] fn longest_single() { assert_eq!(longest_word("word"), Some("word")); }
    #[test] fn report_lines() { assert_eq!(report("a b a").lines().count(), 2); }
    #[test] fn report_words() { assert!(report("a b a").contains("words: 3")); }
    #[test] fn report_unique() { assert!(report("a b a").contains("unique: 2")); }
    #[test] fn report_empty() { assert!(report("").contains("words: 0")); }
}
"""

MAIN = """use std::io::Read;
use std::env;

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).unwrap();
    match std::env::args().nth(1).as_deref() {
        Some("dedup") => {
            for line in textstat::dedup_lines(&input) {
                println!("{line}");
            }
        }
        Some("longest") => println!("{}", textstat::longest_word(&input).unwrap_or("")),
        _ => print!("{}", textstat::report(&input)),
    }
}
"""

ACCEPTANCE = """use std::io::Write;
use std::process::{Command, Stdio};

fn run(args: &[&str], input: &str) -> (String, i32) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_textstat"))
        .args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (String::from_utf8(out.stdout).unwrap(), out.status.code().unwrap())
}

#[test] fn acceptance_report() { assert_eq!(run(&[], "a b a\\n"), ("words: 3\\nunique: 2\\n".to_string(), 0)); }
#[test] fn acceptance_dedup() { assert_eq!(run(&["dedup"], "x\\ny\\nx\\n"), ("x\\ny\\n".to_string(), 0)); }
#[test] fn acceptance_dedup_empty() { assert_eq!(run(&["dedup"], ""), ("".to_string(), 0)); }
#[test] fn acceptance_longest() { assert_eq!(run(&["longest"], "a bbb cc"), ("bbb\\n".to_string(), 0)); }
#[test] fn acceptance_empty_report() { assert_eq!(run(&[], ""), ("words: 0\\nunique: 0\\n".to_string(), 0)); }
"""

# name -> (file, old text, new text): one typical way a model's edit breaks the crate
CASES: dict[str, tuple[str, str, str]] = {
    "missing_import": ("src/lib.rs", "use std::collections::HashSet;\n", ""),
    "type_mismatch": ("src/lib.rs", "    seen.len()\n}", "    seen.len().to_string()\n}"),
    "borrow_error": (
        "src/lib.rs",
        "            out.push(line.to_string());",
        "            let owned = line.to_string();\n            out.push(owned);\n            seen.insert(owned);",
    ),
    "failing_assertions": (
        "src/lib.rs",
        "if seen.insert(line.to_string()) {",
        'if seen.insert(line.to_string()) || line.is_empty() || line == "x" {',
    ),
    "renamed_function": ("src/lib.rs", "pub fn words(", "pub fn tokens("),
}


def estimate_tokens(text: str) -> int:
    """Prompt tokens, estimated as ceil(characters / 4)."""
    return math.ceil(len(text) / 4)


def write_crate(root: Path) -> None:
    for rel, text in {
        "Cargo.toml": MANIFEST,
        "src/lib.rs": LIB,
        "src/main.rs": MAIN,
        "tests/acceptance.rs": ACCEPTANCE,
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def apply_case(root: Path, case: str) -> None:
    write_crate(root)
    rel, old, new = CASES[case]
    text = (root / rel).read_text()
    assert old in text, f"{case}: {old!r} not in {rel}"
    (root / rel).write_text(text.replace(old, new, 1))


def _raw(sandbox: BwrapSandbox, cargo: Cargo, crate: Path) -> str:
    result = sandbox.run(cargo.argv("test", "--no-fail-fast"), cwd=crate, env=cargo.env())
    return result.stdout + result.stderr


def _case_figures(sandbox: BwrapSandbox, cargo: Cargo, crate: Path, case: str) -> dict[str, Any]:
    apply_case(crate, case)
    raw = _raw(sandbox, cargo, crate)
    start = time.perf_counter()
    report = run_cargo(sandbox, cargo, "test", cwd=crate)
    summary = report.summary()
    return {
        "raw_tokens": estimate_tokens(raw),
        "summary_tokens": estimate_tokens(summary),
        "ratio": round(estimate_tokens(summary) / max(estimate_tokens(raw), 1), 3),
        "errors": report.error_count,
        "failed_tests": report.failed,
        "codes": sorted({d.code for d in report.errors}),
        "seconds": round(time.perf_counter() - start, 3),
    }


def _one_line_edit(crate: Path) -> None:
    lib = crate / "src/lib.rs"
    lib.write_text(lib.read_text() + f"// edit {time.time_ns()}\n")


def _sandbox_overhead(sandbox: BwrapSandbox, cargo: Cargo, crate: Path, edits: int) -> dict[str, Any]:
    """Median `cargo test` seconds after a one-line edit, unsandboxed and in bubblewrap (interleaved)."""
    write_crate(crate)
    argv, env = cargo.argv("test", "--no-fail-fast"), cargo.env()
    plain = open_sandbox("off", workspace=crate, writable=[cargo.target_dir])
    samples: dict[str, list[float]] = {"raw": [], "sandboxed": []}
    for _ in range(edits):
        for kind, box in (("raw", plain), ("sandboxed", sandbox)):
            _one_line_edit(crate)
            start = time.perf_counter()
            box.run(argv, cwd=crate, env=env)
            samples[kind].append(time.perf_counter() - start)
    raw, boxed = statistics.median(samples["raw"]), statistics.median(samples["sandboxed"])
    return {
        "raw_cargo_test_s": round(raw, 3),
        "sandboxed_cargo_test_s": round(boxed, 3),
        "ratio": round(boxed / raw, 3),
        "start_overhead_s": sandbox.start_overhead,
    }


def run(edits: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-diag-") as tmp:
        crate, target = Path(tmp) / "textstat", Path(tmp) / "target"
        write_crate(crate)
        sandbox = open_sandbox("required", workspace=crate, writable=[target])
        assert isinstance(sandbox, BwrapSandbox)
        cargo = Cargo(target_dir=target, offline=True, registry_dir=REGISTRY)
        warm = run_cargo(sandbox, cargo, "test", cwd=crate)  # warm target dir, as in the loop
        assert warm.ok, warm.summary()
        cases = {case: _case_figures(sandbox, cargo, crate, case) for case in CASES}
        overhead = _sandbox_overhead(sandbox, cargo, crate, edits)
        shutil.rmtree(target, ignore_errors=True)
    raw = sum(c["raw_tokens"] for c in cases.values())
    summary = sum(c["summary_tokens"] for c in cases.values())
    median = statistics.median(c["ratio"] for c in cases.values())
    return {
        "token_estimator": "ceil(chars / 4)",
        "cases": cases,
        "raw_tokens": raw,
        "summary_tokens": summary,
        "pooled_ratio": round(summary / raw, 3),
        "ratio": round(median, 3),  # the figure: median of the per-case ratios
        "cases_over_goal": sorted(name for name, c in cases.items() if c["ratio"] > GOAL_RATIO),
        "goal_ratio": GOAL_RATIO,
        "met": median <= GOAL_RATIO,
        "sandbox_overhead": overhead,
    }


@dataclass(frozen=True, kw_only=True)
class TokenCase:
    raw_tokens: int
    summary_tokens: int
    ratio: float
    errors: int
    failed_tests: int
    codes: list[str]
    seconds: float


@dataclass(frozen=True, kw_only=True)
class SandboxOverhead:
    raw_cargo_test_s: float
    sandboxed_cargo_test_s: float
    ratio: float
    start_overhead_s: float


@dataclass(frozen=True, kw_only=True)
class DiagnosticsResult:
    """run()'s result, as report.json holds it (cases by name)."""

    token_estimator: str
    cases: dict[str, TokenCase]
    raw_tokens: int
    summary_tokens: int
    pooled_ratio: float | None = None
    ratio: float
    cases_over_goal: list[str] = field(default_factory=list)
    goal_ratio: float
    met: bool
    sandbox_overhead: SandboxOverhead


RESULT = DiagnosticsResult


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
