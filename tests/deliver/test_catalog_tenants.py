"""A tenant's catalog over the organisation's (deliver/catalog.py): where it lives, what it reads, what it refuses to
change; through the CLI with the tenant setting, as an admin would use it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from flakebot import config
from flakebot.deliver.catalog import Catalog, tenant_root
from flakebot.errors import CatalogError, ConfigError
from tests.conftest import json_result, run_cli
from tests.team.test_tenant_catalogs import catalogue


@pytest.mark.parametrize("tenant", ["../x", "a/b", "..", ".hidden", "acme\n", "Acme", "x" * 65])
def test_a_tenant_is_one_plain_name_never_a_path(flakebot_home: Path, tenant: str) -> None:
    settings = dataclasses.replace(config.load(), tenant=tenant)
    with pytest.raises(ConfigError):
        tenant_root(settings, tenant)
    with pytest.raises(ConfigError):
        Catalog.open(settings)
    done = run_cli("list", "--json", env={"FLAKEBOT_TENANT": tenant})
    assert done.returncode == 3 and json.loads(done.stdout.splitlines()[-1])["type"] == "ConfigError", done.stdout
    assert not any(path.name != "flakebot" for path in (flakebot_home / "data").rglob("*")), "nothing made"


def test_a_tenant_reads_the_organisations_tools_and_changes_only_its_own(flakebot_home: Path, tmp_path: Path) -> None:
    organisation = config.load()
    acme = dataclasses.replace(organisation, tenant="acme")
    catalogue(organisation, tmp_path, "csv")  # need "csv rows"
    catalogue(acme, tmp_path, "own")
    tenant = Catalog.open(acme)
    assert tenant.root == organisation.path("catalog_dir") / "tenants" / "acme"
    assert set(tenant.tools()) == {"csv", "own"} and tenant.get("csv")["name"] == "csv"
    assert tenant.find_need("need csv rows") is not None  # a craft of the organisation's need is answered by it
    assert tenant.free_name("csv", "another need") == "csv-2"  # a name the organisation holds is not free
    assert tenant.version_for("csv") == "0.1.0"  # the tenant's own first version, not the organisation's next
    for change in (lambda: tenant.remove("csv"), lambda: tenant.update("csv", note="x")):
        with pytest.raises(CatalogError, match="organisation's catalog") as refused:
            change()
        assert refused.value.details["reason"] == "organisation"
    tenant.remove("own")
    assert set(Catalog.open(organisation).tools()) == {"csv"}  # the organisation's catalog never had acme's tool
    listed = json_result(run_cli("list", "--json", env={"FLAKEBOT_TENANT": "globex"}, check=True))
    assert [t["name"] for t in listed["tools"]] == ["csv"]  # another tenant: the organisation's tools only
    gone = run_cli("rm", "csv", "--json", env={"FLAKEBOT_TENANT": "globex"})
    assert gone.returncode == 60 and "organisation's catalog" in json.loads(gone.stdout.splitlines()[-1])["error"]


def test_a_craft_in_flight_for_another_tenant_is_not_named_to_this_one(flakebot_home: Path) -> None:
    """globex crafting a need right now is not acme's business: acme's craft of the same need is not refused with
    globex's run id (a run acme may not see, and work that is not acme's to wait for); the same tenant's is."""
    from flakebot.pipeline.request import RunRequest
    from flakebot.pipeline.run import Run

    theirs = Run.create(config.load().path("workdir"), "craft", RunRequest(need="need globex's secret pricing tool"))
    theirs.state.update(status="running", tenant="globex")
    theirs.save()
    env = {"FLAKEBOT_MODEL": "scripted:/nonexistent.json"}
    with theirs.lock():
        acme = run_cli("craft", "need globex's secret pricing tool", "--json", env={**env, "FLAKEBOT_TENANT": "acme"})
        assert theirs.id not in acme.stdout + acme.stderr, acme.stdout
        same = run_cli("craft", "need globex's secret pricing tool", "--json", env={**env, "FLAKEBOT_TENANT": "globex"})
        assert theirs.id in json.loads(same.stdout.splitlines()[-1])["error"], same.stdout


def test_an_organisations_service_is_not_a_tenant_that_shadows_its_name(flakebot_home: Path, tmp_path: Path) -> None:
    """The admin's `up` of the organisation's kv is every tenant's that reads the organisation's kv; a tenant whose
    own kv shadows it does not read it, so cannot stop, read or roll it back (and then take its name on this machine
    with its own program, which the organisation's other tenants' tools would reach at its port)."""
    from flakebot.mcp import tenantservices
    from flakebot.services.layout import ServiceDir

    organisation = config.load()
    catalogue(organisation, tmp_path, "kv")
    program = Catalog.open(organisation).get("kv")["store_path"]
    where = ServiceDir.of("kv", organisation)
    where.root.mkdir(parents=True)
    launch = {"program": {"binary": f"{program}/bin/kv", "sha256": "0" * 64, "store_path": program}}
    where.launch_file.write_text(json.dumps(launch))  # as the admin's `flakebot up kv` records it
    acme, globex = (dataclasses.replace(organisation, tenant=t) for t in ("acme", "globex"))
    (tmp_path / "globex").mkdir()
    catalogue(globex, tmp_path / "globex", "kv")  # globex's own kv: its view of kv is not the organisation's
    assert tenantservices.is_callers(acme, "kv", "acme")
    assert not tenantservices.is_callers(globex, "kv", "globex")


def test_the_admins_resume_of_a_tenants_run_catalogues_into_that_tenants_catalog(flakebot_home: Path) -> None:
    """acme's run, stopped before it catalogues, resumed by the admin's CLI (no tenant setting): the tool lands in
    acme's catalog, the one the run was started for, never in the organisation's every tenant reads; a process of
    another tenant is refused the run, in one line, and nothing is catalogued."""
    from flakebot.pipeline import engine
    from flakebot.pipeline.request import RunRequest
    from tests.conftest import REPO

    organisation = config.load()
    acme = dataclasses.replace(organisation, tenant="acme")
    pipeline = "tests.fakes.pipelines:CATALOGUING"
    run = engine.start(pipeline, acme.path("workdir"), acme, RunRequest(need="acme-secret"), stop_after="first")
    env = {"PYTHONPATH": str(REPO)}
    other = run_cli("resume", run.id, "--json", env={**env, "FLAKEBOT_TENANT": "globex"})
    assert other.returncode != 0 and len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert "acme-secret" not in Catalog.open(dataclasses.replace(organisation, tenant="globex")).tools()
    resumed = run_cli("resume", run.id, "--json", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert json_result(resumed)["outputs"]["catalogue"] == {"tenant": "acme"}
    assert "acme-secret" in Catalog.open(acme).tools()
    assert Catalog.open(organisation).tools() == {}  # every tenant reads this one: acme's tool is not in it


def test_no_two_hosts_and_tenants_sign_with_one_key_name() -> None:
    """A key's name says whose it is: tenant `b` on host `a` and the organisation on host `a-b` (both were
    flakebot-a-b-1, and a machine trusting both kept one and refused the other's paths), and any other pair."""
    from itertools import product

    from flakebot.deliver.publish import key_name

    pairs = list(product(["a", "a-b", "a.b", "b"], [None, "b", "a-b", "b-1", "1"]))  # hosts as they are kept
    names = {key_name(host, tenant) for host, tenant in pairs}
    assert len(names) == len(pairs)
    assert key_name("a", "b") != key_name("a-b", None)


def test_a_tenants_tools_are_published_signed_with_its_own_key(flakebot_home: Path, tmp_path: Path) -> None:
    """acme's tool published (the CLI with the tenant setting) is signed with acme's key, kept in acme's catalog, not
    the organisation's key every tenant's agents trust: a machine trusting only the organisation's key lists nothing
    of acme's cache, one trusting acme's key lists acme's tool."""
    import subprocess

    from tests.conftest import require

    require("nix")
    organisation = config.load()
    acme = dataclasses.replace(organisation, tenant="acme")
    for settings, name in ((organisation, "org-note"), (acme, "acme-note")):
        (tmp_path / f"{name}.txt").write_text(f"{name}\n")
        added = subprocess.run(["nix-store", "--add", str(tmp_path / f"{name}.txt")], capture_output=True, text=True)
        assert added.returncode == 0, added.stderr
        (tmp_path / name).mkdir()
        Catalog.open(settings).add(
            name, need=f"need {name}", flake_dir=tmp_path / name, usage_md=f"# {name}\n", run_id="test", origin={},
            manifest={"name": name, "summary": "a note", "main_program": name, "store_path": added.stdout.strip()},
            store_path=added.stdout.strip(),
        )  # fmt: skip
    published = {}
    for tenant, name in (("", "org-note"), ("acme", "acme-note")):
        done = run_cli("publish", name, "--to", f"file://{tmp_path / 'cache' / name}", "--json",
                       env={"FLAKEBOT_TENANT": tenant})  # fmt: skip
        assert done.returncode == 0, done.stderr
        published[tenant] = json_result(done)
    org_key, acme_key = published[""]["public_key"], published["acme"]["public_key"]
    assert org_key != acme_key and published["acme"]["signed_by"] == acme_key.partition(":")[0]
    assert (tenant_root(organisation, "acme") / "keys" / f"{published['acme']['signed_by']}.secret").is_file()
    assert not (organisation.path("catalog_dir") / "keys" / f"{published['acme']['signed_by']}.secret").exists()
    cache = f"file://{tmp_path / 'cache' / 'acme-note'}"
    for key, seen in ((org_key, []), (acme_key, ["acme-note"])):
        listed = run_cli("list", "--remote", "--json", env={"FLAKEBOT_CATALOGS": f"{cache} {key}"})
        names = [t["name"] for t in json_result(listed).get("tools", [])] if listed.returncode == 0 else []
        assert names == seen, (key, listed.stdout, listed.stderr)
