"""The acceptance test written from the spec before any edit: rendered, named, written and frozen by hash."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from flakebot.toolspec import ToolSpec

logger = logging.getLogger(__name__)


ACCEPTANCE_TEST = "tests/flakebot_acceptance.rs"
ACCEPTANCE_TARGET = ["--test", "flakebot_acceptance"]  # cargo's selection of that test alone


def rust_str(text: str) -> str:
    """A Rust string literal for `text`."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
    body = "".join(escapes.get(ch, ch if ch.isprintable() else f"\\u{{{ord(ch):x}}}") for ch in text)
    return f'"{body}"'


def render_acceptance_test(spec: ToolSpec) -> str:
    """The integration test that holds the tool to its examples; frozen once written."""
    from flakebot.templates import render

    examples = [
        {
            "fn": fn,
            "description": e.description,
            "args": ", ".join(rust_str(a) for a in e.args),
            "stdin": rust_str(e.stdin),
            "files": ", ".join(f"({rust_str(k)}, {rust_str(v)})" for k, v in e.files.items()),
            "stdout": rust_str(e.stdout),
            "exit_code": e.exit_code,
        }
        for fn, e in zip(acceptance_test_names(spec), spec.examples, strict=True)
    ]
    return render("acceptance.rs.j2", name=spec.name, summary=spec.summary, examples=examples)


def acceptance_test_names(spec: ToolSpec) -> list[str]:
    """The #[test] function names of the acceptance test, one per example."""
    return [f"example_{i}_{_slug(e.description or ' '.join(e.args) or 'no_args')}" for i, e in enumerate(spec.examples, 1)]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "case"


def write_acceptance_test(spec: ToolSpec, crate_dir: Path) -> dict[str, str]:
    """Write the acceptance test into the crate; returns {relative path: sha256} to freeze."""
    path = crate_dir / ACCEPTANCE_TEST
    path.parent.mkdir(parents=True, exist_ok=True)
    text = render_acceptance_test(spec)
    path.write_text(text)
    return {ACCEPTANCE_TEST: hashlib.sha256(text.encode()).hexdigest()}
