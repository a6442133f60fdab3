"""A shared catalog's index is hostile input: a cache owner who rewrites it must not choose what is installed,
shown or matched.

Publisher A catalogues small real tools (a store path holding bin/NAME, a shell script saying which version it
is), publishes them with the real `flakebot publish` to a file:// binary cache, and the cache owner then
rewrites `<cache>/flakebot/index.json`: an older snapshot replayed, the current version set back, records
forged or malformed, terminal escapes in the text. Machine B (an empty Nix store of its own) runs the real
`flakebot install`, `list --remote`, `run` and `craft`, judged from outside: exit code, the one error line,
what B's store holds, what the terminal received and what ran.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flakebot.deliver import signatures
from tests.conftest import json_result, require, run_cli
from tests.fakes.machines import Step, flakebot, machine_env, on_machine_b
from tests.fakes.nix_crates import NIX

ESCAPES = "\x1b]52;c;cm0gLXJmIH4K\x07\x1b[2J\x1b]8;;https://evil.example/\x07click\x1b]8;;\x07"
INDEX_REFUSED = 61  # CatalogTrustError: an index that is unsigned, stale, rolled back or malformed


@dataclass
class Publisher:
    home: Path
    env: dict[str, str]
    cache: Path
    key: str  # the public key B trusts
    secret: Path  # the secret key file (the tests sign with it only where the publisher would)
    paths: dict[str, str]  # NAME@VERSION -> store path
    old_index: bytes  # the index as it was after the first publication (note 0.1.0 current)


def add_tool(
    env: dict[str, str],
    home: Path,
    name: str,
    version: str,
    *,
    summary: str,
    change: str = "",
    runs: str = "",
    program: str = "",
) -> str:
    """Catalogue NAME@VERSION on the publisher: a store path with bin/NAME saying `name version`. `runs`, `program`:
    the store path and program its manifest names instead (a manifest that disagrees with the entry). Returns the
    tool's store path."""
    tree = home / f"{name}-{version}-{uuid.uuid4().hex[:8]}"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / name).write_text(f"#!/bin/sh\necho '{name} {version}'\n")
    (tree / "bin" / name).chmod(0o755)
    added = subprocess.run(["nix-store", "--add", str(tree)], capture_output=True, text=True, check=True)
    store_path = added.stdout.strip()
    manifest = {"name": name, "summary": summary, "main_program": program or name, "store_path": runs or store_path}
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from flakebot import config
        from flakebot.deliver.catalog import Catalog
        flake = Path({str(tree)!r} + "-flake"); flake.mkdir(); (flake / "flake.nix").write_text("{{}}\\n")
        Catalog.open(config.load()).add({name!r}, need="need {name}", flake_dir=flake, manifest={manifest!r},
            usage_md="# {name}\\n", store_path={store_path!r}, run_id="test", origin={{}}, version={version!r},
            change={change!r})
        """
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    return store_path


def publish(publisher_env: dict[str, str], cache: Path, tool: str, **env: str) -> dict[str, Any]:
    done = run_cli("publish", tool, "--to", f"file://{cache}", "--json", env={**publisher_env, **env}, check=True)
    return dict(json_result(done))


@pytest.fixture(scope="module")
def a(tmp_path_factory: pytest.TempPathFactory) -> Publisher:
    require("nix", "bwrap", "unshare")
    home = tmp_path_factory.mktemp("publisher-a")
    env = machine_env(home)
    cache = home / "binary-cache"
    paths = {"note@0.1.0": add_tool(env, home, "note", "0.1.0", summary="notes, before the fix")}
    first = publish(env, cache, "note")
    old_index = (cache / "flakebot" / "index.json").read_bytes()
    paths["note@0.2.0"] = add_tool(env, home, "note", "0.2.0", summary="notes, fixed", change="the fix")
    publish(env, cache, "note")
    paths["loud@0.1.0"] = add_tool(env, home, "loud", "0.1.0", summary=f"shouts {ESCAPES} loudly")
    publish(env, cache, "loud")
    secret = next((home / "data" / "flakebot" / "keys").glob("*.secret"))
    return Publisher(home, env, cache, first["public_key"], secret, paths, old_index)


def copy_of(a: Publisher, tmp_path: Path, name: str = "cache") -> Path:
    """A copy of A's cache a cache owner then rewrites (A's own cache stays as published)."""
    copy = tmp_path / name
    shutil.copytree(a.cache, copy)
    return copy


def index_file(cache: Path) -> Path:
    return cache / "flakebot" / "index.json"


def trusting(cache: Path, key: str) -> str:
    return f"file://{cache} {key}"


def only_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # one clear line, no traceback
    return lines[0]


def stranger_key(tmp_path: Path) -> tuple[str, Path]:
    """A key pair nobody configured: (public key, secret key file)."""
    secret = subprocess.run(
        [*NIX, "key", "generate-secret", "--key-name", "stranger-1"], capture_output=True, text=True, check=True
    ).stdout.strip()
    public = subprocess.run(
        [*NIX, "key", "convert-secret-to-public"], input=secret, capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "stranger.secret").write_text(secret)
    return public, tmp_path / "stranger.secret"


def warned_skip(stderr: str, cache: Path) -> bool:
    """Whether the log said the catalog was skipped (the log wraps lines anywhere)."""
    return f"sharedcatalogfile://{cache}skipped" in "".join(stderr.split())


def no_escape(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text, repr(text)


# ---------------------------------------------------------------- rollback and freshness


@pytest.mark.slow
def test_a_replayed_older_index_is_refused_after_a_newer_one_was_seen(a: Publisher, tmp_path: Path) -> None:
    """The cache owner puts back the index of before the fix: B, having seen the newer one, refuses it."""
    cache = copy_of(a, tmp_path)
    old = tmp_path / "old-index.json"
    old.write_bytes(a.old_index)
    b = on_machine_b(
        tmp_path / "b",
        trusting(cache, a.key),
        [
            flakebot("list", "--remote", "--json"),
            Step(["cp", str(old), str(index_file(cache))]),
            flakebot("install", "note"),
            flakebot("run", "note"),
            flakebot("list", "--remote"),
        ],
    )
    listed, _, installed, ran, relisted = b.results
    assert [(t["name"], t["version"], t["current"]) for t in json_result(listed)["tools"] if t["name"] == "note"] == [
        ("note", "0.1.0", False),
        ("note", "0.2.0", True),
    ]
    assert installed.returncode == INDEX_REFUSED, (installed.stdout, installed.stderr)
    line = only_line(installed)
    assert line.startswith("error: ") and f"file://{cache}" in line and "Fix:" in line
    assert "older" in line or "rollback" in line
    assert ran.returncode != 0 and "note 0.1.0" not in ran.stdout  # the old version never ran
    assert Path(a.paths["note@0.1.0"]).name not in b.store
    assert relisted.returncode == INDEX_REFUSED and only_line(relisted) == line


@pytest.mark.slow
def test_setting_the_current_version_back_is_refused(a: Publisher, tmp_path: Path) -> None:
    """The cache owner edits the index's current version back to 0.1.0 (a rollback past the fix)."""
    cache = copy_of(a, tmp_path)
    text = index_file(cache).read_text()
    for before, after in (
        ('"version": "0.2.0"', '"version": "0.1.0"'),
        (r"\"version\":\"0.2.0\"", r"\"version\":\"0.1.0\""),
    ):
        text = text.replace(before, after, 1)  # the index as main wrote it, or inside the signed snapshot's text
    assert text != index_file(cache).read_text()
    index_file(cache).write_text(text)
    b = on_machine_b(tmp_path / "b", trusting(cache, a.key), [flakebot("install", "note"), flakebot("run", "note")])
    installed, ran = b.results
    assert installed.returncode == INDEX_REFUSED, (installed.stdout, installed.stderr)
    assert f"file://{cache}" in only_line(installed)
    assert "note 0.1.0" not in ran.stdout
    assert Path(a.paths["note@0.1.0"]).name not in b.store


@pytest.mark.slow
def test_an_expired_index_is_refused(a: Publisher, tmp_path: Path) -> None:
    """A frozen index (its expiry passed, nobody renewed it) is refused; publishing again renews it."""
    cache = tmp_path / "short-lived"
    publish(a.env, cache, "note", FLAKEBOT_SHARED_INDEX_LIFETIME="1")
    time.sleep(2)
    b = on_machine_b(tmp_path / "b", trusting(cache, a.key), [flakebot("install", "note")])
    (installed,) = b.results
    assert installed.returncode == INDEX_REFUSED, (installed.stdout, installed.stderr)
    line = only_line(installed)
    assert "expired" in line and f"file://{cache}" in line and "publish" in line.partition("Fix:")[2]
    assert Path(a.paths["note@0.2.0"]).name not in b.store
    publish(a.env, cache, "note")
    b = on_machine_b(tmp_path / "b2", trusting(cache, a.key), [flakebot("install", "note", "--json")])
    assert b.results[0].returncode == 0, b.results[0].stderr


def test_a_reset_sequence_signed_by_a_stranger_is_refused(a: Publisher, tmp_path: Path) -> None:
    """Variant: a fresh index with sequence 1, well formed and signed, but by a key nobody configured."""
    cache = copy_of(a, tmp_path)
    _, secret = stranger_key(tmp_path)
    snapshot = json.loads(json.loads(index_file(cache).read_text())["snapshot"])
    snapshot["sequence"] = 1
    forged = signatures.signed_index(snapshot, secret.read_text())
    index_file(cache).write_text(json.dumps(forged))
    listed = run_cli("list", "--remote", env={"FLAKEBOT_CATALOGS": trusting(cache, a.key)})
    assert listed.returncode == INDEX_REFUSED
    line = only_line(listed)
    assert f"file://{cache}" in line and "not signed by a key you trust" in line


# ---------------------------------------------------------------- forged and malformed indexes


def forged_index(tools: Any) -> str:
    """An index as the cache owner writes it: format 1, unsigned (what every flakebot before signing read)."""
    return json.dumps({"format": 1, "tools": tools})


MALFORMED = {
    "wrong types": {"note": "not a table", "other": {"versions": [1, 2], "version": 7, "need_key": ["x"]}},
    "huge strings": {"note": {"need": "x" * 5_000_000, "need_key": "note", "version": "0.1.0", "versions": {}}},
    "missing fields": {"note": {"need_key": "note"}, "x": {"version": "0.1.0", "versions": {"0.1.0": {}}}},
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_index_is_one_line_in_list_and_install_and_skipped_by_craft(
    a: Publisher, tmp_path: Path, case: str
) -> None:
    cache = copy_of(a, tmp_path)
    index_file(cache).write_text(forged_index(MALFORMED[case]))
    env = {"FLAKEBOT_CATALOGS": trusting(cache, a.key)}
    for argv in (["list", "--remote"], ["install", "note"]):
        done = run_cli(*argv, env=env)
        assert done.returncode == INDEX_REFUSED, (argv, done.stdout, done.stderr)
        assert only_line(done).startswith("error: ") and f"file://{cache}" in only_line(done)
    # craft skips the catalog with a warning and goes on to craft (here it stops at the model, which is missing).
    crafted = run_cli("craft", "need note", "--model", "scripted:/nonexistent/script.json", env=env)
    assert "Traceback" not in crafted.stderr
    assert crafted.returncode == 30, crafted.stderr  # ModelError: past the catalogs, at the first model use
    assert warned_skip(crafted.stderr, cache), crafted.stderr


def test_an_unsigned_record_claiming_a_trusted_signer_is_not_shown_as_signed(a: Publisher, tmp_path: Path) -> None:
    cache = copy_of(a, tmp_path)
    record = {
        "store_path": a.paths["note@0.1.0"],
        "entry_path": "/nix/store/" + "0" * 32 + "-flakebot-entry-evil-0.1.0",
        "summary": "trust me",
        "signed_by": a.key.partition(":")[0],
        "public_key": a.key,
    }
    tools = {"evil": {"name": "evil", "need": "need evil", "need_key": "evil", "version": "0.1.0"}}
    tools["evil"]["versions"] = {"0.1.0": record}  # type: ignore[assignment]
    index_file(cache).write_text(forged_index(tools))
    listed = run_cli("list", "--remote", "--json", env={"FLAKEBOT_CATALOGS": trusting(cache, a.key)})
    # main listed it with trusted: true, on the record's word; the signature is the index's, or there is none
    assert listed.returncode == INDEX_REFUSED, listed.stdout
    assert "it is not signed" in json.loads(listed.stdout.splitlines()[-1])["error"]


@pytest.mark.slow
def test_an_index_claiming_a_need_does_not_stop_a_craft(tmp_path: Path) -> None:
    """A forged index claims the need with an entry that is nowhere: craft warns, skips the catalog and crafts."""
    from benchmarks.scenarios.shout import SHOUT_RS, SHOUT_SPEC, shout_craft_args, write_file

    require("nix", "cargo", "bwrap")
    cache = tmp_path / "cache"
    (cache / "flakebot").mkdir(parents=True)
    record = {"store_path": "/nix/store/" + "1" * 32 + "-shout", "entry_path": "/nix/store/" + "2" * 32 + "-e"}
    need_key = "case input my upper"
    tools = {"shout": {"need": "upper-case my input", "need_key": need_key, "version": "0.1.0"}}
    tools["shout"]["versions"] = {"0.1.0": record}  # type: ignore[assignment]
    index_file(cache).write_text(forged_index(tools))
    key, _ = stranger_key(tmp_path)
    env = machine_env(tmp_path / "home", FLAKEBOT_CATALOGS=trusting(cache, key))
    spec, script = tmp_path / "shout.spec.json", tmp_path / "craft.json"
    spec.write_text(json.dumps(SHOUT_SPEC))
    source = f"// marker {uuid.uuid4()}\n{SHOUT_RS}"
    script.write_text(
        json.dumps({"format": 1, "stages": {"edit": [{"tool_calls": [write_file("src/main.rs", source)]}]}})
    )
    done = run_cli(
        *shout_craft_args("upper-case my input", script, spec), "--registry", "local", "--offline", "--json", env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json_result(done)["status"] == "crafted"
    assert warned_skip(done.stderr, cache), done.stderr


# ---------------------------------------------------------------- what is shown and what runs


@pytest.mark.slow
def test_remote_text_reaches_the_terminal_as_data(a: Publisher, tmp_path: Path) -> None:
    """A summary holding OSC 52 (clipboard), a screen clear and a hyperlink: none reaches the terminal."""
    b = on_machine_b(
        tmp_path / "b",
        trusting(a.cache, a.key),
        [flakebot("list", "--remote"), flakebot("install", "loud"), flakebot("show", "loud")],
    )
    for done in b.results:
        assert done.returncode == 0, done.stderr
        no_escape(done.stdout)
        no_escape(done.stderr)
    assert "shouts" in b.results[0].stdout and "loudly" in " ".join(b.results[0].stdout.split())
    usage = (b.home / "data" / "flakebot" / "tools" / "loud" / "0.1.0" / "USAGE.md").read_text()
    no_escape(usage)


@pytest.mark.slow
def test_what_runs_is_the_verified_store_path(a: Publisher, tmp_path: Path) -> None:
    """A signed entry whose manifest names another store path than its entry.json: refused, nothing catalogued."""
    cache = copy_of(a, tmp_path)
    env = machine_env(tmp_path / "publisher", FLAKEBOT_CATALOGS="")
    shutil.copytree(a.home / "data" / "flakebot" / "keys", tmp_path / "publisher" / "data" / "flakebot" / "keys")
    add_tool(env, tmp_path / "publisher", "twin", "0.1.0", summary="a twin", runs=a.paths["note@0.1.0"], program="note")
    publish(env, cache, "twin")
    b = on_machine_b(
        tmp_path / "b",
        trusting(cache, a.key),
        [
            flakebot("install", "note@0.1.0", "--json"),  # the old note is in B's store: the twin would run it
            flakebot("install", "twin"),
            flakebot("run", "twin"),
            flakebot("list", "--json"),
        ],
    )
    _, installed, ran, listed = b.results
    assert installed.returncode == 60, (installed.stdout, installed.stderr)
    assert "store path" in only_line(installed)
    assert "note 0.1.0" not in ran.stdout
    assert [t["name"] for t in json_result(listed)["tools"]] == ["note"]


# ---------------------------------------------------------------- two catalogs


@pytest.mark.slow
def test_a_second_catalog_with_the_same_tool_is_judged_by_its_own_keys(a: Publisher, tmp_path: Path) -> None:
    """Catalog C (first in the setting, its own key) copies A's cache, index and all: C's index is not signed by
    C's key, so craft skips C with a warning and installs from A; list --remote refuses C in one line."""
    c = copy_of(a, tmp_path, "c-cache")
    stranger, _ = stranger_key(tmp_path)
    catalogs = f"{trusting(c, stranger)}; {trusting(a.cache, a.key)}"
    b = on_machine_b(tmp_path / "b", catalogs, [flakebot("craft", "need note", "--json"), flakebot("list", "--remote")])
    crafted, listed = b.results
    assert crafted.returncode == 0, crafted.stderr
    result = json_result(crafted)
    assert (result["status"], result["version"]) == ("installed", "0.2.0")
    assert result["installed_from"]["catalog"] == f"file://{a.cache}"
    assert warned_skip(crafted.stderr, c), crafted.stderr
    assert listed.returncode == INDEX_REFUSED and f"file://{c}" in only_line(listed)


# ---------------------------------------------------------------- behind the signature: shape and monotonicity
# The tests below hold the catalog's key themselves (a key of their own, configured as trusted), to reach the
# checks a valid signature does not excuse: a key holder's mistakes, or a key used from two machines.

STORE = "/nix/store/" + "a" * 32


def snapshot(sequence: int = 5, **tool: Any) -> dict[str, Any]:
    record = {"store_path": f"{STORE}-note-0.1.0", "entry_path": f"{STORE}-flakebot-entry-note-0.1.0", "summary": "s"}
    note = {"name": "note", "need": "need note", "version": "0.1.0", "versions": {"0.1.0": record}, **tool}
    now = time.time()
    return {
        "type": "flakebot-catalog-index",
        "sequence": sequence,
        "published_at": now,
        "expires": now + 60,
        "tools": {"note": note},
    }


def signed_cache(tmp_path: Path, snap: dict[str, Any], secret: Path) -> Path:
    cache = tmp_path / "cache"
    (cache / "flakebot").mkdir(parents=True, exist_ok=True)
    index_file(cache).write_text(json.dumps(signatures.signed_index(snap, secret.read_text())))
    return cache


def record_of(**fields: Any) -> dict[str, Any]:
    return {"versions": {"0.1.0": {**snapshot()["tools"]["note"]["versions"]["0.1.0"], **fields}}}


SIGNED_MALFORMED: dict[str, dict[str, Any]] = {
    "summary of 3 MB": record_of(summary="x" * 3_000_000),
    "summary not text": record_of(summary={"a": 1}),
    "store path outside the store": record_of(store_path="/etc/passwd"),
    "entry path missing": {"versions": {"0.1.0": {"store_path": f"{STORE}-note-0.1.0"}}},
    "version with a newline": {
        "version": "0.1.0\n",
        "versions": {"0.1.0\n": snapshot()["tools"]["note"]["versions"]["0.1.0"]},
    },
    "current not the newest": {"version": "0.0.1"},
    "need not text": {"need": ["need", "note"]},
    "sequence true": {"__sequence": True},
    "NaN closure size": record_of(closure_size=float("nan")),
}


@pytest.mark.parametrize("case", sorted(SIGNED_MALFORMED))
def test_a_signed_but_malformed_index_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    require("nix")
    key, secret = stranger_key(tmp_path)
    fields = dict(SIGNED_MALFORMED[case])
    snap = snapshot(**{k: v for k, v in fields.items() if not k.startswith("__")})
    if "__sequence" in fields:
        snap["sequence"] = fields["__sequence"]
    cache = signed_cache(tmp_path, snap, secret)
    done = run_cli("list", "--remote", env={"FLAKEBOT_CATALOGS": trusting(cache, key)})
    assert done.returncode == INDEX_REFUSED, (done.stdout, done.stderr)
    assert "it is malformed" in only_line(done) and f"file://{cache}" in only_line(done)


def test_an_oversized_or_deeply_nested_index_is_refused_in_one_line(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "flakebot").mkdir(parents=True)
    key = "someone-1:" + "A" * 43 + "="
    for text in ('{"format": 2, "snapshot": "' + "x" * 9_000_000 + '"}', "[" * 100_000 + "]" * 100_000):
        index_file(cache).write_text(text)
        done = run_cli("list", "--remote", env={"FLAKEBOT_CATALOGS": trusting(cache, key)})
        assert done.returncode == INDEX_REFUSED, done.stderr
        assert "it is malformed" in only_line(done)


def test_what_a_machine_saw_of_a_catalog_only_moves_forward(tmp_path: Path) -> None:
    """Sequence 5 is read; then the same sequence with other content, sequence 4, and sequence 6 setting the tool
    back are each refused; sequence 7 moving on is read."""
    require("nix")
    key, secret = stranger_key(tmp_path)
    env = {"FLAKEBOT_CATALOGS": trusting(tmp_path / "cache", key)}
    newer = snapshot(5, version="0.2.0")
    newer["tools"]["note"]["versions"]["0.2.0"] = {**newer["tools"]["note"]["versions"]["0.1.0"], "summary": "new"}
    steps: list[tuple[dict[str, Any], int, str]] = [
        (newer, 0, ""),
        ({**newer, "published_at": newer["published_at"] + 1}, INDEX_REFUSED, "the same sequence 5"),
        ({**newer, "sequence": 4}, INDEX_REFUSED, "sequence 4 is older than the 5"),
        (snapshot(6), INDEX_REFUSED, "it sets note back to 0.1.0 after this machine saw 0.2.0"),
        ({**newer, "sequence": 7}, 0, ""),
    ]
    for snap, code, says in steps:
        signed_cache(tmp_path, snap, secret)
        done = run_cli("list", "--remote", "--json", env=env)
        assert done.returncode == code, (snap["sequence"], done.stdout, done.stderr)
        if says:
            assert says in only_line(done) and "shared-catalogs.json" in only_line(done)


DEP_TOOL = """
let dep = builtins.toFile "deps-lib" "deps 0.1.0 says hello from its dependency (NONCE)\\n"; in
derivation {
  name = "deps-0.1.0"; system = builtins.currentSystem; builder = "/bin/sh";
  args = [ "-c" "/bin/mkdir -p $out/bin; printf '#!/bin/sh\\\\ncat ${dep}\\\\n' > $out/bin/deps; /bin/chmod +x $out/bin/deps; exit 0" ];
}
"""


BUILT_DEP = """derivation {
    name = "deps-lib"; system = builtins.currentSystem; builder = "/bin/sh";
    args = [ "-c" "echo 'deps 0.1.0 says hello from its dependency (NONCE)' > $out" ];
  }"""


def built_with_a_dependency(home: Path, input_addressed: bool = False) -> tuple[str, str]:
    """(tool, dependency): an input-addressed tool whose closure holds a content-addressed path (builtins.toFile),
    the kind Nix admits unsigned, or (`input_addressed`) a built one, whose signatures Nix checks as it copies."""
    nix = DEP_TOOL.replace(
        'builtins.toFile "deps-lib" "deps 0.1.0 says hello from its dependency (NONCE)\\n"', BUILT_DEP
    )
    assert nix != DEP_TOOL
    (home / "deps.nix").write_text((nix if input_addressed else DEP_TOOL).replace("NONCE", uuid.uuid4().hex))
    argv = [*NIX, "build", "--no-link", "--json", "--option", "substituters", "", "-f", str(home / "deps.nix")]
    built = subprocess.run(argv, capture_output=True, text=True, check=True)
    tool = json.loads(built.stdout)[0]["outputs"]["out"]
    refs = subprocess.run(["nix-store", "-q", "--references", tool], capture_output=True, text=True, check=True)
    return tool, refs.stdout.split()[0]


def catalogue_deps(a: Publisher, tool: str, flake: Path) -> None:
    """`tool` catalogued as "deps" in A's catalog, as a craft would leave it (in A's own process and settings)."""
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        from flakebot import config
        from flakebot.deliver.catalog import Catalog
        flake = Path({str(flake)!r}); flake.mkdir(); (flake / "flake.nix").write_text("{{}}\\n")
        Catalog.open(config.load()).add("deps", need="need deps", flake_dir=flake, manifest={{"name": "deps",
            "summary": "deps", "main_program": "deps", "store_path": {tool!r}}}, usage_md="# deps\\n",
            store_path={tool!r}, run_id="test", origin={{}})
        """
    )
    subprocess.run([sys.executable, "-c", code], env=a.env, check=True, timeout=60)


@pytest.mark.slow
def test_an_unsigned_path_in_the_closure_is_refused(a: Publisher, tmp_path: Path) -> None:
    """The cache owner strips the signature of a content-addressed path in the tool's closure: Nix lets it in,
    flakebot checks the whole closure and refuses."""
    cache = copy_of(a, tmp_path)
    tool, dep = built_with_a_dependency(tmp_path)
    catalogue_deps(a, tool, tmp_path / "flake")
    publish(a.env, cache, "deps")
    info = cache / f"{Path(dep).name.split('-')[0]}.narinfo"
    info.write_text("".join(line for line in info.read_text().splitlines(True) if not line.startswith("Sig:")))
    b = on_machine_b(tmp_path / "b", trusting(cache, a.key), [flakebot("install", "deps"), flakebot("list", "--json")])
    installed, listed = b.results
    assert installed.returncode == 60, (installed.stdout, installed.stderr)
    assert f"refused {dep} from file://{cache}: it is not signed by a key you trust" in only_line(installed)
    assert Path(dep).name in b.store  # Nix let it in unsigned; flakebot went no further
    assert json_result(listed)["tools"] == []


@pytest.mark.slow
def test_a_held_input_addressed_path_another_key_signed_is_refused(a: Publisher, tmp_path: Path) -> None:
    """B holds the tool's input-addressed dependency already, fetched from another catalog under that catalog's key
    (another tenant's cache); A's cache has it unsigned. Nix copies nothing it holds, so it checks nothing: flakebot
    asks A's cache for its signature over that content, and refuses."""
    cache = copy_of(a, tmp_path)
    tool, dep = built_with_a_dependency(tmp_path, input_addressed=True)
    catalogue_deps(a, tool, tmp_path / "flake")
    publish(a.env, cache, "deps")
    signed = shutil.copytree(cache, tmp_path / "signed")  # as published: A signed the dependency there
    info = cache / f"{Path(dep).name.split('-')[0]}.narinfo"
    info.write_text("".join(line for line in info.read_text().splitlines(True) if not line.startswith("Sig:")))
    other, secret = stranger_key(tmp_path)  # the other catalog's key, which signs the dependency there
    subprocess.run([*NIX, "copy", "--to", f"file://{tmp_path / 'other'}?secret-key={secret}", dep], check=True)
    fetch = [*NIX, "copy", "--from", f"file://{tmp_path / 'other'}", "--option", "trusted-public-keys", other, dep]
    again = flakebot("install", "deps")
    again = Step(["env", f"FLAKEBOT_CATALOGS={trusting(signed, a.key)}", *again.argv])
    b = on_machine_b(tmp_path / "b", trusting(cache, a.key), [Step(fetch), flakebot("install", "deps"), again])
    held, installed, from_signed = b.results
    assert held.returncode == 0, held.stderr
    assert installed.returncode == 60, (installed.stdout, installed.stderr)
    assert f"refused {dep} from file://{cache}: it is not signed by a key you trust" in only_line(installed)
    assert from_signed.returncode == 0, from_signed.stderr  # the cache's own signature over the held path counts


def test_an_index_published_with_the_urls_own_secret_key_is_signed_by_it(tmp_path: Path) -> None:
    """`--to file://CACHE?secret-key=FILE`: the narinfos and the index are signed with that key, not flakebot's."""
    require("nix")
    public, secret = stranger_key(tmp_path)
    env = machine_env(tmp_path / "publisher")
    add_tool(env, tmp_path / "publisher", "note", "0.1.0", summary="a note")
    cache = tmp_path / "cache"
    run_cli("publish", "note", "--to", f"file://{cache}?secret-key={secret}", "--json", env=env, check=True)
    listed = run_cli("list", "--remote", "--json", env={"FLAKEBOT_CATALOGS": trusting(cache, public)})
    assert listed.returncode == 0, listed.stderr
    assert [(t["name"], t["public_key"]) for t in json_result(listed)["tools"]] == [("note", public)]
    assert not (tmp_path / "publisher" / "data" / "flakebot" / "keys").exists()  # no key of flakebot's was made
