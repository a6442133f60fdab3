"""The package's shape: each folder imports only what its README (the folder's __init__ docstring) allows, no
import circle joins folders, and no module name is used twice."""

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
    "homes",
    "launcher",
    "longlived",
    "loopback",
    "modeltext",
    "preflight",
    "probecache",
    "processid",
    "redact",
    "render",
    "safefs",
    "tlscontext",
    "toolschema",
    "toolspec",
    "trust",
    "validation",
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
    "stages": {"agent", "cargo", "crates", "deliver", "llm", "nix", "pipeline", "sandbox", "services", "source"},
    "commands": {"crates", "deliver", "evaluate", "llm", "nix", "pipeline", "services", "source", "stages", "team"},
    "evaluate": {"llm", "pipeline", "sandbox", "source"},
    "mcp": {"api", "commands", "deliver", "pipeline", "services", "team", "validation"},
    "services": {"deliver", "nix", "sandbox"},
    "team": {"deliver", "pipeline", "validation"},
}
NEVER_IMPORTED = {"cli", "mcp"}  # the outermost callers: nothing in the library reaches back to them


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
            if folder not in ("cli", "mcp", "__main__")
        ]
    assert problems == []


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan): each holds at least one import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, set())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_between_folders() -> None:
    """Each folder of flakebot/ is a node, and each root module (api, config, ...) one of its own; an import at any
    level (inside a function or under TYPE_CHECKING too) is an arrow. No arrows may close a circle. (`__version__`,
    a constant of the package's __init__, is a node with no arrows out.)"""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        node = path.relative_to(PACKAGE).parts[0] if path.parent != PACKAGE else path.stem
        graph.setdefault(node, set()).update(imports_of(path) - {node})
    assert circles(graph) == []


def test_no_two_services_modules_import_each_other() -> None:
    """Within services/, the modules import one way (imports inside functions count)."""
    graph: dict[str, set[str]] = {}
    for path in (PACKAGE / "services").glob("*.py"):
        found = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "flakebot.services":
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flakebot.services."):
                found.add(str(node.module).split(".")[2])
            elif isinstance(node, ast.Import):
                found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("flakebot.services.")}
        found.discard(path.stem)
    assert circles(graph) == []


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


# ---------------------------------------------------------------- host file access on untrusted trees

# The modules whose host steps touch a tree someone else could have written (a workspace, a clone, a target dir, a
# dependency-cache build, a shared catalog directory): there, every write goes through flakebot.safefs.Tree.
UNTRUSTED_TREE_MODULES = [
    "agent/*.py",
    "source/*.py",
    "cargo/depcache.py",
    "cargo/cache_skeleton.py",
    "cargo/fetch.py",
    "deliver/shared.py",
    "deliver/publish.py",
    "deliver/writelayer.py",  # the caller's tree (any host program) and the tool's staged copy of it
    "deliver/toolrun.py",
    "deliver/toolcall.py",
    "deliver/outputfiles.py",  # a tool call's spilled stdout (outputs/)
    "nix/crate.py",
    "nix/devdeps.py",
    "nix/loopdeps.py",  # a deps derivation's store path (anyone who may add to the store) copied into the loop's target dir
    "stages/*.py",
]
PATH_WRITES = {"write_text", "write_bytes", "mkdir", "rename", "replace", "unlink", "rmdir", "touch", "symlink_to"}
PATH_WRITES |= {"hardlink_to", "chmod", "chown"}
OS_WRITES = {"open", "rename", "replace", "remove", "unlink", "rmdir", "mkdir", "makedirs", "chmod", "chown", "lchown"}
OS_WRITES |= {"symlink", "link", "mkfifo", "renames", "removedirs", "truncate"}
RAW_HELPERS = {"atomic_write_text", "atomic_write_json", "remove_tree"}  # flakebot.fsutil: they follow links
# The writes that remain in those modules, by (module, function): the calls allowed there and why their root is
# trusted (one flakebot made or owns, that no sandbox, repository, cache owner or tool has written when they run).
TRUSTED_ROOT_WRITES: dict[tuple[str, str], tuple[set[str], str]] = {
    # a fresh staging dir (mkdtemp) in the run's own directory: filled by copy, clone or unpack, and refused by
    # source.tree.refuse_links_leaving before any later step; the run's directory is flakebot's
    ("source/acquisition.py", "staging"): (
        {".mkdir()", ".rmdir()", ".rename()", "remove_tree"},
        "the run's directory and the fresh staging dir in it",
    ),
    # the snapshot of a built binary: a fresh mkdtemp directory of flakebot's own, outside every sandbox
    ("agent/acceptance.py", "snapshot_binary"): (
        {".chmod()", "shutil.rmtree"},
        "the fresh mkdtemp directory the snapshot is copied to (removed when the copy fails)",
    ),
    ("agent/acceptance.py", "Snapshot.remove"): ({"shutil.rmtree"}, "that mkdtemp directory, flakebot's own"),
    ("source/archive.py", "extract"): (
        {".rename()", ".rmdir()"},
        "the fresh staging dir, after tarfile's data filter refused links leaving it",
    ),
    ("source/newcrate.py", "_create"): ({".write_text()"}, "the fresh staging dir `cargo init` just filled"),
    ("source/tree.py", "copy_crate"): (
        {"shutil.copytree"},
        "a copy into the fresh staging dir (links leaving it refused right after)",
    ),
    ("source/tree.py", "strip_registry_files"): (
        {"remove_tree"},
        "the fresh staging dir; remove_tree unlinks a link, never enters it",
    ),
    ("source/tree.py", "_make_writable"): ({".chmod()"}, "the fresh staging dir just copied; links are skipped"),
    # the dependency cache's own directories: the sandbox writes only crate/ and target/ inside a build's temp dir,
    # and those go through safefs (build_entry, _drop_skeleton_outputs, _hand_to_owner, the target-dir removals)
    ("cargo/cache_skeleton.py", "CacheSkeleton.write"): (
        {".mkdir()", ".write_text()"},
        "the build's fresh temp dir, before the sandbox runs there",
    ),
    ("cargo/depcache.py", "build_entry"): (
        {".mkdir()", ".rename()", "shutil.rmtree"},
        "the cache root (flakebot's) and the build's temp dir, not target/ itself",
    ),
    ("cargo/depcache.py", "evict"): (
        {".rename()", "shutil.rmtree"},
        "entries in flakebot's cache root, handed to its own user when stored",
    ),
    ("cargo/depcache.py", "_sweep_stale"): ({"shutil.rmtree"}, "flakebot's cache root; rmtree never follows a link"),
    ("cargo/depcache.py", "copy_entry"): (
        {".mkdir()"},
        "the run's own target dir, created before the loop's sandbox runs",
    ),
    # flakebot's own CARGO_HOME (written only by host cargo) and the run's git view made from it
    ("cargo/fetch.py", "refresh_git_view"): (
        {"shutil.rmtree", ".mkdir()", "shutil.copytree", ".rename()", ".unlink()", ".write_text()"},
        "the run's git view, rebuilt from flakebot's own CARGO_HOME, and its key file beside it in the run's directory",
    ),
    ("cargo/fetch.py", "_link_or_copy"): (
        {"os.link", "shutil.copy2"},
        "the run's git view, rebuilt from flakebot's own CARGO_HOME",
    ),
    # the stages: the run's own directory and the workspace's root (flakebot's path; remove_tree unlinks a link)
    ("stages/acquire.py", "acquire_stage"): (
        {"remove_tree"},
        "the run's workspace, removed before it is acquired again",
    ),
    ("stages/locate.py", "_acquire"): ({"remove_tree"}, "the run's workspace, removed before it is acquired again"),
    ("stages/edit.py", "edit_stage"): ({"atomic_write_json"}, "edit.json in the run's directory (flakebot's)"),
    ("stages/instruct.py", "add_to_catalog"): (
        {"atomic_write_json", "atomic_write_text"},
        "manifest.json and USAGE.md in the run's directory (flakebot's)",
    ),
    # the user's own data directory and private temp dirs
    ("deliver/publish.py", "signing_key"): (
        {".mkdir()", "open(for writing)", "atomic_write_text", ".chmod()"},
        "<catalog_dir>/keys, the user's own data directory",
    ),
    ("deliver/publish.py", "_copy_to_file_cache"): (
        {".mkdir()"},
        "the cache root the file:// URL spells (the user's, as every Tree root) and the staging dir's parent, the "
        "user's own cache_dir; nothing below the cache root is written but through safefs",
    ),
    ("nix/loopdeps.py", "StoreSeeder.refresh"): (
        {"shutil.rmtree"},
        "the loop's target dir, removed whole (rmtree works on descriptors and never follows a link)",
    ),
    ("nix/loopdeps.py", "StoreSeeder._seed"): (
        {"shutil.rmtree", ".unlink()"},
        "the loop's target dir, a half copy removed whole; a refused index entry (a link in the user's own cache_dir)",
    ),
    ("nix/loopdeps.py", "indexed"): (
        {"remove_tree", ".unlink()"},
        "cache_dir/deps-derivations, the user's own cache directory: a stale entry removed, never followed",
    ),
    ("nix/loopdeps.py", "evict"): ({".unlink()"}, "GC roots in cache_dir/deps-derivations, the user's own cache"),
    ("nix/loopdeps.py", "build_deps"): ({"remove_tree"}, "the run's own work directory for the stub crate"),
    ("nix/loopdeps.py", "write_stub"): (
        {".mkdir()", ".write_text()"},
        "the stub crate in the run's work directory, written fresh by flakebot (remove_tree first)",
    ),
    ("nix/loopdeps.py", "copy_output"): (
        {"shutil.rmtree", ".unlink()", ".mkdir()", "os.open"},
        "the loop's target dir, removed whole and made again before the copy (the stamp O_EXCL|O_NOFOLLOW); the "
        "store path it copies is checked beneath a descriptor first (safefs)",
    ),
    ("deliver/outputfiles.py", "evict"): (
        {"os.unlink"},
        "outputs/ in flakebot's state dir: flakebot alone names and writes its files (a tool gives only the bytes)",
    ),
    ("deliver/shared.py", "write_entry_dir"): (
        {".mkdir()", "atomic_write_json", ".write_text()", "shutil.copytree"},
        "a private temp dir; safefs copies it into the shared cache",
    ),
}


def raw_writes(path: Path) -> list[tuple[str, str, int]]:
    """(function, call, line) of every raw file write in a module; calls on a safefs.Tree are not raw."""
    found: list[tuple[str, str, int]] = []

    def trees_in(function: ast.AST) -> set[str]:
        """Names bound to a Tree in a function: `t = Tree(...)`, `a, t = x, Tree(...)`, `with Tree(...) as t`,
        parameters typed Tree."""
        names = set()
        for node in ast.walk(function):
            if isinstance(node, ast.arg) and isinstance(node.annotation, ast.Name) and node.annotation.id == "Tree":
                names.add(node.arg)
            if isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                if is_tree(node.context_expr, set()):
                    names.add(node.optional_vars.id)
            if isinstance(node, ast.Assign):
                pairs = [(node.targets[0], node.value)]
                if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(node.targets[0].elts, node.value.elts, strict=False))
                for target, value in pairs:
                    if isinstance(target, ast.Name) and is_tree(value, set()):
                        names.add(target.id)
        return names

    def is_tree(node: ast.AST, names: set[str]) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Tree":
            return True
        return isinstance(node, ast.Name) and node.id in names

    def visit(node: ast.AST, scope: list[str], trees: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = trees | (trees_in(child) if not isinstance(child, ast.ClassDef) else set())
                visit(child, [*scope, child.name], inner)
                continue
            if isinstance(child, ast.Call):
                call = raw_call(child, trees)
                if call:
                    found.append((".".join(scope), call, child.lineno))
            visit(child, scope, trees)

    def raw_call(node: ast.Call, trees: set[str]) -> str:
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if owner == "os":
                return f"os.{func.attr}" if func.attr in OS_WRITES else ""
            if owner == "dataclasses":
                return ""
            if owner == "shutil":
                return "" if func.attr in ("which", "ignore_patterns") else f"shutil.{func.attr}"
            if func.attr in PATH_WRITES and not is_tree(func.value, trees):
                if func.attr == "replace" and len(node.args) == 2:
                    return ""  # str.replace(old, new); Path.replace takes one target
                return f".{func.attr}()"
        if isinstance(func, ast.Name):
            if func.id in RAW_HELPERS:
                return func.id
            if func.id == "open":
                mode = node.args[1] if len(node.args) > 1 else None
                mode = next((k.value for k in node.keywords if k.arg == "mode"), mode)
                if mode is not None and not (isinstance(mode, ast.Constant) and set(str(mode.value)) <= set("rbt")):
                    return "open(for writing)"
        return ""

    visit(ast.parse(path.read_text()), [], set())
    return found


def test_untrusted_trees_are_written_only_through_safefs() -> None:
    """In the modules that handle untrusted trees no raw write (Path.write_text/write_bytes/mkdir/rename/unlink,
    os.*, shutil.*, open for writing, fsutil's helpers) remains outside TRUSTED_ROOT_WRITES."""
    modules = sorted({p for pattern in UNTRUSTED_TREE_MODULES for p in PACKAGE.glob(pattern)})
    assert len(modules) > 10
    raw = [
        f"{path.relative_to(PACKAGE)}:{line} {function or '<module>'} calls {call}"
        for path in modules
        for function, call, line in raw_writes(path)
        if call not in TRUSTED_ROOT_WRITES.get((str(path.relative_to(PACKAGE)), function), (set(), ""))[0]
    ]
    assert raw == [], "write through flakebot.safefs.Tree, or say in TRUSTED_ROOT_WRITES why the root is trusted"


def test_the_raw_write_check_sees_each_kind_of_write(tmp_path: Path) -> None:
    """The check above would catch what it is there to catch (and lets Tree calls pass)."""
    module = tmp_path / "m.py"
    module.write_text(
        "import os, shutil\nfrom flakebot.safefs import Tree\n"
        "def f(p, t: Tree):\n"
        "    p.write_text('x'); (p / 'a').mkdir(); os.rename(p, p); shutil.rmtree(p); open(p, 'w'); remove_tree(p)\n"
        "    t.write_text('a', 'x'); Tree(p).mkdir('a'); tree = Tree(p); tree.rename('a', 'b'); 'a'.replace('a', 'b')\n"
        "    open(p).read(); open(p, 'rb')\n"
        "    with Tree(p) as w, open(p) as f:\n"
        "        w.unlink('a'); f.unlink()\n"
    )
    assert [call for _, call, _ in raw_writes(module)] == [
        ".write_text()",
        ".mkdir()",
        "os.rename",
        "shutil.rmtree",
        "open(for writing)",
        "remove_tree",
        ".unlink()",
    ]
