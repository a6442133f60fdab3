"""Any packaged crate becomes an agent tool, no model needed: `flakebot package PATH --catalog`, then `flakebot run`,
`show`, `list` and the MCP tool list, with real crates built by nix (host stand-in, offline).

Each test packages a fresh source (a unique string in it), so the nix store cannot answer from an earlier run's build.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import pytest

from flakebot import api
from flakebot.errors import NixError, UsageError
from tests.conftest import DEBIAN_REGISTRY, run_cli


def _result(stdout: str) -> dict[str, Any]:
    """The {"result": ...} line of a --json command's output."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    found: dict[str, Any] = next(line["result"] for line in lines if "result" in line)
    return found


def _cargo_lock(root: Path) -> Path:
    """Debian's cargo-lock 8.0.2 with a string of its own, so this run builds it anew."""
    [registry_copy] = DEBIAN_REGISTRY.glob("cargo-lock-8.0.2")
    crate = root / "cargo-lock"
    shutil.copytree(registry_copy, crate, symlinks=False)
    for path in [crate, *crate.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    main = crate / "src" / "bin" / "cargo-lock" / "main.rs"
    main.write_text(main.read_text() + f"\n// fresh source {secrets.token_hex(8)}\n")
    return crate


@pytest.mark.slow
def test_cargo_lock_is_catalogued_at_its_usage_level_and_runs(tmp_path: Path) -> None:
    """cargo-lock 8.0.2 has no --help: its default `list` command treats it as an unknown option, prints its usage and
    exits 1. It builds, so it is catalogued at level usage with that evidence, and runs through `flakebot run`."""
    crate = _cargo_lock(tmp_path)
    packaged = run_cli("package", str(crate), "--catalog", "--nixpkgs", "host", "--offline", "--json", timeout=1500)
    assert packaged.returncode == 0, packaged.stderr[-3000:]
    result = _result(packaged.stdout)
    smoke = result["smoke"]
    assert smoke["level"] == "usage" and smoke["command"] == "cargo-lock --help" and smoke["exit_code"] == 1
    assert smoke["first_lines"][:2] == ["*** error: unrecognized option `--help`", "USAGE:"]
    assert result["catalog"]["name"] == "cargo-lock" and result["catalog"]["version"] == "0.1.0"

    shown = json.loads(run_cli("show", "cargo-lock", "--json", check=True).stdout)
    manifest = shown["result"]["manifest"] if "result" in shown else shown["manifest"]
    assert manifest["smoke"]["level"] == "usage" and manifest["packaged"] == {"crate": "cargo-lock", "version": "8.0.2"}
    assert {p["flag"] for p in manifest["parameters"]} >= {"--file", "--package"}  # read from the usage it printed
    usage_md = Path(manifest["catalog_dir"], "USAGE.md").read_text()
    assert "## Smoke run: level `usage`" in usage_md and "cargo-lock --help" in usage_md
    human = run_cli("show", "cargo-lock", check=True).stdout
    assert "smoke level: usage" in " ".join(human.split())

    lock = tmp_path / "data" / "Cargo.lock"
    lock.parent.mkdir()
    lock.write_text(
        'version = 3\n\n[[package]]\nname = "alpha"\nversion = "1.2.3"\n\n[[package]]\nname = "beta"\nversion = "0.4.0"\n'
    )
    ran = run_cli("run", "cargo-lock", "--", "list", "-f", str(lock))
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "- alpha 1.2.3\n- beta 0.4.0\n"
    assert "cargo-lock" in [t["name"] for t in api.list_tools()["tools"]]
    assert "cargo-lock" in [d["name"] for d in api.tool_definitions()]  # what `flakebot mcp` lists

    strict = run_cli("package", str(crate), "--strict-smoke", "--nixpkgs", "host", "--offline", timeout=1500)
    assert strict.returncode == NixError.exit_code
    assert "smoke run failed: 'cargo-lock --help' exited 1" in strict.stderr


LOOKUP_MAIN = r"""
use std::process::exit;

// Looks its user up before it reads its arguments, as pleaser's `please` does.
fn main() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or("?")
        .to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let user = passwd.lines().map(|line| line.split(':').collect::<Vec<_>>()).find(|f| f.len() > 2 && f[2] == uid);
    let Some(user) = user else {
        eprintln!("lookup: no user has uid {uid}");
        exit(2);
    };
    if std::env::args().any(|a| a == "--help") {
        println!("MARKER prints the user it runs as\n\nUsage: lookup [OPTIONS]\n\nOptions:\n  -u, --uid  Print the uid too\n  -h, --help  Print help");
        return;
    }
    let with_uid = std::env::args().any(|a| a == "--uid" || a == "-u");
    println!("MARKER: {}{}", user[0], if with_uid { format!(" ({uid})") } else { String::new() });
}
"""


@pytest.mark.slow
def test_a_tool_that_looks_up_its_user_is_catalogued_from_package_and_runs(tmp_path: Path) -> None:
    marker = f"lookup-{secrets.token_hex(6)}"
    crate = tmp_path / "look_up"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(
        '[package]\nname = "look_up"\nversion = "0.2.0"\nedition = "2021"\ndescription = "Says which user runs it"\n'
    )
    (crate / "src" / "main.rs").write_text(LOOKUP_MAIN.replace("MARKER", marker))
    out = api.package(str(crate), nixpkgs="host", offline=True, catalog=True)
    assert out.smoke["level"] == "help" and out.catalog["name"] == "look-up"  # the binary look_up, in kebab-case
    assert run_cli("list").stdout.count("look-up") == 1

    ran = run_cli("run", "look-up", "--", "--uid")
    assert ran.returncode == 0, ran.stderr
    said = re.fullmatch(rf"{marker}: (\S+) \((\d+)\)\n", ran.stdout)
    assert said, ran.stdout  # the sandbox's /etc/passwd names the uid it runs as (a fresh one per flakebot process)
    manifest = api.tool_manifest("look-up")
    assert manifest["summary"] == "Says which user runs it" and manifest["smoke"]["level"] == "help"
    assert [p["flag"] for p in manifest["parameters"]] == ["--uid"]  # read from its --help
    called = api.call_tool("look-up", {"uid": True})
    assert called.exit_code == 0 and called.stdout.startswith(f"{marker}: {said.group(1)} (")


@pytest.mark.parametrize("name", ["../escape", "Upper", "a/b", "x_y"])
def test_a_name_that_cannot_name_a_catalogued_tool_is_refused_before_any_build(tmp_path: Path, name: str) -> None:
    """The name becomes a directory of the catalog: only kebab-case, checked before the crate is even located."""
    refused = run_cli("package", str(tmp_path / "no-such-crate"), "--catalog", "--name", name)
    assert refused.returncode == UsageError.exit_code
    assert "cannot name a catalogued tool" in refused.stderr and not (tmp_path / "no-such-crate").exists()


@pytest.mark.slow
def test_the_mcp_package_tool_catalogues_a_crate_which_becomes_an_mcp_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real MCP client over stdio: `package` with catalog, then the new tool in the list, called by schema."""
    import asyncio

    monkeypatch.setenv("FLAKEBOT_OFFLINE", "1")  # the host stand-in, as the other packaging tests

    from tests.mcp.test_server import mcp_client

    marker = f"greet-{secrets.token_hex(6)}"
    crate = tmp_path / "greet"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "greet"\nversion = "1.0.0"\nedition = "2021"\n')
    help_text = "Greets\\n\\nUsage: greet [OPTIONS]\\n\\nOptions:\\n  -n, --name <NAME>  Who to greet\\n  -h, --help  Print help"
    (crate / "src" / "main.rs").write_text(
        "fn main() {\n    let args: Vec<String> = std::env::args().collect();\n"
        f'    if args.iter().any(|a| a == "--help") {{ println!("{help_text}"); return; }}\n'
        '    let name = args.windows(2).find(|w| w[0] == "--name").map(|w| w[1].clone()).unwrap_or("world".into());\n'
        f'    println!("{marker}: hello {{name}}");\n}}\n'
    )

    async def session() -> tuple[Any, list[str], Any]:
        async with mcp_client() as client:
            arguments = {"target": str(crate), "catalog": True, "wait": True}
            packaged = await client.call("package", arguments)
            return packaged, await client.tool_names(), await client.call("greet", {"name": "agent"})

    packaged, names, called = asyncio.run(session())
    assert packaged[1] is False and packaged[0]["catalog"]["name"] == "greet", packaged
    assert packaged[0]["smoke"]["level"] == "help" and "greet" in names
    assert called == (
        {
            "tool": "greet",
            "argv": ["--name", "agent"],
            "exit_code": 0,
            "stdout": f"{marker}: hello agent\n",
            "stderr": "",
        },
        False,
    )
