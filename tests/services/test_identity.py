"""The identity rules of a service on real files (services/identity.py): what `up` records, the check before a
recorded program starts again, who may start a service whose launch held secrets, and launch.json written
exactly (the attacks through the real commands are in test_identity_attacks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flakebot.errors import SandboxError, UsageError
from flakebot.services import identity
from flakebot.services.layout import ServiceDir
from flakebot.services.supervised import write_launch


def program(tmp_path: Path, name: str, content: bytes) -> Path:
    binary = tmp_path / name / "bin" / "kv"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(content)
    return binary


def test_the_recorded_program_must_still_be_the_file_up_digested(tmp_path: Path) -> None:
    binary = program(tmp_path, "store-a", b"the user's program")
    recorded = identity.record({"catalog_version": "0.1.0", "name": "kv", "installed_from": None}, binary)
    assert recorded["store_path"] == str(tmp_path / "store-a") and recorded["version"] == "0.1.0"
    assert identity.checked_binary("kv", recorded) == binary
    binary.write_bytes(b"another program at the same path")
    with pytest.raises(SandboxError, match="not the file it recorded") as changed:
        identity.checked_binary("kv", recorded)
    assert "--replace" in changed.value.fix
    binary.unlink()
    with pytest.raises(SandboxError, match="is gone"):
        identity.checked_binary("kv", recorded)


def test_a_launch_holding_secrets_is_started_again_only_by_the_user_and_on_another_program_only_with_replace(
    tmp_path: Path,
) -> None:
    where = ServiceDir(tmp_path / "services" / "kv")
    ran = identity.record({"catalog_version": "0.1.0"}, program(tmp_path, "store-a", b"a"))
    now = identity.record({"catalog_version": "0.1.0"}, program(tmp_path, "store-b", b"b"))
    earlier = {"version": "0.1.0", "binary": ran["binary"], "program": ran, "secrets": {"token": "/x/token"}}
    with pytest.raises(UsageError, match="an agent cannot start it") as agent:
        identity.may_start(where, earlier, ran, replace=False, agent=True)
    assert "flakebot restart kv" in agent.value.fix
    identity.may_start(where, earlier, ran, replace=False, agent=False)  # the same program: the user's up
    with pytest.raises(UsageError, match="is now another program") as user:
        identity.may_start(where, earlier, now, replace=False, agent=False)
    assert "--replace" in user.value.fix and "restart" in user.value.fix
    identity.may_start(where, earlier, now, replace=True, agent=False)
    identity.may_start(where, {**earlier, "secrets": {}}, now, replace=False, agent=True)  # no secret: as before


def test_previous_is_the_program_that_ran_before_as_recorded_then(tmp_path: Path) -> None:
    first = identity.record({"catalog_version": "0.1.0"}, program(tmp_path, "store-a", b"a"))
    launch = {"version": "0.1.0", "binary": first["binary"], "spec": {"port": 8080}, "program": first}
    snapshot = identity.snapshot(launch)
    assert snapshot is not None and snapshot["program"] == first and snapshot["spec"] == {"port": 8080}
    assert identity.previous(launch, "0.2.0") == snapshot
    assert identity.previous({**launch, "previous": {"version": "0.0.9"}}, "0.1.0") == {"version": "0.0.9"}
    assert identity.previous({}, "0.1.0") is None


def test_launch_json_keeps_secret_paths_under_keys_the_redactor_knows(tmp_path: Path) -> None:
    where = ServiceDir(tmp_path / "services" / "kv")
    where.root.mkdir(parents=True)
    secrets = {key: str(tmp_path / f"{key}.txt") for key in ("token", "password", "api_key", "authorization")}
    write_launch(where, {"name": "kv", "secrets": secrets, "binary": "/nix/store/x-kv/bin/kv"})
    assert json.loads(where.launch_file.read_text())["secrets"] == secrets


def test_a_service_s_gc_root_is_made_once_and_follows_its_program(tmp_path: Path) -> None:
    """hold_roots: a GC root nix lists for the program's store path; an `up` of the same program again keeps the
    link nix registered (no nix-store run: the same link, the same inode); another program moves it."""
    import subprocess

    from tests.conftest import require

    require("nix-store")
    stores = []
    for name in ("one", "two"):
        (tmp_path / name).write_text(f"{name} {tmp_path}\n")  # a store path of this run's own
        added = subprocess.run(["nix-store", "--add", str(tmp_path / name)], capture_output=True, text=True, check=True)
        stores.append(added.stdout.strip())
    where = ServiceDir(tmp_path / "services" / "kv")
    link = where.root / "gcroot"

    def roots(store: str) -> str:
        return subprocess.run(["nix-store", "--query", "--roots", store], capture_output=True, text=True).stdout

    identity.hold_roots(where, {"program": {"store_path": stores[0]}})
    made = link.lstat().st_ino
    assert str(link) in roots(stores[0])
    identity.hold_roots(where, {"program": {"store_path": stores[0]}})
    assert link.lstat().st_ino == made and str(link) in roots(stores[0])
    identity.hold_roots(where, {"program": {"store_path": stores[1]}})
    assert str(link) in roots(stores[1]) and str(link) not in roots(stores[0])
