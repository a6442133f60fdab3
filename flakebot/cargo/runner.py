"""flakebot's cargo runner: every cargo call of a run goes through here.

It points cargo at the configured crate source without writing anything into the tool's own tree
(`--config` flags, not .cargo/config.toml), adds `--offline` when offline, and gives every call of
a run the same target directory so repeated builds are incremental.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from flakebot.config import Settings
from flakebot.errors import FlakebotError

logger = logging.getLogger(__name__)

LOCAL_SOURCE = "flakebot-local"


def cargo_program() -> str:
    """Absolute path of cargo (rustup's proxy or a plain install)."""
    found = shutil.which("cargo") or str(Path.home() / ".cargo/bin/cargo")
    if not Path(found).exists():
        raise FlakebotError("cargo is not installed", fix="install Rust (https://rustup.rs) or your distribution's cargo package")
    return str(Path(found).resolve()) if "rustup" not in Path(found).resolve().name else found


def registry_dir(settings: Settings) -> Path:
    """The directory source cargo uses offline: `registry` when it names a directory, else `local_registry`."""
    named = settings.registry not in ("auto", "local", "crates-io")
    return Path(settings.registry if named else settings.local_registry).expanduser().resolve()


@dataclass
class Cargo:
    """How to call cargo for one run."""

    target_dir: Path
    offline: bool = False
    registry_dir: Path | None = None  # a cargo directory source replacing crates-io (offline)
    extra_env: dict[str, str] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)  # for check/build/test: the tool's binary needs them (required-features)

    @classmethod
    def for_run(cls, settings: Settings, target_dir: Path) -> Cargo:
        offline = settings.offline or settings.registry != "crates-io"
        return cls(target_dir=target_dir, offline=offline, registry_dir=registry_dir(settings) if offline else None)

    def config_args(self) -> list[str]:
        """Global cargo flags: the crate source and --offline."""
        args: list[str] = []
        if self.registry_dir is not None:
            args += [
                "--config",
                f"source.crates-io.replace-with='{LOCAL_SOURCE}'",
                "--config",
                f"source.{LOCAL_SOURCE}.directory='{self.registry_dir}'",
            ]
        if self.offline:
            args.append("--offline")
        return args

    def argv(self, *args: str) -> list[str]:
        """The full command line for `cargo ARGS`."""
        return [cargo_program(), *self.config_args(), *args]

    def env(self) -> dict[str, str]:
        """Environment for a cargo call: the run's target dir, no terminal colours, rustup's home."""
        env = {
            "CARGO_TARGET_DIR": str(self.target_dir),
            "CARGO_TERM_COLOR": "never",
            "CARGO_TERM_PROGRESS_WHEN": "never",
            **self.extra_env,
        }
        for key in ("RUSTUP_HOME", "CARGO_HOME", "RUSTUP_TOOLCHAIN"):
            if key in os.environ:
                env[key] = os.environ[key]
        env.setdefault("RUSTUP_HOME", str(Path.home() / ".rustup"))
        return env

    def run(self, args: list[str], cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run cargo directly (no sandbox): for flakebot's own trusted steps such as `cargo metadata`."""
        argv = self.argv(*args)
        logger.debug("cargo: %s (in %s)", " ".join(args), cwd)
        return subprocess.run(argv, cwd=cwd, env={**os.environ, **self.env()}, capture_output=True, text=True, timeout=timeout)
