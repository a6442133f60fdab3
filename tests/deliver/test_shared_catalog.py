"""Two machines on one: a tool crafted and published on machine A is found, verified and run on machine B.

Machine B is flakebot in its own mount namespace with an empty /nix (a tmpfs: Nix starts a fresh store there),
its own XDG directories, and cargo replaced by a trap that records any call. A file:// binary cache sits between
them. B never builds: its store ends up holding only what it fetched (no .drv), the trap stays silent and B's
work directory holds no run. Caches that lie (a tampered Sig line, another key, a forged unsigned entry that Nix
itself lets in) are refused with one line."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, shout_craft_args, write_file
from flakebot import config
from flakebot.deliver.publish import signing_key
from flakebot.deliver.signatures import base32_hash, nix_base32, signed_index
from flakebot.errors import ConfigError
from tests.conftest import FLAKEBOT, json_result, require, run_cli
from tests.fakes.machines import MachineB, Step, flakebot, machine_env, on_machine_b
from tests.fakes.nix_crates import NIX

NEED = "upper-case my input"
SAME_NEED = "need a tool to upper-case my input"  # other words, the same need once normalized
OFFLINE = ["--registry", "local", "--offline"]
MCP_TOOLS = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from mcp import ClientSession, StdioServerParameters, stdio_client

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "flakebot", "mcp"], env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = [tool.name for tool in (await session.list_tools()).tools]
            called = await session.call_tool("shout", {"stdin": "via mcp\\n"})
            print(json.dumps({"names": names, "call": json.loads(called.content[0].text)}))

    asyncio.run(main())
    """
)


@dataclass
class MachineA:
    home: Path
    env: dict[str, str]
    cache: Path
    published: dict[str, Any]
    crafted: dict[str, Any]
    craft_seconds: float


def craft_and_publish(home: Path) -> MachineA:
    """Machine A crafts shout (a scripted model, real cargo and nix; a fresh marker so nix really builds) and
    publishes it to a file:// cache."""
    env = machine_env(home)
    spec, script = home / "shout.spec.json", home / "craft.json"
    spec.write_text(json.dumps(SHOUT_SPEC))
    source = f"// marker {uuid.uuid4()}\n{SHOUT_RS}"
    script.write_text(
        json.dumps({"format": 1, "stages": {"edit": [{"tool_calls": [write_file("src/main.rs", source)]}]}})
    )
    started = time.monotonic()
    crafted = json_result(run_cli(*shout_craft_args(NEED, script, spec), *OFFLINE, "--json", env=env, check=True))
    seconds = time.monotonic() - started
    assert crafted["status"] == "crafted", crafted
    cache = home / "binary-cache"
    published = json_result(run_cli("publish", "shout", "--to", f"file://{cache}", "--json", env=env, check=True))
    return MachineA(home, env, cache, published, crafted, seconds)


@pytest.fixture(scope="module")
def machine_a(tmp_path_factory: pytest.TempPathFactory) -> MachineA:
    require("nix", "cargo", "bwrap", "unshare")
    return craft_and_publish(tmp_path_factory.mktemp("machine-a"))


def trusting(machine: MachineA, cache: Path | None = None, key: str | None = None) -> str:
    """The catalogs setting (string form) trusting A's key (or `key`) for A's cache (or `cache`)."""
    return f"file://{cache or machine.cache} {key or machine.published['public_key']}"


def other_key() -> str:
    secret = subprocess.run(
        [*NIX, "key", "generate-secret", "--key-name", "someone-else-1"], capture_output=True, text=True, check=True
    )
    return subprocess.run(
        [*NIX, "key", "convert-secret-to-public"], input=secret.stdout, capture_output=True, text=True, check=True
    ).stdout.strip()


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # one clear line, no traceback
    return lines[0]


def base(path: str) -> str:
    return Path(path).name


# ---------------------------------------------------------------- the two machines


@pytest.mark.slow
def test_b_crafts_the_need_a_published_and_gets_the_tool_without_building(machine_a: MachineA, tmp_path: Path) -> None:
    store_path, entry_path = machine_a.published["store_path"], machine_a.published["entry_path"]
    # The cache holds the entry for readers and an index for finders.
    index = snapshot_of(machine_a.cache)
    record = index["tools"]["shout"]["versions"]["0.1.0"]
    assert (record["store_path"], record["entry_path"]) == (store_path, entry_path)
    shared = machine_a.cache / "flakebot" / "tools" / "shout" / "0.1.0"
    assert {p.name for p in shared.iterdir()} >= {"entry.json", "manifest.json", "USAGE.md", "schemas.json", "flake"}
    assert (shared / "flake" / "src" / "main.rs").read_text().startswith("// marker ")

    started = time.monotonic()
    b = on_machine_b(
        tmp_path / "machine-b",
        trusting(machine_a),
        [
            flakebot("craft", SAME_NEED, "--json"),
            flakebot("run", "shout", stdin="hello from b\n"),
            flakebot("show", "shout"),
            flakebot("list", "--remote", "--json"),
            Step([sys.executable, "-c", MCP_TOOLS]),
            flakebot("craft", NEED, "--json"),
        ],
    )
    crafted, ran, shown, remote, mcp, again = b.results
    assert crafted.returncode == 0, crafted.stderr
    result = json_result(crafted)
    b_seconds = time.monotonic() - started
    assert (result["status"], result["name"], result["version"]) == ("installed", "shout", "0.1.0")
    assert result["installed_from"]["catalog"] == f"file://{machine_a.cache}"
    assert result["installed_from"]["public_key"] == machine_a.published["public_key"]
    assert result["manifest"]["store_path"] == store_path
    # B's catalog paths are B's own, not A's.
    here = b.home / "data" / "flakebot" / "tools" / "shout" / "0.1.0"
    assert result["manifest"]["catalog_dir"] == str(here)
    assert result["manifest"]["flake_ref"] == str(here / "flake") == result["manifest"]["nix_run_argv"][-1]
    assert (here / "flake" / "src" / "main.rs").read_text().startswith("// marker ")

    # What ran on B: no cargo, no build (a fresh store holds no derivation), no run of the pipeline.
    assert b.cargo_calls == ""
    assert not [p for p in b.store if p.endswith(".drv")], b.store
    assert base(store_path) in b.store and base(entry_path) in b.store
    assert not (b.home / "work" / "runs").exists() or not list((b.home / "work" / "runs").iterdir())

    # The installed tool runs in the sandbox and is right.
    assert (ran.returncode, ran.stdout) == (0, "HELLO FROM B\n"), ran.stderr
    # show says which cache it came from and who signed it.
    assert f"installed from file://{machine_a.cache}" in " ".join(shown.stdout.split())
    assert machine_a.published["public_key"] in shown.stdout.replace("\n", "")
    listed = json_result(remote)["tools"]
    assert [(t["name"], t["version"], t["trusted"]) for t in listed] == [("shout", "0.1.0", True)]
    # An MCP client of B sees the installed tool as a tool, and calls it.
    answer = json.loads(mcp.stdout)
    assert "shout" in answer["names"] and answer["call"]["stdout"] == "VIA MCP\n", mcp.stderr
    # Asked again, B answers from its own catalog.
    assert json_result(again)["status"] == "cached"
    print(f"P10: B {b_seconds:.1f} s to a runnable tool / A {machine_a.craft_seconds:.1f} s craft")


# ---------------------------------------------------------------- caches that lie


def tampered_cache(machine: MachineA, tmp_path: Path) -> Path:
    copy = tmp_path / "cache-copy"
    shutil.copytree(machine.cache, copy)
    return copy


def snapshot_of(cache: Path) -> dict[str, Any]:
    """The signed snapshot the cache's index holds (its text, parsed)."""
    return dict(json.loads(json.loads((cache / "flakebot" / "index.json").read_text())["snapshot"]))


def resigned(cache: Path, machine: MachineA, old: str, new: str) -> None:
    """The cache's index with `old` replaced by `new`, signed again with A's key: a lie only A's key can tell (the
    checks behind the index's signature must hold on their own)."""
    secret = next((machine.home / "data" / "flakebot" / "keys").glob("*.secret")).read_text()
    snapshot = json.loads(json.dumps(snapshot_of(cache)).replace(old, new))
    (cache / "flakebot" / "index.json").write_text(json.dumps(signed_index(snapshot, secret)))


def narinfo(cache: Path, store_path: str) -> Path:
    return cache / f"{base(store_path).split('-')[0]}.narinfo"


def refused_on_b(
    home: Path, catalogs: str, *argv: str, code: int = 60
) -> tuple[subprocess.CompletedProcess[str], MachineB]:
    b = on_machine_b(home, catalogs, [flakebot(*argv), flakebot("list", "--json")])
    done, listed = b.results
    assert done.returncode == code, (done.stdout, done.stderr)
    assert json_result(listed)["tools"] == []  # nothing catalogued
    assert b.cargo_calls == "" and not (home / "work" / "runs").exists()
    return done, b


@pytest.mark.slow
def test_a_tampered_narinfo_signature_is_refused(machine_a: MachineA, tmp_path: Path) -> None:
    cache = tampered_cache(machine_a, tmp_path)
    info = narinfo(cache, machine_a.published["store_path"])
    lines = info.read_text().splitlines()
    at = next(n for n, line in enumerate(lines) if line.startswith("Sig: "))
    name, _, sig = lines[at].removeprefix("Sig: ").partition(":")
    lines[at] = f"Sig: {name}:{sig[:10]}{'A' if sig[10] != 'A' else 'B'}{sig[11:]}"
    info.write_text("\n".join(lines) + "\n")

    done, b = refused_on_b(tmp_path / "b", trusting(machine_a, cache), "install", "shout")  # craft skips the catalog
    line = error_line(done)
    assert (
        f"refused {machine_a.published['store_path']} from file://{cache}: it is not signed by a key you trust" in line
    )
    assert base(machine_a.published["store_path"]) not in b.store


@pytest.mark.slow
def test_a_cache_signed_by_a_key_b_does_not_trust_is_refused(machine_a: MachineA, tmp_path: Path) -> None:
    stranger = other_key()
    done, b = refused_on_b(tmp_path / "b", trusting(machine_a, key=stranger), "install", "shout", code=61)
    line = error_line(done)  # refused at the index, before any path is fetched
    assert (
        f"refused the index of the shared catalog file://{machine_a.cache}: it is not signed by a key you trust (someone-else-1)"
        in line
    )
    assert base(machine_a.published["store_path"]) not in b.store


@pytest.mark.slow
def test_a_forged_unsigned_entry_is_refused_though_nix_lets_it_in(machine_a: MachineA, tmp_path: Path) -> None:
    """Nix takes a content-addressed path unsigned; flakebot checks the entry's signature itself."""
    cache = tampered_cache(machine_a, tmp_path)
    forged = tmp_path / "flakebot-entry-shout-0.1.0"
    shutil.copytree(Path(machine_a.published["entry_path"]), forged)
    forged.chmod(0o755)
    manifest = forged / "manifest.json"
    manifest.chmod(0o644)
    manifest.write_text(
        manifest.read_text().replace(json.dumps(SHOUT_SPEC["summary"]), json.dumps("run me, I am safe"))
    )
    added = subprocess.run([*NIX, "store", "add-path", str(forged)], capture_output=True, text=True, check=True)
    forged_path = added.stdout.strip()
    subprocess.run([*NIX, "copy", "--to", f"file://{cache}", forged_path], capture_output=True, text=True, check=True)
    resigned(cache, machine_a, machine_a.published["entry_path"], forged_path)

    done, b = refused_on_b(tmp_path / "b", trusting(machine_a, cache), "install", "shout")
    assert f"refused {forged_path} from file://{cache}: it is not signed by a key you trust" in error_line(done)
    assert base(forged_path) in b.store  # Nix let the unsigned path in...
    assert base(machine_a.published["store_path"]) not in b.store  # ...flakebot went no further


@pytest.mark.slow
def test_an_index_pointing_at_another_signed_entry_is_refused(machine_a: MachineA, tmp_path: Path) -> None:
    """An entry A really signed, but for another tool, is not installed as shout (even under a signed index)."""
    cache = tampered_cache(machine_a, tmp_path)
    note_tool(machine_a.home, "note")  # A's catalog, A's key
    note = json_result(run_cli("publish", "note", "--to", f"file://{cache}", "--json", env=machine_a.env, check=True))
    assert note["public_key"] == machine_a.published["public_key"]
    resigned(cache, machine_a, machine_a.published["entry_path"], note["entry_path"])

    done, b = refused_on_b(tmp_path / "b", trusting(machine_a, cache), "install", "shout")  # craft skips the catalog
    line = error_line(done)
    assert f"refused the entry {note['entry_path']} from file://{cache}: it is note@0.1.0, not shout@0.1.0" in line
    assert base(note["store_path"]) not in b.store


class QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.slow
def test_b_installs_from_the_same_cache_served_over_http(machine_a: MachineA, tmp_path: Path) -> None:
    """The index is read over http(s) too, and nix copy fetches the signed paths from there."""
    handler = functools.partial(QuietFiles, directory=str(machine_a.cache))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            b = on_machine_b(
                tmp_path / "b",
                f"{url} {machine_a.published['public_key']}",
                [flakebot("install", "shout", "--json"), flakebot("run", "shout", stdin="over http\n")],
            )
        finally:
            server.shutdown()
    installed, ran = b.results
    assert installed.returncode == 0, installed.stderr
    assert json_result(installed)["installed_from"]["catalog"] == url
    assert (ran.returncode, ran.stdout) == (0, "OVER HTTP\n"), ran.stderr
    assert b.cargo_calls == "" and not [p for p in b.store if p.endswith(".drv")]


def test_only_configured_catalogs_are_read(tmp_path: Path) -> None:
    done = run_cli("install", "shout", "--from", f"file://{tmp_path}/cache", "--json")
    assert done.returncode == 60
    error = json.loads(done.stdout.splitlines()[-1])
    assert error["error"] == f"file://{tmp_path}/cache is not a configured catalog, so no key is trusted for it"
    assert "[[catalogs]]" in error["fix"]
    none = run_cli("list", "--remote")
    assert none.returncode == 60 and "no shared catalogs are configured" in none.stderr


# ---------------------------------------------------------------- publishers


def note_tool(home: Path, name: str) -> dict[str, str]:
    """A catalogued tool on a machine of its own whose store path is a small added file: cheap, real, publishable."""
    env = machine_env(home)
    (home / f"{name}.txt").write_text(f"{name} {uuid.uuid4()}\n")
    added = subprocess.run(
        ["nix-store", "--add", str(home / f"{name}.txt")], capture_output=True, text=True, check=True
    )
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from flakebot import config
        from flakebot.deliver.catalog import Catalog
        flake = Path({str(home / "flake")!r}); flake.mkdir(exist_ok=True); (flake / "flake.nix").write_text("{{}}\\n")
        Catalog.open(config.load()).add({name!r}, need="need {name}", flake_dir=flake,
            manifest={{"name": {name!r}, "summary": "a note", "main_program": {name!r}}}, usage_md="# {name}\\n",
            store_path={added.stdout.strip()!r}, run_id="test", origin={{}})
        """
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    return env


def test_publishers_at_once_leave_an_index_holding_every_tool(tmp_path: Path) -> None:
    require("nix")
    cache = tmp_path / "cache"
    names = [f"note{n}" for n in range(4)]
    envs = [note_tool(tmp_path / name, name) for name in names]
    # One signing key for the four (as publishers sharing a cache share one, or trust each other's in their
    # catalogs setting): each carries forward only an index it can verify.
    signing_key(config.Settings(catalog_dir=str(tmp_path / "key")))
    for name in names:
        shutil.copytree(tmp_path / "key" / "keys", tmp_path / name / "data" / "flakebot" / "keys")
    publishers = [
        subprocess.Popen(
            [*FLAKEBOT, "publish", name, "--to", f"file://{cache}", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, env in zip(names, envs, strict=True)
    ]
    for publisher in publishers:
        _, err = publisher.communicate(timeout=300)
        assert publisher.returncode == 0, err
    index = snapshot_of(cache)
    assert sorted(index["tools"]) == names
    for name in names:
        entry = json.loads((cache / "flakebot" / "tools" / name / "0.1.0" / "entry.json").read_text())
        assert entry["name"] == name and entry["store_path"] == index["tools"][name]["versions"]["0.1.0"]["store_path"]
        assert narinfo(cache, entry["store_path"]).is_file()
    assert [p.name for p in (cache / "flakebot" / "tools").iterdir() if p.name.startswith(".")] == []


# ---------------------------------------------------------------- settings and signatures


def test_catalogs_setting_from_toml_and_from_a_string(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "flakebot-a-1:" + "A" * 43 + "="
    (config.config_home()).mkdir(parents=True, exist_ok=True)
    (config.config_home() / "flakebot.toml").write_text(
        f'[[catalogs]]\nurl = "file:///srv/cache/"\nkeys = ["{key}"]\n\n[[catalogs]]\nurl = "https://c.example"\nkeys = ["{key}"]\n'
    )
    assert config.load().catalogs == (
        {"url": "file:///srv/cache", "keys": [key]},
        {"url": "https://c.example", "keys": [key]},
    )
    monkeypatch.setenv("FLAKEBOT_CATALOGS", f"file:///a {key} {key}; file:///b {key}")
    assert [c["url"] for c in config.load().catalogs] == ["file:///a", "file:///b"]
    monkeypatch.setenv("FLAKEBOT_CATALOGS", "file:///a")  # no key: nothing would be trusted
    with pytest.raises(ConfigError, match="must be a list of"):
        config.load()
    monkeypatch.setenv("FLAKEBOT_CATALOGS", "file:///a notakey")
    with pytest.raises(ConfigError, match="NAME:BASE64"):
        config.load()


def test_nix_base32_matches_nix() -> None:
    hashed = subprocess.run(
        [*NIX, "hash", "to-base32", "sha256-eq5bUCUttx/XGYhx7pnbDOPMwRqyNXc8Ip/K3sH0H+U="],
        capture_output=True,
        text=True,
    )
    assert hashed.returncode == 0, hashed.stderr
    assert base32_hash("sha256-eq5bUCUttx/XGYhx7pnbDOPMwRqyNXc8Ip/K3sH0H+U=") == "sha256:" + hashed.stdout.strip()
    assert nix_base32(b"\x00" * 32) == "0" * 52


@pytest.mark.slow
def test_a_signed_tool_this_machine_already_holds_installs_on_the_cache_signature(machine_a: MachineA) -> None:
    """The publisher's own rm then install: nix copy skips a path the store holds, whose local record carries no
    signature of the cache's key (it was built here). The cache's signatures on the same content are what count."""
    env = {**machine_a.env, "FLAKEBOT_CATALOGS": trusting(machine_a)}
    removed = run_cli("rm", "shout", "--json", env=env)
    assert removed.returncode == 0, removed.stderr
    installed = run_cli("install", "shout", "--json", env=env)
    assert installed.returncode == 0, installed.stderr  # was: "not signed by a key you trust (NAME)", NAME the key
    result = json_result(installed)
    assert result["installed_from"]["public_key"] == machine_a.published["public_key"]
    ran = run_cli("run", "shout", env=env, input="mine again\n")
    assert (ran.returncode, ran.stdout) == (0, "MINE AGAIN\n"), ran.stderr
    # A key that signed nothing here still refuses the same path.
    stranger = {**machine_a.env, "FLAKEBOT_CATALOGS": trusting(machine_a, key=other_key())}
    run_cli("rm", "shout", env=env, check=True)
    refused = run_cli("install", "shout", env=stranger)
    assert refused.returncode == 61 and "not signed by a key you trust" in error_line(refused)
