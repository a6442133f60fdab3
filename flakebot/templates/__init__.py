"""Jinja2 templates shipped inside the package (flake.nix.j2, usage.md.j2, prompts/*.j2, ...)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


@cache
def _environment() -> Any:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(template: str, /, **context: Any) -> str:
    """Render `template` (a path relative to this folder)."""
    return str(_environment().get_template(template).render(**context))
