"""A service's flake outputs as Nix text: its NixOS module and its OCI image (templates/nixos-module.nix.j2,
templates/oci-image.nix.j2) and its declaration as data. The flake (flake_files.render_flake) and
`flakebot export` (flakebot.services) render them from here, so the flake's outputs and the exported files agree."""

from __future__ import annotations

import json
import re
from typing import Any

from flakebot.errors import UsageError

PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PLAIN_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")
# The image's user: nobody's ids, never root (an image that runs as root is what its users complain of).
IMAGE_USER = "65534:65534"


def unit_name(name: str) -> str:
    return f"flakebot-{name}"


def url_variable(name: str) -> str:
    """The environment variable a service that needs `name` finds it at: FLAKEBOT_<NAME>_URL (upper case, '-' as
    '_'), holding http://127.0.0.1:PORT, the one port of the host's loopback its namespace reaches."""
    return "FLAKEBOT_" + name.upper().replace("-", "_") + "_URL"


def plain(value: str, what: str, pattern: re.Pattern[str] = PLAIN_NAME) -> str:
    """`value` when it can stand in Nix text and a unit name unquoted; else a UsageError."""
    if not pattern.fullmatch(value):
        raise UsageError(
            f"{what} '{value}' cannot be named in a service's Nix outputs", fix="use letters, digits, '-', '_' and '.'"
        )
    return value


def module_text(name: str, spec: dict[str, Any], *, network: bool = False) -> str:
    """The NixOS module of service `name` (its package an option, run with lib.getExe); `network`: its
    outboundNetwork option on by default."""
    from flakebot.render import render

    return render("nixos-module.nix.j2", name=plain(name, "service name"), unit=unit_name(name), spec=_checked(spec),
                  network=network, needs=_needs(spec), handoff=spec.get("socket") == "handoff")  # fmt: skip


def image_text(name: str, version: str, program: str, spec: dict[str, Any], *, network: bool = False) -> str:
    """`pkgs: package: <the image>`: dockerTools.buildLayeredImage with the service's entrypoint, port and state;
    its label io.flakebot.network says whether the service needs outbound network (`network`) or none."""
    from flakebot.render import render

    unit = unit_name(plain(name, "service name"))
    return render(
        "oci-image.nix.j2",
        name=name,
        unit=unit,
        version=plain(version or "latest", "version", PLAIN_VERSION),
        program=plain(program, "program"),
        spec=_checked(spec),
        user=IMAGE_USER,
        state_dir=f"var/lib/{unit}",
        network=network,
        needs=_needs(spec),
    )


def needs_label(spec: dict[str, Any]) -> str:
    """The image's io.flakebot.needs label: the services it needs, comma-separated ("" : none). An engine cannot
    start them from an image; the label says which, and the run gives each FLAKEBOT_<NAME>_URL with -e."""
    return ",".join(name for name, _, _ in _needs(spec))


def _needs(spec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Each needed service as (name, unit, variable), checked again for Nix text (ServiceSpec checks them too)."""
    return [(plain(str(n), "needed service"), unit_name(str(n)), url_variable(str(n))) for n in spec.get("needs", [])]


def declaration_json(name: str, spec: dict[str, Any]) -> str:
    """The declaration flakebot's supervisor runs, as the flake's `lib.flakebot.service` (JSON read by fromJSON)."""
    return json.dumps({"name": name, "kind": "service", **_checked(spec)}, sort_keys=True)


def _checked(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's values that reach Nix text unquoted are numbers and an upper-case variable (ServiceSpec checks
    them too; checked again here because this module renders text)."""
    port, port_env = spec.get("port"), str(spec.get("port_env", ""))
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise UsageError(f"port {port!r} is not a TCP port", fix="declare the service's port between 1 and 65535")
    if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", port_env):
        raise UsageError(
            f"port variable {port_env!r} is not an environment variable name", fix="declare --port-env PORT"
        )
    restart = spec.get("restart", {})
    numbers = [restart.get("limit"), restart.get("window_s"), restart.get("backoff_s"), spec.get("stop_grace_s")]
    if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and 0 <= n < 1e6 for n in numbers):
        raise UsageError("the service's restart and stop settings are not numbers", fix="package the service again")
    return spec
