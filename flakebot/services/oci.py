"""`export NAME --oci`: the catalogued service as an OCI image layout, built by nixpkgs' dockerTools.

The image is built from the catalog entry alone: the image expression (flakebot.nix.service_outputs, the same text
as the flake's packages.ociImage) applied to the catalogued store path, never to a tree someone else wrote. The
build's output (a docker-archive .tar.gz, as buildLayeredImage writes it) is read as hostile input: every member
name plain, every layer's digest the one its config declares, at most MAX_BYTES, and the config what flakebot asked
for (the catalogued entrypoint, a non-root user, the port and state variables) before anything is written. The
layout (oci-layout, index.json, blobs/sha256/) is written under a temporary name in the output directory and renamed
into place in one step.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.config import Settings
from flakebot.errors import NixError, UnsafePath, UsageError
from flakebot.nix import command, service_outputs
from flakebot.nix.lock import PINNED_NIXPKGS
from flakebot.nix.service_outputs import url_variable
from flakebot.services.declaration import ServiceSpec
from flakebot.services.exportfiles import ExportDir

logger = logging.getLogger(__name__)

MAX_BYTES = 2 << 30  # an image larger than this (uncompressed) is refused, not unpacked into memory
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
ROOT_USERS = ("", "0", "root")
NEEDS_LABEL = "io.flakebot.needs"  # the services it needs, comma-separated (an engine starts none of them)
NETWORK_LABEL = "io.flakebot.network"  # "none" or "outbound": what the service needs of its engine's network
STORE_PATH = re.compile(r"/nix/store/[0-9a-z]{32}-[A-Za-z0-9+._?=-]+")


@dataclass(frozen=True)
class Image:
    """A docker-archive read and checked: its config (JSON bytes) and its layers (uncompressed tars), in order."""

    config: bytes
    layers: list[bytes]
    tag: str


def image_expression(manifest: dict[str, Any], pkgs: str, *, network: bool = False) -> str:
    """The Nix expression of the service's image: the flake's image function applied to `pkgs` and the catalogued
    store path (builtins.storePath: the path the catalog holds, nothing rebuilt from a source tree)."""
    text = service_outputs.image_text(manifest["name"], manifest.get("version", ""), manifest["main_program"],
                                      manifest["service"], network=network)  # fmt: skip
    store_path = manifest.get("store_path", "")
    if not STORE_PATH.fullmatch(store_path):
        raise UsageError(f"the catalog entry's store path {store_path!r} is not a store path", fix="package it again")
    return f"({text}) ({pkgs}) (builtins.storePath {json.dumps(store_path)})"


def build_image(manifest: dict[str, Any], settings: Settings, *, network: bool = False) -> Path:
    """nix build of the image (the host stand-in's dockerTools offline, else the pinned nixpkgs'); its .tar.gz."""
    mode = "host" if manifest.get("nixpkgs_mode") == "host" else "pinned"
    system = command.nix_system()
    if mode == "host":
        from flakebot.nix.standin import ensure_standin

        standin: Path | None = ensure_standin(settings)
        pkgs = f'(builtins.getFlake "path:{standin}").legacyPackages.{system}'
    else:
        standin = None
        pkgs = f'(builtins.getFlake "github:NixOS/nixpkgs/{PINNED_NIXPKGS["rev"]}").legacyPackages.{system}'
    expr = image_expression(manifest, pkgs, network=network)
    # through nix_argv, as every nix call that can build: the build users and Nix's sandbox (the nixpkgs override it
    # adds is inert here: the expression names its nixpkgs itself)
    argv = command.nix_argv(["build"], ["--impure", "--json", "--no-link", "--expr", expr], mode, standin,
                            settings.nix_builders)  # fmt: skip
    done = launcher.run(
        argv, capture_output=True, text=True, timeout=settings.nix_build_timeout, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        first = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "no output")
        raise NixError(
            f"nix build of {manifest['name']}'s OCI image failed: {first}",
            fix="run it again with -v; offline the host stand-in builds it, online the pinned nixpkgs",
            log_tail=done.stderr[-3000:],
        )
    out = Path(json.loads(done.stdout)[0]["outputs"]["out"])
    logger.info("built the image of %s: %s", manifest["name"], out)
    return out


def read_archive(path: Path) -> Image:
    """The docker-archive at `path` (gzip'd or not), checked: plain member names, layers matching the config's
    diff_ids, bounded size. Nothing of it is extracted to disk."""
    with path.open("rb") as raw:
        head = raw.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    members: dict[str, bytes] = {}
    total = 0
    with opener(path, "rb") as stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            name = member.name.removeprefix("./")
            if member.isdir() or name in ("", "."):
                continue
            if not member.isfile() or name.startswith("/") or ".." in name.split("/"):
                raise _hostile(f"member {member.name!r} is not a plain file of the archive")
            total += member.size
            if total > MAX_BYTES:
                raise _hostile(f"it is larger than {MAX_BYTES >> 20} MiB")
            handle = archive.extractfile(member)
            members[name] = handle.read() if handle else b""
    try:
        entry = json.loads(members["manifest.json"])[0]
        config = members[entry["Config"]]
        layers = [members[name] for name in entry["Layers"]]
        diff_ids = json.loads(config)["rootfs"]["diff_ids"]
        tag = (entry.get("RepoTags") or ["latest"])[0].rpartition(":")[2]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise _hostile(f"its manifest or config is malformed ({exc!r})") from None
    digests = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    if digests != diff_ids:
        raise _hostile("its layers do not match the digests its config declares")
    return Image(config, layers, tag)


def check_config(image: Image, manifest: dict[str, Any], *, network: bool = False) -> dict[str, Any]:
    """The image's config when it is what flakebot asked for: the catalogued entrypoint, a non-root user, the
    service's port variable, LISTEN_ADDRESS=0.0.0.0 and $STATE_DIRECTORY, the network label (`network`), a sticky
    world-writable /tmp and the state directory in the last layer owned by that user; else UnsafePath naming the
    first difference."""
    spec = ServiceSpec.from_dict(manifest["service"])
    config = json.loads(image.config).get("config") or {}
    entrypoint = [f"{manifest['store_path']}/bin/{manifest['main_program']}"]
    if config.get("Entrypoint") != entrypoint or config.get("Cmd"):
        raise _hostile(f"its entrypoint is {config.get('Entrypoint')!r}, not the catalogued {entrypoint!r}")
    user = str(config.get("User", ""))
    uid, _, gid = user.partition(":")
    if uid in ROOT_USERS or gid in ("0", "root"):
        raise _hostile(f"it runs as {user or 'root'!r}: a service image runs as a non-root user")
    if not (uid.isdigit() and gid.isdigit()):
        raise _hostile(f"its user {user!r} is not numeric uid:gid (a name needs an /etc/passwd the image lacks)")
    unit = service_outputs.unit_name(manifest["name"])
    env = dict(item.partition("=")[::2] for item in config.get("Env", []))
    wanted = {spec.port_env: str(spec.port), "LISTEN_ADDRESS": "0.0.0.0", "STATE_DIRECTORY": f"/var/lib/{unit}"}
    if {k: env.get(k) for k in wanted} != wanted or set(env) - {*wanted, "TMPDIR"}:
        raise _hostile(f"its environment {sorted(env)} is not the service's ({sorted(wanted)} and TMPDIR)")
    label = {NETWORK_LABEL: "outbound" if network else "none"}
    if spec.needs:
        label[NEEDS_LABEL] = service_outputs.needs_label(manifest["service"])
    if config.get("Labels") != label:
        raise _hostile(f"its labels {config.get('Labels')!r} are not {label!r}")
    if set(config.get("ExposedPorts", {})) != {f"{spec.port}/tcp"}:
        raise _hostile(f"it exposes {sorted(config.get('ExposedPorts', {}))}, not {spec.port}/tcp")
    _check_root_layer(image.layers[-1], f"var/lib/{unit}", int(uid))
    return dict(config)


def _check_root_layer(layer: bytes, state_dir: str, uid: int) -> None:
    entries = {m.name.removeprefix("./"): m for m in tarfile.open(fileobj=io.BytesIO(layer), mode="r:")}
    tmp, state = entries.get("tmp"), entries.get(state_dir)
    if tmp is None or not tmp.isdir() or tmp.mode & 0o1777 != 0o1777:
        raise _hostile("it has no sticky world-writable /tmp")
    if state is None or not state.isdir() or state.uid != uid:
        raise _hostile(f"its state directory /{state_dir} is missing or not owned by its user")


def _hostile(why: str) -> UnsafePath:
    return UnsafePath(
        f"the built OCI image is not what flakebot asked for: {why}; refused",
        fix="run 'flakebot export NAME --oci' again; if it repeats, the nixpkgs in use builds images differently",
        rule="image",
    )


def layout_files(image: Image, name: str) -> dict[str, bytes]:
    """The OCI image layout (image-layout spec): oci-layout, index.json and blobs/sha256/<digest>."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        blobs[f"blobs/sha256/{digest}"] = data
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": blob(image.config, CONFIG_TYPE),
        "layers": [blob(layer, LAYER_TYPE) for layer in image.layers],
    }
    described = blob(json.dumps(manifest, sort_keys=True).encode(), MANIFEST_TYPE)
    described["annotations"] = {"org.opencontainers.image.ref.name": image.tag, "io.flakebot.service": name}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [described]}
    return {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **blobs,
    }


def export_oci(
    manifest: dict[str, Any], target: ExportDir, settings: Settings, *, network: bool = False
) -> dict[str, Any]:
    """Build the image, check it, write its layout as OUT/flakebot-NAME.oci (whole, or not at all). `network`:
    its label says the service needs outbound network."""
    unit = service_outputs.unit_name(manifest["name"])
    target.refuse_existing([f"{unit}.oci"])  # before the build: a refusal costs nothing
    archive = build_image(manifest, settings, network=network)
    image = read_archive(archive)
    config = check_config(image, manifest, network=network)
    layout = target.write_tree(f"{unit}.oci", layout_files(image, manifest["name"]))
    return {
        "layout": str(layout),
        "image": str(archive),
        "tag": image.tag,
        "entrypoint": config["Entrypoint"],
        "user": config["User"],
        "env": config.get("Env", []),
        "layers": len(image.layers),
        "portable": bool(manifest.get("portable")),
        "network": network,
        "port": ServiceSpec.from_dict(manifest["service"]).port,
        # what an engine cannot start from the image: run each, and pass its URL (-e FLAKEBOT_<NAME>_URL=...)
        "needs": {name: url_variable(name) for name in ServiceSpec.from_dict(manifest["service"]).needs},
    }
