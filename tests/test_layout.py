"""The package's shape: each folder imports only what its README (the folder's __init__ docstring) allows,
and no module name is used twice."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "flakebot"
# shared by every folder
LEAVES = {
    "config",
    "errors",
    "events",
    "fsutil",
    "loopback",
    "modeltext",
    "preflight",
    "redact",
    "render",
    "toolschema",
    "toolspec",
    "trust",
    "__version__",
}
# What each folder may import besides the leaves (as each folder's __init__ docstring says).
ALLOWED = {
    "sandbox": set(),
    "llm": set(),
    "crates": set(),
    "cargo": {"sandbox"},
    "pipeline": {"llm"},
    "source": {"cargo", "crates", "pipeline"},
    "agent": {"cargo", "llm", "sandbox", "source"},
    "nix": {"cargo", "sandbox", "source"},
    "deliver": {"nix", "sandbox"},
    "stages": {"agent", "cargo", "crates", "deliver", "llm", "nix", "pipeline", "sandbox", "source"},
    "evaluate": {"api", "llm", "pipeline", "sandbox", "source"},
    "services": {"api", "deliver", "nix", "sandbox"},
}
NEVER_IMPORTED = {"cli", "mcp_server"}  # the outermost callers: nothing in the library reaches back to them


def unit(module: str) -> str:
    """The folder (or top-level module) a dotted flakebot module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "flakebot"


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("flakebot"):
            names = [f"flakebot.{a.name}" for a in node.names] if node.module == "flakebot" else [node.module]
            found |= {unit(name) for name in names}
        elif isinstance(node, ast.Import):
            found |= {unit(a.name) for a in node.names if a.name.startswith("flakebot.")}
    return found


def test_each_folder_imports_only_what_its_readme_allows() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        folder = path.relative_to(PACKAGE).parts[0] if path.parent != PACKAGE else path.stem
        outside = imports_of(path) - {folder}
        if folder in ALLOWED:
            problems += [
                f"{path.relative_to(PACKAGE)} imports {name}" for name in sorted(outside - LEAVES - ALLOWED[folder])
            ]
        problems += [
            f"{path.relative_to(PACKAGE)} imports {name}"
            for name in sorted(outside & NEVER_IMPORTED)
            if folder not in ("cli", "__main__")
        ]
    assert problems == []


def test_every_folder_has_a_readme_naming_what_it_may_import() -> None:
    for folder in ALLOWED:
        docstring = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text())) or ""
        assert "May import" in docstring, folder


def test_no_module_name_is_used_twice() -> None:
    names = Counter(p.stem for p in PACKAGE.rglob("*.py") if p.stem not in ("__init__", "__main__"))
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert [name for name, count in names.items() if count > 1 or name in folders] == []


def test_few_lines_are_longer_than_120_characters() -> None:
    """The formatter wraps code at 120; only strings and comments it cannot split may run longer (the anchors stay under 1.2 %)."""
    lines = [line for path in PACKAGE.rglob("*.py") for line in path.read_text().splitlines()]
    long_lines = [line for line in lines if len(line) > 120]
    assert len(long_lines) / len(lines) < 0.012, f"{len(long_lines)} of {len(lines)} lines are over 120 characters"


def test_the_wheel_lists_every_package_and_takes_templates_from_the_top_level() -> None:
    """pyproject.toml lists the packages by hand (templates/ is mapped in as flakebot.templates): no folder left out."""
    import tomllib

    setuptools = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {"flakebot", *(f"flakebot.{p.parent.name}" for p in PACKAGE.glob("*/__init__.py"))}
    assert set(setuptools["packages"]) == folders | {"flakebot.templates"}
    assert setuptools["package-dir"] == {"flakebot.templates": "templates"}
    assert not (PACKAGE / "templates").exists()  # one copy: the top-level templates/
    for name in ("flake.nix.j2", "usage.md.j2", "acceptance.rs.j2", "prompts/edit.j2", "standin/flake.nix"):
        assert (PACKAGE.parent / "templates" / name).is_file(), name


def test_every_root_module_is_on_the_code_map() -> None:
    code_map = (PACKAGE.parent / "docs" / "code.md").read_text()
    missing = [
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py") and p.name not in code_map
    ]
    assert not missing, f"root modules not on the map in docs/code.md: {missing}"
