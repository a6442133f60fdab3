"""Who runs a nix build's code: as root, the unprivileged `nixbld` users in Nix's sandbox, never host root.

A derivation built with flakebot's own options (command.nix_argv, host stand-in) tries to write into every host
path its sandbox binds (the system, the toolchain, RUSTUP_HOME, the crate registry) by in-sandbox path and through
a symlink; real nix, nothing mocked. A machine without the nixbld group gets a one-line error and its fix."""

from __future__ import annotations

import ast
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from flakebot.errors import NixError
from flakebot.nix import command
from flakebot.nix.standin import ensure_standin
from tests.conftest import DEBIAN_REGISTRY, require
from tests.fakes.nix_crates import directory_source, greeter, host_settings, source_settings

WRITER = """\
set -u
export PATH=/usr/bin:/bin
mkdir -p "$out"
for dir in $targets; do
  ln -s "$dir" "$NIX_BUILD_TOP/link"
  for where in "$dir" "$NIX_BUILD_TOP/link"; do
    if echo x > "$where/$name" 2>/dev/null; then verdict=wrote; else verdict=refused; fi
    echo "$verdict $where" >> "$out/report"
  done
  rm "$NIX_BUILD_TOP/link"
done
echo "uid $(id -u)" >> "$out/report"
cat "$registry"/*/Cargo.toml | head -c 1 > /dev/null && echo "registry readable" >> "$out/report"
"$toolchainBin/cargo" --version >> "$out/report"
exit 0
"""


def _root_only() -> None:
    require("nix")
    if os.geteuid() != 0:
        pytest.skip("flakebot chooses the build users only as root (a daemon's nix.conf decides otherwise)")


def test_every_nix_call_builds_as_nixbld_in_the_sandbox(tmp_path: Path) -> None:
    _root_only()
    standin = ensure_standin(host_settings(tmp_path))
    for mode in ("host", "pinned"):
        argv = [
            command.nix_program(),
            *command.FEATURES,
            "show-config",
            "--json",
            *command.machine_options(mode, standin),
        ]
        shown = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout)
        assert shown["build-users-group"]["value"] == "nixbld" and shown["sandbox"]["value"] is True, mode
        assert shown["sandbox-fallback"]["value"] is False, mode
        # a build waiting on another nix process's lock on its output looks again each second, not Nix's 5
        assert shown["build-poll-interval"]["value"] == 1, mode
    paths = command.sandbox_paths(standin)
    host = json.loads((standin / "host.json").read_text())
    assert f"/flakebot/registry={DEBIAN_REGISTRY.resolve()}" in paths
    assert all(not entry.startswith(str(Path.home())) for entry in paths), "nothing under root's home by its own path"
    run = command.run_argv(tmp_path / "flake", "host", standin)
    assert command.run_target(run) == (str(tmp_path / "flake"), "host", standin)
    assert host["registry"] == "/flakebot/registry"


def test_a_builder_cannot_write_what_its_sandbox_binds(tmp_path: Path) -> None:
    _root_only()
    standin = ensure_standin(host_settings(tmp_path))
    host = json.loads((standin / "host.json").read_text())
    name = f"flakebot-nixusers-{secrets.token_hex(6)}"  # also makes the derivation new on every run
    system = [p for p in (*command.SYSTEM_PATHS, "/usr/local/bin", "/usr/share/cargo/registry") if Path(p).is_dir()]
    targets = [*system, "/flakebot/registry", host["toolchainBin"], host["rustupHome"]]
    (tmp_path / "writer.sh").write_text(WRITER)
    expr = (
        f'derivation {{ name = "{name}"; system = "{command.nix_system()}"; builder = "{host["bash"]}"; '
        f'args = [ "-e" {tmp_path / "writer.sh"} ]; targets = "{" ".join(targets)}"; registry = "{host["registry"]}"; '
        f'toolchainBin = "{host["toolchainBin"]}"; RUSTUP_HOME = "{host["rustupHome"]}"; }}'
    )
    argv = command.nix_argv(["build"], ["--json", "--no-link", "-L", "--impure", "--expr", expr], "host", standin)
    built = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    report = Path(json.loads(built.stdout)[0]["outputs"]["out"], "report").read_text()
    assert "wrote" not in report and report.count("refused") == 2 * len(targets), report
    assert "uid 0" not in report and "registry readable" in report and "cargo " in report, report
    mounts = host["sandboxPaths"]
    on_host = [*(Path(p) for p in system), *(Path(p) for p in mounts.values())]
    assert not [p for p in on_host if (p / name).exists()]


def test_without_the_nixbld_group_the_build_is_refused_with_the_fix(tmp_path: Path) -> None:
    """The machine's group file without nixbld (a private mount namespace: the host's file is untouched)."""
    _root_only()
    require("unshare")
    groups = tmp_path / "group"
    groups.write_text(
        "".join(
            line for line in Path("/etc/group").read_text().splitlines(keepends=True) if not line.startswith("nixbld:")
        )
    )
    crate = greeter(tmp_path / "greeter")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "FLAKEBOT_WORKDIR": str(tmp_path / "work")}
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f'mount --bind {groups} /etc/group && exec "$@"', "sh"]
        + [sys.executable, "-m", "flakebot", "package", str(crate), "--nixpkgs", "host", "--registry", "local"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "the Nix build users group 'nixbld' does not exist" in done.stderr, done.stderr[-2000:]
    assert "scripts/setup.sh" in done.stderr and "groupadd" in done.stderr


def test_a_registry_the_build_users_cannot_read_is_named_with_the_fix(tmp_path: Path) -> None:
    _root_only()
    source = directory_source(tmp_path / "source", {"helper": "0.9.0"})
    source.chmod(0o700)
    standin = ensure_standin(source_settings(tmp_path, source))
    with pytest.raises(NixError) as caught:
        command.machine_options("host", standin)
    assert caught.value.message.startswith(f"{source} (seen by builds as /flakebot/registry) is not readable")
    assert caught.value.fix is not None and caught.value.fix.startswith(f"chmod o+rx {source}")


# nix commands flakebot may start without nix_argv's machine options: none of them builds anything. `run` and
# `profile` are the command lines shown to users (run_argv, install_command); flakebot's own runs of them go
# through command.run_target and nix_argv.
NEVER_BUILD = {"key", "copy", "path-info", "--add-root", "--print-fixed-path", "--version"}
SHOWN_TO_USERS = {"run": "command.py", "profile": "manifest.py"}


def _nix_command_lines() -> set[tuple[str, str]]:
    """(first word, file name) of every list in flakebot that is a nix command line: it starts with nix_program(...)
    or a literal nix program, holds FEATURES, or splices another command line (`[*run[:at], "eval", ...]`)."""
    found = set()
    for path in Path(command.__file__).parent.parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.List) or not node.elts:
                continue
            head, text = node.elts[0], ast.unparse(node)
            named = isinstance(head, ast.Constant) and head.value in ("nix", "nix-store")
            called = isinstance(head, ast.Call) and "nix_program" in ast.unparse(head.func)
            spliced = isinstance(head, ast.Starred) and isinstance(head.value, ast.Subscript)
            words = [e.value for e in node.elts[1:] if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if (named or called or spliced or "FEATURES" in text) and words:
                found.add((words[0], path.name))
    return found


def test_every_nix_call_that_can_build_takes_the_machine_options() -> None:
    """Command lines made by hand are only for commands that never build; build, run, eval, flake check and develop
    go through command.nix_argv, so none of them can build model code outside the build users and the sandbox."""
    lines = _nix_command_lines()
    assert {("key", "publish.py"), ("copy", "publish.py"), ("run", "command.py")} <= lines  # the scan sees them
    others = {(word, where) for word, where in lines if word not in NEVER_BUILD}
    assert others == set(SHOWN_TO_USERS.items()), others
