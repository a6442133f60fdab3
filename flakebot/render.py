"""Rendering flakebot's Jinja2 templates (the top-level templates/ folder, shipped as the package flakebot.templates)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any


def template_dir() -> Path:
    """The templates folder: the repository's templates/ (editable install) or the wheel's flakebot/templates/."""
    return Path(str(files("flakebot.templates")))


@cache
def _environment() -> Any:
    import jinja2

    from flakebot import modeltext

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        bytecode_cache=_bytecode_cache(jinja2),
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


def _bytecode_cache(jinja2: Any) -> Any:
    """Compiled templates kept in flakebot's own cache (keyed by each template's source): compiling a craft's seven
    templates again took 0.1-0.2 s of every craft. None when that folder cannot be made (the templates compile)."""
    from flakebot.config import cache_home

    folder = cache_home() / "templates"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder))


def render(template: str, /, **context: Any) -> str:
    """Render `template` (a path relative to the templates folder)."""
    return str(_environment().get_template(template).render(**context))
