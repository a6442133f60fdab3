"""Each tenant's shared catalogs and trusted keys (config.TENANT_SETTINGS in <catalog_dir>/tenants/T/flakebot.toml):
a tenant reads the organisation's shared catalogs and its own, each verified with its own keys only; another
tenant's catalog and key are never offered to it. Through the real CLI, as an admin sets them and a tenant's calls
(FLAKEBOT_TENANT, as `serve` and workers set it) read them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from flakebot import config
from flakebot.deliver.publish import BINARY_CACHE_SCHEMES
from tests.conftest import json_result, require, run_cli
from tests.deliver.test_shared_index import (
    INDEX_REFUSED,
    index_file,
    only_line,
    signed_cache,
    snapshot,
    stranger_key,
    warned_skip,
)


def as_tenant(tenant: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env={"FLAKEBOT_TENANT": tenant, **env})


def listed(tenant: str, **env: str) -> set[str]:
    done = run_cli("list", "--remote", "--json", env={"FLAKEBOT_TENANT": tenant, **env})
    return {f"{tool['name']}@{tool['catalog']}" for tool in json_result(done)["tools"]}


def test_a_tenant_reads_the_organisations_catalogs_and_its_own_never_anothers(
    flakebot_home: Path, tmp_path: Path
) -> None:
    require("nix")
    (tmp_path / "g").mkdir()
    (tmp_path / "o").mkdir()
    globex_key, globex_secret = stranger_key(tmp_path / "g")
    org_key, org_secret = stranger_key(tmp_path / "o")
    globex_cache = signed_cache(tmp_path / "g", snapshot(), globex_secret)  # globex's tool `note`
    org_cache = signed_cache(tmp_path / "o", snapshot(need="need org note"), org_secret)
    acme_cache = tmp_path / "acme-cache"  # acme's own catalog: no index yet
    (acme_cache / "flakebot").mkdir(parents=True)
    acme_key = "acme-1:" + "A" * 43 + "="
    org = {"FLAKEBOT_CATALOGS": f"file://{org_cache} {org_key}"}

    for tenant, cache, key in (("globex", globex_cache, globex_key), ("acme", acme_cache, acme_key)):
        done = run_cli("config", "set", "catalogs", f"file://{cache} {key}", env={"FLAKEBOT_TENANT": tenant})
        assert done.returncode == 0, done.stderr
    assert (flakebot_home / "data/flakebot/tenants/acme/flakebot.toml").is_file()
    assert not (flakebot_home / "config/flakebot/flakebot.toml").exists()  # no tenant's list is everyone's

    assert listed("globex", **org) == {f"note@file://{org_cache}", f"note@file://{globex_cache}"}
    assert listed("acme", **org) == {f"note@file://{org_cache}"}  # the organisation's only
    done = run_cli("list", "--remote", "--json")  # the admin, no tenant: the organisation's list alone (none here)
    assert done.returncode != 0 and "no shared catalogs are configured" in done.stdout

    # globex's catalog named to acme: not acme's, so no key is trusted for it
    done = as_tenant("acme", "install", "note", "--from", f"file://{globex_cache}")
    assert done.returncode != 0 and "is not a configured catalog" in only_line(done)
    # globex's tool asked by name: the answer an unknown name gets, word for word
    known = as_tenant("acme", "install", "note")
    unknown = as_tenant("acme", "install", "zzzz")
    assert known.returncode == unknown.returncode != 0
    assert only_line(known).replace("note", "NAME") == only_line(unknown).replace("zzzz", "NAME")

    # a craft of globex's tool's need: globex's looks in globex's catalog (its entry is nowhere: skipped), acme's never
    craft = ("craft", "need note", "--model", "scripted:/nonexistent.json", "--offline", "--registry", "local")
    assert warned_skip(as_tenant("globex", *craft, **org).stderr, globex_cache)
    assert str(globex_cache) not in "".join(as_tenant("acme", *craft, **org).stderr.split())

    # globex's signed index planted in acme's cache: signed by a key acme does not trust, refused
    shutil.copy(index_file(globex_cache), index_file(acme_cache))
    done = as_tenant("acme", "list", "--remote")
    assert done.returncode == INDEX_REFUSED, done.stderr
    assert f"file://{acme_cache}" in only_line(done) and "not signed by" in only_line(done)


def test_a_tenants_file_holds_only_a_tenants_settings(flakebot_home: Path) -> None:
    done = run_cli("config", "set", "sandbox", "off", env={"FLAKEBOT_TENANT": "acme"})
    assert done.returncode != 0 and "'sandbox' is not a tenant's setting" in done.stderr
    done = run_cli("config", "set", "publish_to", "file:///srv/c?secret-key=/tmp/k", env={"FLAKEBOT_TENANT": "acme"})
    assert done.returncode != 0 and "without a secret-key" in done.stderr
    done = run_cli("config", "set", "publish_to", "file:///srv/c")  # no tenant: nobody's setting
    assert done.returncode != 0 and "is a tenant's setting" in done.stderr
    assert (
        not (flakebot_home / "data/flakebot/tenants").exists()
        and not (flakebot_home / "config/flakebot/flakebot.toml").exists()
    )
    done = run_cli("config", "set", "publish_to", "file:///srv/c", "--json", env={"FLAKEBOT_TENANT": "acme"})
    assert json_result(done)["value"] == "file:///srv/c", done.stderr
    (flakebot_home / "data/flakebot/tenants/acme/flakebot.toml").write_text('sandbox = "off"\n')
    done = run_cli("list", "--remote", env={"FLAKEBOT_TENANT": "acme"})
    assert done.returncode != 0 and "'sandbox' is not a tenant's setting" in done.stderr, done.stderr


def test_a_tenants_publish_to_is_a_cache_its_key_signs(flakebot_home: Path) -> None:
    """A store flakebot signs nothing in (a chroot store, ssh), a URL no cache has, or a value that is no string
    is refused when set (or read), not at each job's end after its craft."""
    assert config.PUBLISH_SCHEMES == BINARY_CACHE_SCHEMES
    for bad in ("/srv/store", "ssh-ng://host", "bogus://x", "file://relative"):
        done = run_cli("config", "set", "publish_to", bad, env={"FLAKEBOT_TENANT": "acme"})
        assert done.returncode != 0 and "'publish_to' must be a binary cache URL" in done.stderr, (bad, done.stderr)
    assert not (flakebot_home / "data/flakebot/tenants").exists()
    own = flakebot_home / "data/flakebot/tenants/acme/flakebot.toml"
    own.parent.mkdir(parents=True)
    own.write_text('publish_to = ["file:///srv/c"]\n')
    done = run_cli("list", "--remote", env={"FLAKEBOT_TENANT": "acme"})
    assert done.returncode != 0 and "'publish_to' must be a binary cache URL" in done.stderr, done.stderr
