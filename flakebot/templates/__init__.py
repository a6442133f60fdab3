"""Jinja2 templates shipped inside the package (flake.nix.j2, usage.md.j2, prompts/*.j2, ...)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


@cache
def _environment() -> Any:
    import jinja2

    from flakebot import modeltext

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    # Model text goes through these wherever a template shows it (flakebot.modeltext says why).
    env.filters.update(
        fenced=modeltext.fenced,
        md=modeltext.markdown,
        code=modeltext.inline_code,
        comment=modeltext.comment,
        one_line=modeltext.one_line,
    )
    return env


def render(template: str, /, **context: Any) -> str:
    """Render `template` (a path relative to this folder)."""
    return str(_environment().get_template(template).render(**context))
