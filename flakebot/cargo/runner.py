"""flakebot's cargo: the command line and environment of every cargo call of a run.

Two kinds of call, and nothing in between (DESIGN.md, "The trust boundary"):

- **host calls** (`Cargo.run`): flakebot's trusted steps that never compile or run crate code
  (`metadata`, `generate-lockfile`, `fetch`, `add`, `locate-project`, `init`). They may use the network.
  Each runs from a fresh empty directory with `--manifest-path`, so no `.cargo/config.toml` or
  `rust-toolchain.toml` from the tree is read (a config above that directory, which cargo also reads, counts
  in the metadata cache's key, and is refused when another user's); with a minimal environment (nothing of
  flakebot's own but PATH and rustup's home: no API keys or tokens); with flakebot's own CARGO_HOME (shared by
  every run, so a crate is downloaded once) and the active toolchain pinned through RUSTUP_TOOLCHAIN (its own cargo
  run, not rustup's proxy: `host_cargo`).
- **sandboxed calls** (`Cargo.argv` + `Cargo.env`, given to a Sandbox): everything that builds or tests.
  Always `--offline`: they read only what host calls fetched into CARGO_HOME's registry/ (bound read-only
  into the sandbox) or a local directory source.

The crate source is always given as `--config` flags, never written into the tool's tree: a directory
source (Debian's registry, a `cargo vendor` folder) when offline, else crates.io or the sparse index of
the `cratesio_index_url` setting as crates.io's replacement (so Cargo.lock keeps crates.io's identity
and checksums).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flakebot import launcher, probecache
from flakebot.cargo import metacache, sources
from flakebot.config import Settings, cache_home, rustup_home
from flakebot.errors import FlakebotError
from flakebot.events import waiting_on

logger = logging.getLogger(__name__)

LOCAL_SOURCE = "flakebot-local"
PROFILED = ("build", "check", "test", "run", "clippy", "rustc")  # the subcommands `profile` applies to
MIRROR_SOURCE = "flakebot-mirror"
DEFAULT_INDEX_URL = "https://index.crates.io"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
NEVER_FETCH = {"locate-project", "init", "new", "read-manifest", "pkgid", "version"}
# The rustc of the pinned nixpkgs (flakebot.nix.lock says where both were read): crafted crates declare it as
# rust-version, and cargo calls prefer a toolchain of exactly it. Here because cargo/ imports nothing of nix/.
PINNED_RUSTC = "1.95.0"
# Whatever the crate's edition: a dependency version whose rust-version is newer than the package's (a crafted crate
# declares the pinned nixpkgs' rustc) or, without one, than the toolchain's, is picked only when no other fits.
RESOLVER_ARGS = ["--config", "resolver.incompatible-rust-versions='fallback'"]


def cargo_program() -> str:
    """Absolute path of cargo (rustup's proxy or a plain install)."""
    found = shutil.which("cargo") or str(Path.home() / ".cargo/bin/cargo")
    if not Path(found).exists():
        raise FlakebotError(
            "cargo is not installed (not on PATH, nor in ~/.cargo/bin)",
            fix="install Rust (https://rustup.rs) or your distribution's cargo package; a server started with another "
            "HOME needs cargo on its PATH (e.g. /home/you/.cargo/bin) or RUSTUP_HOME set in its environment",
        )
    return str(Path(found).resolve()) if "rustup" not in Path(found).resolve().name else found


def host_cargo() -> str:
    """The cargo of host calls: when cargo is rustup's proxy, the pinned toolchain's own binary (the proxy would only
    choose that same toolchain, for several ms a call: RUSTUP_TOOLCHAIN is set on every call); else cargo_program().
    Sandboxed calls keep the proxy (it also sets the toolchain's library path for what they build and run)."""
    program = cargo_program()
    toolchain = active_toolchain()
    if toolchain and "rustup" in Path(program).resolve().name:
        own = rustup_home() / "toolchains" / toolchain / "bin" / "cargo"
        if own.is_file() and os.access(own, os.X_OK):
            return str(own)
    return program


def registry_dir(settings: Settings) -> Path:
    """The directory source cargo uses offline: `registry` when it names a directory, else `local_registry`."""
    named = settings.registry not in ("auto", "local", "crates-io")
    return Path(settings.registry if named else settings.local_registry).expanduser().resolve()


def flakebot_cargo_home(settings: Settings | None = None) -> Path:
    """flakebot's own CARGO_HOME, shared by every run: the registry cache host calls fetch into."""
    return (settings.path("cache_dir") if settings is not None else cache_home()) / "cargo-home"


def mirror_index(settings: Settings) -> str | None:
    """The sparse index replacing crates.io (`sparse+URL/`), or None for crates.io itself."""
    url = settings.cratesio_index_url.rstrip("/")
    if url == DEFAULT_INDEX_URL:
        return None
    return url if url.startswith("sparse+") else f"sparse+{url}/"


@functools.cache
def active_toolchain() -> str | None:
    """The rustup toolchain every cargo call of flakebot's uses (None without rustup), pinned so a tree's
    rust-toolchain.toml is ignored: RUSTUP_TOOLCHAIN when set; else an installed toolchain whose rustc is the pinned
    nixpkgs' own (so code and locks are made with the compiler users build with); else rustup's active one, said in
    the log."""
    if os.environ.get("RUSTUP_TOOLCHAIN"):
        return os.environ["RUSTUP_TOOLCHAIN"]
    rustup = shutil.which("rustup")
    if rustup is None:
        return None
    versions = toolchain_versions()
    matching = [name for name, version in versions.items() if version == PINNED_RUSTC]
    if matching:  # rustup names a version-pinned toolchain "1.95.0-<triple>": the surest match comes first
        return sorted(matching, key=lambda name: (not name.startswith(PINNED_RUSTC), name))[0]
    active = _rustup_active(rustup)
    if active:
        logger.warning(
            "no installed toolchain has rustc %s (the pinned nixpkgs'): using %s (rustc %s); code may need a newer "
            "compiler than users' nixpkgs has (rustup toolchain install %s)",
            PINNED_RUSTC,
            active,
            versions.get(active, "?"),
            PINNED_RUSTC,
        )
    return active


def toolchain_versions() -> dict[str, str]:
    """{rustup toolchain name: its rustc's version} for the toolchains installed under RUSTUP_HOME (nightly and beta
    report versions such as 1.97.0-nightly, which match no pin)."""
    found: dict[str, str] = {}
    root = rustup_home() / "toolchains"
    for toolchain in sorted(root.iterdir()) if root.is_dir() else []:
        rustc = toolchain / "bin" / "rustc"
        if not rustc.is_file():
            continue
        try:
            shown = probecache.output(rustc, "-V").split()
        except (OSError, subprocess.SubprocessError):
            continue
        if len(shown) >= 2 and shown[0] == "rustc":
            found[toolchain.name] = shown[1]
    return found


def _rustup_active(rustup: str) -> str | None:
    """rustup's active toolchain asked from an empty directory (no toolchain file can be there)."""
    env = {"PATH": os.environ.get("PATH", DEFAULT_PATH), "RUSTUP_HOME": str(rustup_home()), "HOME": str(Path.home())}
    with tempfile.TemporaryDirectory(prefix="flakebot-rustup-") as neutral:
        try:
            shown = launcher.run(
                [rustup, "show", "active-toolchain"], cwd=neutral, env=env, capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError) as exc:
            logger.warning("cannot ask rustup for the active toolchain (%s); the toolchain is not pinned", exc)
            return None
    words = shown.stdout.split()
    if shown.returncode != 0 or not words:
        logger.warning(
            "rustup show active-toolchain failed (%s); the toolchain is not pinned", shown.stderr.strip()[-200:]
        )
        return None
    return words[0]


@dataclass
class Cargo:
    """How to call cargo for one run: the crate source, the network mode, the target dir and CARGO_HOME."""

    target_dir: Path
    offline: bool = False
    registry_dir: Path | None = None  # a cargo directory source replacing crates-io (offline)
    index_url: str | None = (
        None  # a sparse index replacing crates-io (online), e.g. sparse+http://127.0.0.1:8080/index/
    )
    # CARGO_HOME of host calls; its registry/ is read-only in the sandbox
    home: Path = field(default_factory=flakebot_cargo_home)
    extra_env: dict[str, str] = field(default_factory=dict)
    # for check/build/test: the tool's binary needs them (required-features)
    features: list[str] = field(default_factory=list)
    # git URLs host calls may fetch (cargo/sources.py; the git_sources setting)
    git_sources: tuple[str, ...] = field(default_factory=lambda: sources.git_sources(sources.DEFAULT_GIT_SOURCES))
    tree: Path | None = None  # path dependencies stay inside it (the run's workspace); None: the cargo workspace root
    git_view: Path | None = None  # the run's own copy of the git/ checkouts its Cargo.lock names (cargo/fetch.py)
    # sandboxed calls only: where the sandbox shows registry_dir (the path a Nix build sees it at, nix/loopdeps.py), and
    # the profile flags of a build, check or test (the deps derivation's: release, its --target)
    sandbox_registry: Path | None = None
    profile: tuple[str, ...] = ()

    @classmethod
    def for_run(cls, settings: Settings, target_dir: Path, run_dir: Path | None = None) -> Cargo:
        """The run's cargo; with `run_dir`, path dependencies stay in its workspace and it keeps its own git view."""
        offline = settings.offline or settings.registry != "crates-io"
        return cls(
            target_dir=target_dir,
            offline=offline,
            registry_dir=registry_dir(settings) if offline else None,
            index_url=None if offline else mirror_index(settings),
            home=flakebot_cargo_home(settings),
            git_sources=sources.git_sources(settings.git_sources),
            tree=run_dir / "workspace" if run_dir is not None else None,
            git_view=run_dir / "cargo-git" if run_dir is not None else None,
        )

    @property
    def online(self) -> bool:
        return not self.offline

    def source_args(self, *, sandboxed: bool = False) -> list[str]:
        """`--config` flags naming the crate source: a directory source, or a sparse index standing in for crates.io."""
        if self.registry_dir is not None:
            directory = self.sandbox_registry if sandboxed and self.sandbox_registry else self.registry_dir
            return [
                "--config",
                f"source.crates-io.replace-with='{LOCAL_SOURCE}'",
                "--config",
                f"source.{LOCAL_SOURCE}.directory='{directory}'",
            ]
        if self.index_url is not None:
            return [
                "--config",
                f"source.crates-io.replace-with='{MIRROR_SOURCE}'",
                "--config",
                f"source.{MIRROR_SOURCE}.registry='{self.index_url}'",
            ]
        return []

    def config_args(self) -> list[str]:
        """Global flags of a host call: the crate source, the MSRV-aware resolver, and --offline when offline."""
        return [*self.source_args(), *RESOLVER_ARGS, *(["--offline"] if self.offline else [])]

    def argv(self, *args: str) -> list[str]:
        """A sandboxed `cargo ARGS`: the crate source, the MSRV-aware resolver, and always --offline (no network)."""
        flags = list(self.profile) if args and args[0] in PROFILED else []
        # a --config after the subcommand would replace every one before it (the crate source's among them)
        configs = [f for i, f in enumerate(flags) if f == "--config" or (i > 0 and flags[i - 1] == "--config")]
        profile = [f for f in flags if f not in configs]
        return [
            cargo_program(), *self.source_args(sandboxed=True), *RESOLVER_ARGS, *configs, "--offline",
            *args[:1], *profile, *args[1:],
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        """Environment for a cargo call: target dir, no colours, rustup's home and the pinned toolchain, flakebot's CARGO_HOME.
        (A bubblewrap sandbox replaces CARGO_HOME by its own, with this one's registry/ bound read-only.)"""
        env = {
            "CARGO_TARGET_DIR": str(self.target_dir),
            "CARGO_TERM_COLOR": "never",
            "CARGO_TERM_PROGRESS_WHEN": "never",
            "CARGO_HOME": str(self.home),
            "RUSTUP_HOME": str(rustup_home()),
            **self.extra_env,
        }
        toolchain = active_toolchain()
        if toolchain:
            env["RUSTUP_TOOLCHAIN"] = toolchain
        return env

    def host_env(self) -> dict[str, str]:
        """The whole environment of a host call: PATH, a HOME of flakebot's own, and `env()`; nothing else of ours."""
        home = self.home.parent / "cargo-host-home"  # not the user's: no ~/.gitconfig, ~/.cargo/credentials or ~/.netrc
        try:
            home.mkdir(parents=True, exist_ok=True)
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise FlakebotError(
                f"cannot create flakebot's cargo home {self.home}: {exc.strerror}",
                fix="make flakebot's cache directory writable (setting cache_dir)",
            ) from None
        return {
            "PATH": os.environ.get("PATH", DEFAULT_PATH),
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **self.env(),
            **sources.git_fetch_env(self.git_sources),
        }

    def host_argv(self, args: list[str], crate_dir: Path | None) -> list[str]:
        """`cargo [source flags] SUBCOMMAND --manifest-path CRATE_DIR/Cargo.toml ARGS...` (no manifest for `init PATH`)."""
        manifest = ["--manifest-path", str(Path(crate_dir).resolve() / "Cargo.toml")] if crate_dir is not None else []
        # offline, --offline is already a global flag: said once, the sources check's `metadata --no-deps --offline`
        # and a plain `metadata --no-deps` are one call (and one answer kept, cargo/metacache.py)
        rest = [a for a in args[1:] if not (self.offline and a == "--offline")]
        return [host_cargo(), *self.config_args(), args[0], *manifest, *rest]

    def run(
        self,
        args: list[str],
        crate_dir: Path | None,
        timeout: float | None = None,
        *,
        listed: dict[str, Any] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """A trusted host call (no sandbox, network when online) on the crate at `crate_dir`; see the module docstring.
        A call that may resolve or fetch first checks every source the tree names (cargo/sources.py): a refused
        one is the call's failure (exit 101, the rule on stderr as cargo's `error:`), and nothing runs. `listed`:
        the tree's `metadata --no-deps` answer when the caller already has it for the tree as it is (its own copy,
        unchanged since): the check reads it rather than asking cargo again."""
        if crate_dir is None or "--no-deps" in args or args[0] in NEVER_FETCH:
            return self.call(args, crate_dir, timeout)
        failed = sources.check(self, Path(crate_dir), listed)
        if failed is not None:
            return failed
        result = self.call(args, crate_dir, timeout)
        # what resolution added (a git dependency's own dependencies) is checked too: the sandbox never sees it
        reason = sources.lock_refusal(_lock_of(Path(crate_dir)), self.git_sources) if result.returncode == 0 else ""
        return sources.refused(result.args, reason) if reason else result

    def call(
        self, args: list[str], crate_dir: Path | None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The host call itself, unchecked: only for calls that cannot fetch (`metadata --no-deps --offline`)."""
        argv = self.host_argv(args, crate_dir)
        env = self.host_env()
        above = _configs_above(Path(tempfile.gettempdir()))
        foreign = [config for config in above if _foreign(config)]
        if foreign:  # another user's config would steer the call (a [patch], a source replacing crates.io)
            return sources.refused(
                argv,
                f"cargo config {foreign[0]} refused: another user's, above the host call's directory "
                "(remove it, or set TMPDIR to a directory of your own)",
            )
        home = Path(env["CARGO_HOME"])
        configs = [home / "config.toml", home / "config", *above]
        key = self._metadata_key(argv, env, crate_dir, configs) if args[0] == "metadata" else None
        kept = metacache.get(key) if key is not None else None
        if kept is not None:
            return kept
        logger.debug("cargo (host): %s %s", " ".join(args), crate_dir or "")
        with tempfile.TemporaryDirectory(prefix="flakebot-cargo-") as neutral, waiting_on(f"cargo {args[0]}"):
            result = launcher.run(
                argv, cwd=neutral, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        # keyed on the state after the call (a Cargo.lock it wrote); only an answer whose manifests the digest saw
        if key is not None and result.returncode == 0 and self.tree and metacache.confined(result.stdout, self.tree):
            after = self._metadata_key(argv, env, crate_dir, configs)
            if after is not None:
                metacache.put(after, result)
        return result

    def _metadata_key(
        self, argv: list[str], env: dict[str, str], crate_dir: Path | None, configs: list[Path]
    ) -> str | None:
        """The digest a `cargo metadata` answer is kept under (cargo/metacache.py); None (never kept) unless the crate
        is inside the run's tree, the whole of what cargo may read for it."""
        if crate_dir is None or self.tree is None or not Path(crate_dir).resolve().is_relative_to(self.tree.resolve()):
            return None
        return metacache.digest(argv, env, self.tree, self.target_dir, self.registry_dir, configs)


def _configs_above(directory: Path) -> list[Path]:
    """The cargo config files a call from a new directory under `directory` reads besides CARGO_HOME's: cargo looks in
    every directory above its working directory (the host calls' is a temporary one, under a shared /tmp)."""
    found = []
    for above in [directory, *directory.parents]:
        for name in ("config", "config.toml"):
            if os.path.lexists(above / ".cargo" / name):
                found.append(above / ".cargo" / name)
    return found


def _foreign(config: Path) -> bool:
    """The config file, or the .cargo directory holding it, is neither root's nor ours (or cannot be told)."""
    try:
        owners = {config.lstat().st_uid, config.parent.lstat().st_uid}
    except OSError:
        return True
    return not owners <= {0, os.getuid()}


def _lock_of(crate_dir: Path) -> Path:
    """The Cargo.lock cargo uses for `crate_dir`: the nearest one at or above it (the workspace root's)."""
    for directory in [crate_dir.resolve(), *crate_dir.resolve().parents]:
        if (directory / "Cargo.lock").is_file():
            return directory / "Cargo.lock"
    return crate_dir / "Cargo.lock"
