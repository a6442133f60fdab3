"""Sharing tools with Nix's own machinery, for real: `flakebot publish` copies a packaged crate's closure to a
file:// binary cache (signed) or a chroot store; a second store fetches it from the cache, checks the
signature and runs the tool; builds honour Nix's remote builders (a chroot store stands in for a remote machine)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog
from flakebot.nix import command
from flakebot.nix.flake import PackageResult, package_crate
from tests.conftest import json_result, require, run_cli
from tests.fakes.nix_crates import NIX, greeter, host_settings, json_of


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> PackageResult:
    """The greeter crate packaged and built once with the host stand-in."""
    require("nix", "cargo")
    home = tmp_path_factory.mktemp("publishhome")
    return package_crate(greeter(home / "greeter"), home / "greeter-flake", host_settings(home))


def catalogue(name: str, store_path: str, flake_dir: Path, main_program: str = "") -> dict[str, Any]:
    """Put a tool into this test's catalog (the autouse fixture points the data dir at a tmp dir)."""
    manifest = {"name": name, "summary": "says hello", "main_program": main_program or name, "store_path": store_path}
    return Catalog.open(config.load()).add(
        name,
        need=f"need {name}",
        flake_dir=flake_dir,
        manifest=manifest,
        usage_md=f"# {name}\n",
        store_path=store_path,
        run_id="test",
        origin={},
    )


@pytest.fixture
def greeter_tool(built: PackageResult) -> dict[str, Any]:
    return catalogue("greeter", built.store_path, Path(built.flake_dir), built.main_program)


@pytest.fixture
def note_tool(tmp_path: Path) -> dict[str, Any]:
    """A tool whose store path is a small file added with nix-store --add: cheap, real, publishable."""
    require("nix")
    (tmp_path / "note.txt").write_text("a published note\n")
    added = subprocess.run(
        ["nix-store", "--add", str(tmp_path / "note.txt")], capture_output=True, text=True, check=True
    )
    (tmp_path / "flake").mkdir()
    return catalogue("note", added.stdout.strip(), tmp_path / "flake")


def publish(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run_cli("publish", *args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return dict(json_result(done))


def path_info(store_path: str, *store: str) -> dict[str, Any]:
    """`nix path-info --json` of one path (in the default store or `--store DIR`); {"valid": false, ...} when absent."""
    info = json_of(
        subprocess.run(
            [*NIX, "path-info", "--json", "--offline", *store, store_path], capture_output=True, text=True, timeout=60
        )
    )
    assert isinstance(info, list) and len(info) == 1
    return dict(info[0])


def nar_hash(store_path: str, *store: str) -> str:
    info = path_info(store_path, *store)
    assert info.get("valid", True), info
    return str(info["narHash"])


def keys_dir(flakebot_home: Path) -> Path:
    return flakebot_home / "data" / "flakebot" / "keys"


@pytest.mark.slow
def test_publish_to_a_file_cache_then_a_second_store_fetches_and_runs_it(
    greeter_tool: dict[str, Any], tmp_path: Path, flakebot_home: Path
) -> None:
    cache, store2 = tmp_path / "cache", tmp_path / "store2"
    store_path = greeter_tool["store_path"]
    result = publish("greeter", "--to", f"file://{cache}")

    assert (result["tool"], result["store_path"], result["to"], result["binary_cache"]) == (
        "greeter",
        store_path,
        f"file://{cache}",
        True,
    )
    assert result["paths"] >= 1 and result["closure_size"] > 0 and result["nar_hash"] == nar_hash(store_path)
    key_name, _, public = result["public_key"].partition(":")
    assert key_name == result["signed_by"] and key_name.startswith("flakebot-") and len(public) == 44
    secret = keys_dir(flakebot_home) / f"{key_name}.secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and secret.read_text().split(":")[1].strip() not in json.dumps(
        result
    )

    # A real binary cache: nix-cache-info, a narinfo signed by flakebot's key, the compressed NAR.
    assert "StoreDir: /nix/store" in (cache / "nix-cache-info").read_text()
    narinfo = (cache / f"{Path(store_path).name.split('-')[0]}.narinfo").read_text()
    assert f"StorePath: {store_path}" in narinfo and f"Sig: {key_name}:" in narinfo
    nar_url = next(line.split(": ", 1)[1] for line in narinfo.splitlines() if line.startswith("URL: "))
    assert (cache / nar_url).is_file()

    # A second store refuses the path without flakebot's public key...
    untrusted = subprocess.run(
        [*NIX, "copy", "--store", str(store2), "--from", f"file://{cache}", store_path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert untrusted.returncode != 0 and "lacks a valid signature" in untrusted.stderr
    assert path_info(store_path, "--store", str(store2))["valid"] is False
    # ...and takes it with the command publish printed (plus --store, to aim at the second store).
    argv = result["substitute_command"]["argv"]
    fetched = subprocess.run(
        [*argv[:4], "--store", str(store2), *argv[4:]], capture_output=True, text=True, timeout=120
    )
    assert fetched.returncode == 0, fetched.stderr
    assert nar_hash(store_path, "--store", str(store2)) == nar_hash(store_path)
    # The tool runs from the second store (nix shell maps the chroot store onto /nix/store).
    ran = subprocess.run(
        [*NIX, "shell", "--offline", "--store", str(store2), store_path, "-c", "greeter", "bob"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (ran.returncode, ran.stdout) == (0, "hello, bob\n"), ran.stderr
    assert result["run_command"]["argv"] == [f"{store_path}/bin/greeter"]

    # The catalog remembers the publication; publishing again reuses the same key.
    shown = json_result(run_cli("show", "greeter", "--json", check=True))
    assert shown["published"][f"file://{cache}"]["nar_hash"] == result["nar_hash"]
    again = publish("greeter", "--to", f"file://{cache}")
    assert again["public_key"] == result["public_key"] and sorted(
        p.name for p in keys_dir(flakebot_home).glob("*.secret")
    ) == [secret.name]


def test_publish_to_a_chroot_store_and_a_second_cache_keeps_both_records(
    note_tool: dict[str, Any], tmp_path: Path
) -> None:
    store3, cache = tmp_path / "store3", tmp_path / "cache"
    store_path = note_tool["store_path"]
    done = run_cli("publish", "note", "--to", str(store3))
    assert done.returncode == 0, done.stderr
    assert "published" in done.stdout and "fetch it: nix" in done.stdout
    assert nar_hash(store_path, "--store", str(store3)) == nar_hash(store_path)
    assert (store3 / "nix" / "store" / Path(store_path).name).read_text() == "a published note\n"

    signed = publish("note", "--to", f"file://{cache}")
    assert signed["paths"] == 1 and signed["closure_size"] > 0
    published = Catalog.open(config.load()).get("note")["published"]
    assert set(published) == {str(store3), f"file://{cache}"}
    assert (
        published[str(store3)]["signed_by"] is None and published[f"file://{cache}"]["signed_by"] == signed["signed_by"]
    )


@pytest.mark.parametrize(
    ("to", "says"),
    [
        ("bogus://host/x", "is not a Nix store URL"),
        ("file://relative/cache", "is not an absolute file:// URL"),
        ("", "'--to' is required"),  # every door's blank check (table.check_values)
    ],
)
def test_bad_store_urls_fail_before_anything_runs(to: str, says: str, flakebot_home: Path) -> None:
    done = run_cli("publish", "note", "--to", to)
    assert (
        done.returncode == 2
        and says in done.stderr
        and "Fix:" in done.stderr
        and len(done.stderr.strip().splitlines()) == 1
    )
    assert not keys_dir(flakebot_home).exists()


def test_unknown_tool_is_refused_and_nothing_is_written(tmp_path: Path, flakebot_home: Path) -> None:
    done = run_cli("publish", "nosuch", "--to", f"file://{tmp_path / 'cache'}")
    assert done.returncode == 60 and "no tool 'nosuch' in the catalog" in done.stderr and "flakebot list" in done.stderr
    assert not (tmp_path / "cache").exists() and not keys_dir(flakebot_home).exists()


def test_unreachable_cache_is_a_nix_error_and_records_nothing(note_tool: dict[str, Any]) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = run_cli("publish", "note", "--to", f"http://127.0.0.1:{port}", env={"NIX_CONFIG": "download-attempts = 1"})
    assert done.returncode == 50, done.stderr
    assert f"nix copy to http://127.0.0.1:{port} failed" in done.stderr and "reachable" in done.stderr
    assert "published" not in Catalog.open(config.load()).get("note")


def test_missing_store_path_and_missing_nix_are_clear(note_tool: dict[str, Any], tmp_path: Path) -> None:
    no_nix = run_cli("publish", "note", "--to", f"file://{tmp_path / 'cache'}", env={"PATH": str(tmp_path / "empty")})
    assert (
        no_nix.returncode == 50
        and "nix is not installed" in no_nix.stderr
        and "apt-get install nix-bin" in no_nix.stderr
    )
    assert not (tmp_path / "cache").exists()
    # collected since
    Catalog.open(config.load()).update("note", store_path="/nix/store/00000000000000000000000000000000-gone")
    gone = run_cli("publish", "note", "--to", f"file://{tmp_path / 'cache'}")
    assert gone.returncode == 60 and "has no built store path" in gone.stderr and "flakebot rm note" in gone.stderr


# ---------------------------------------------------------------- remote builders


def show_builders(mode: str, builders: str, nix_config: str) -> str:
    """Nix's effective `builders` for flakebot's build options, with NIX_CONFIG as the user's own setting."""
    argv = [
        command.nix_program(),
        *command.FEATURES,
        "show-config",
        "--json",
        *command.machine_options(mode, None, builders),
    ]
    shown = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "NIX_CONFIG": nix_config}
    )
    return str(json.loads(shown.stdout)["builders"]["value"])


def test_builders_setting_reaches_nix_and_nix_conf_is_left_alone() -> None:
    require("nix")
    users = "builders = ssh-ng://builder.example x86_64-linux"
    assert show_builders("pinned", "", users) == "ssh-ng://builder.example x86_64-linux"
    assert show_builders("pinned", "/srv/other x86_64-linux", users) == "/srv/other x86_64-linux"
    assert show_builders("host", "/srv/other x86_64-linux", users) == ""  # the stand-in's builds need this machine


def trivial_derivation(tmp_path: Path) -> Path:
    """A one-line derivation never built before (its name is unique), built by /bin/sh."""
    expr = tmp_path / "trivial.nix"
    expr.write_text(
        f'derivation {{ name = "remote-{uuid.uuid4().hex[:12]}"; system = builtins.currentSystem; builder = "/bin/sh";'
        ' args = [ "-c" "echo built remotely > $out; exit 0" ]; }\n'
    )
    return expr


@pytest.mark.slow
def test_pinned_build_runs_on_the_configured_builder(tmp_path: Path) -> None:
    """A chroot store listed in nix_builders acts as a remote machine: with no local build slots (--max-jobs 0)
    the build only succeeds because flakebot's options send it there."""
    require("nix")
    remote, expr = tmp_path / "remote", trivial_derivation(tmp_path)
    system = subprocess.run(
        [*NIX, "eval", "--impure", "--raw", "--expr", "builtins.currentSystem"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # /bin/sh inside the builder's chroot
    shell_paths = " ".join(p for p in ("/bin", "/usr", "/lib", "/lib64") if Path(p).exists())
    args = [
        "-f",
        str(expr),
        "--json",
        "--no-link",
        "-L",
        "--max-jobs",
        "0",
        "--option",
        "substituters",
        "",
        "--option",
        "extra-sandbox-paths",
        shell_paths,
    ]

    local_only = subprocess.run(
        command.nix_argv(["build"], args, "pinned", None), capture_output=True, text=True, timeout=120
    )
    assert local_only.returncode != 0 and "unable to start any build" in local_only.stderr

    argv = command.nix_argv(["build"], args, "pinned", None, f"{remote} {system}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"on '{remote}'" in done.stderr
    out = json.loads(done.stdout)[0]["outputs"]["out"]
    assert (remote / out.lstrip("/")).read_text() == "built remotely\n" and Path(out).read_text() == "built remotely\n"
    shutil.rmtree(remote, ignore_errors=True)
