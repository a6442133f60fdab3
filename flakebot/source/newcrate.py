"""new_crate(): start a new binary crate (optionally depending on a library) when no crate fits as a base."""

from __future__ import annotations

import logging
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from flakebot.cargo.metadata import cargo_error, locate
from flakebot.cargo.runner import Cargo
from flakebot.config import Settings
from flakebot.crates import CrateInfo
from flakebot.errors import AcquireError
from flakebot.source import gitrepo
from flakebot.source.acquisition import os_cause, staging

logger = logging.getLogger(__name__)


def new_crate(name: str, dest: Path, *, library: CrateInfo | None, settings: Settings) -> dict[str, Any]:
    """`cargo new --bin NAME` at `dest` on branch flakebot/NAME, depending on `library` if given; returns the origin."""
    cargo = Cargo.for_run(settings, Path(tempfile.gettempdir()) / "flakebot-target")  # init/add/metadata never build
    branch = f"flakebot/{name}"
    try:
        with staging(dest) as tmp:
            origin = _create(cargo, name, tmp, library, branch)
    except AcquireError as exc:
        raise AcquireError(
            f"cannot start new crate {name}: {exc.message}", fix=exc.fix, crate=name, cause=exc.message
        ) from None
    except OSError as exc:
        raise AcquireError(
            f"cannot start new crate {name}: {os_cause(exc)}",
            fix="free some disk space or check permissions",
            crate=name,
        ) from None
    logger.info("started new crate %s at %s", name, dest)
    return origin


def _create(cargo: Cargo, name: str, tmp: Path, library: CrateInfo | None, branch: str) -> dict[str, Any]:
    # `cargo init` fills the existing staging directory (`cargo new` insists on creating its own).
    _cargo(cargo, ["init", "--bin", "--vcs", "none", "--name", name, str(tmp)], None)
    (tmp / ".gitignore").write_text("/target\n")
    message = f"new {name}"
    if library is not None:
        # The version the registry (the local directory source offline) holds for the library.
        # online: resolves against the index, runs no crate code
        _cargo(cargo, ["add", f"{library.name}@{library.version}"], tmp)
        message += f" using {library.name} {library.version}"
    version = _written_version(tmp) or locate(cargo, tmp, name)[1]
    revision = gitrepo.init_commit(tmp, message, branch)
    origin: dict[str, Any] = {
        "method": "new",
        "crate": name,
        "url": "",
        "revision": revision,
        "version": version,
        "crate_dir": "",
        "branch": branch,
    }
    if library is not None:
        origin["library"] = {"name": library.name, "version": library.version}
    return origin


def _written_version(crate: Path) -> str:
    """The version `cargo init` wrote into the manifest ('' when it is not a plain string, e.g. a workspace's): the
    crate is cargo's own writing, so no `cargo metadata` is needed to read it back."""
    try:
        version = tomllib.loads((crate / "Cargo.toml").read_text()).get("package", {}).get("version")
    except (OSError, ValueError, AttributeError):
        return ""
    return version if isinstance(version, str) else ""


def _cargo(cargo: Cargo, args: list[str], crate_dir: Path | None) -> None:
    result = cargo.run(args, crate_dir, timeout=300)
    if result.returncode != 0:
        fix = "check that the tool name is a valid crate name and that the library is in the registry"
        raise AcquireError(f"cargo {' '.join(args[:2])} failed: {cargo_error(result.stderr)}", fix=fix)
