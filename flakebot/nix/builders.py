"""Nix remote builders (the nix_builders setting) and the system feature that names the host toolchain.

Pinned builds take any builder. A stand-in ("host" nixpkgs) build reads this machine's toolchain and crate registry
through extra-sandbox-paths, so it may only go to a builder with the identical toolchain at the same paths: with
builders set, the stand-in's host.json names a digest of that toolchain as a system feature, every stand-in
derivation requires it (templates/standin/lib.nix, hostDerivation), this machine advertises it, and Nix offloads
the build only to a builder whose entry (and own nix.conf) lists it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import subprocess
from pathlib import Path
from typing import Any

from flakebot import launcher
from flakebot.errors import NixError

logger = logging.getLogger(__name__)

FEATURE_PREFIX = "flakebot-toolchain-"
# The fields of a machines entry (nix.conf `builders`, Nix 2.8): URI, systems, SSH key, max jobs, speed factor,
# supported features, mandatory features, host public key; `-` or nothing leaves one unset.
SUPPORTED_FEATURES_FIELD = 5
# Nix's log lines of a build handed to a remote builder, of a connection lost under it, and of no machine to build on.
REMOTE_BUILD = re.compile(r"building '(/nix/store/[^']+\.drv)' on '([^']+)'")
CONNECTION_LOST = ("unexpected end-of-file", "Connection reset", "Broken pipe", "closed by remote host")
NO_MACHINE = "remote machines may not have all required system features"
# A build's own output in Nix's log: under -L each line is prefixed `NAME> `, in an error's last lines `> `. Those are
# the words of the code being built (a build script the model wrote), never Nix's account of its builders.
BUILD_OUTPUT = re.compile(r"^\s*[^\s>]*> ")


def toolchain_feature(facts: dict[str, Any], sysroot: Path) -> str:
    """`flakebot-toolchain-<digest>`: sha256 over what a stand-in build reads of this machine: the host facts (paths
    of the toolchain, the stdenv programs and the native inputs, the registry's checksums, the host triple), the
    toolchain's own version reports (rustc -vV, cargo -V), the C compiler's, and the registry's crate directories."""
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode())
    for argv in ([str(sysroot / "bin" / "rustc"), "-vV"], [str(sysroot / "bin" / "cargo"), "-V"]):
        digest.update(_version_report(argv).encode())
    compiler = facts.get("stdenv", {}).get("cc")
    if compiler:
        digest.update(_version_report([compiler, "--version"]).encode())
    registry = Path(facts["sandboxPaths"][facts["registry"]])
    digest.update("\n".join(sorted(entry.name for entry in registry.iterdir())).encode())
    return FEATURE_PREFIX + digest.hexdigest()[:32]


def _version_report(argv: list[str]) -> str:
    try:
        return launcher.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NixError(
            f"cannot ask '{' '.join(argv)}' for its version ({exc})",
            fix="check that the toolchain runs; unset nix_builders to build here only",
        ) from None


def standin_feature(standin: Path | None) -> str:
    """The toolchain feature the stand-in's derivations require ('' when it names none: no builders were set)."""
    if standin is None or not (standin / "host.json").is_file():
        return ""
    feature = json.loads((standin / "host.json").read_text()).get("systemFeature", "")
    return feature if isinstance(feature, str) else ""


def builder_options(mode: str, builders: str, standin: Path | None) -> list[str]:
    """`--option builders` and its companions for the nix_builders setting.

    Builders fetch what they can from their own substituters (builders-use-substitutes) rather than through this
    machine. Pinned: the setting as given (empty leaves Nix's own `builders` alone). Host: this machine advertises the
    stand-in's toolchain feature whenever the stand-in names one (its derivations require it, and this machine has
    that toolchain by definition: a collected tool rebuilt from its run command, with no builders passed, still
    builds here). No builders: this machine only (`builders` emptied, as before). With builders, Nix offloads only
    to those listing the feature."""
    offload = ["--option", "builders", builders, "--option", "builders-use-substitutes", "true"]
    if mode != "host":
        return offload if builders else []
    feature = standin_feature(standin)
    here = ["--option", "extra-system-features", feature] if feature else []
    if not builders or not feature:
        if builders:
            logger.warning("nix_builders is ignored: the host stand-in names no toolchain feature (render it again)")
        return ["--option", "builders", "", *here]
    if not builders.lstrip().startswith("@") and not any(feature in features for features in _entry_features(builders)):
        logger.warning(
            "no builder in nix_builders lists the toolchain feature %s: host stand-in builds stay on this machine",
            feature,
        )
    return [*offload, *here]


def _entry_features(builders: str) -> list[list[str]]:
    """The supported features of each machines entry (entries split by newlines or semicolons)."""
    found = []
    for entry in builders.replace(";", "\n").splitlines():
        fields = entry.split("#", 1)[0].split()
        if len(fields) > SUPPORTED_FEATURES_FIELD:
            found.append(fields[SUPPORTED_FEATURES_FIELD].split(","))
    return found


def builder_nix_conf(standin: Path) -> str:
    """What a builder's own nix.conf needs to build this machine's stand-in derivations: Nix's sandbox with the same
    host paths let in, and the toolchain feature advertised (the builder's Nix checks it as this machine's does)."""
    from flakebot.nix.command import sandbox_paths

    feature = standin_feature(standin)
    if not feature:
        raise NixError(
            "the host stand-in names no toolchain feature",
            fix="set nix_builders ('flakebot config set nix_builders ...') so the stand-in is rendered with one",
        )
    return (
        "sandbox = true\nsandbox-fallback = false\n"
        f"extra-sandbox-paths = {' '.join(sandbox_paths(standin))}\n"
        f"extra-system-features = {feature}\n"
    )


def remote_failure(pname: str, tail: list[str]) -> NixError | None:
    """A failed build's NixError when a remote builder is why: the builder it ran on went away mid-build (Nix 2.8
    moves a started build to no other builder), or no builder (nor this machine) may build it. None otherwise. Only
    Nix's own lines count: a build printing the same words is an ordinary failed build."""
    tail = [line for line in tail if not BUILD_OUTPUT.match(line)]
    if any(NO_MACHINE in line for line in tail):
        return NixError(
            f"nix build of {pname} failed: no builder offers what its derivations require ({NO_MACHINE})",
            fix="list the toolchain feature in a builder's entry and its nix.conf (docs/team-builders.md), "
            "or let this machine build (max-jobs above 0)",
            log_tail="\n".join(tail),
        )
    where = [match for line in tail if (match := REMOTE_BUILD.search(line))]
    lost = [line.strip() for line in tail if any(sign in line for sign in CONNECTION_LOST)]
    if not where or not lost:
        return None
    drv, uri = where[-1].groups()
    return NixError(
        f"nix build of {pname} failed: the remote builder {uri} went away mid-build ({lost[0]})",
        fix="build again (Nix moves no started build to another builder); check that builder (ssh, its nix-daemon) "
        "or take it out of nix_builders",
        log_tail="\n".join(tail),
        drv=drv,
        builder=uri,
    )
