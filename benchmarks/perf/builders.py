"""Builds spread over Nix remote builders: six small stand-in builds (each a new crate whose build script takes
`build_seconds`, packaged by flakebot's package_crate, six at once) on one builder, then six others on two builders,
in the same run; the figure is the wall on two over the wall on one (goal <= 0.6).

The builders are sshd processes, each in its own mount and network namespace with its own /nix and one job at a time
(benchmarks/scenarios/builders.py); this machine builds nothing itself (max-jobs = 0). Each builder first builds one
crate of its own, so both hold the stand-in's common inputs before anything is timed. Needs root and openssh-server.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.scenarios.builders import fleet
from flakebot.config import Settings
from flakebot.nix.builders import builder_nix_conf, standin_feature
from flakebot.nix.flake import package_crate
from flakebot.nix.standin import ensure_standin

REGISTRY = Path("/usr/share/cargo/registry")


@dataclass(frozen=True, kw_only=True)
class BuildersResult:
    """run()'s result, as report.json holds it."""

    builds: int
    build_seconds: float
    one_builder_s: float
    two_builders_s: float
    ratio: float
    spread: list[int]  # of the builds on two builders, how many each built


RESULT = BuildersResult


def crate(root: Path, build_seconds: float) -> Path:
    """A new binary crate (its name a nonce) whose build script sleeps build_seconds: the build's own work."""
    name = f"spread-{secrets.token_hex(5)}"
    files = {
        "Cargo.toml": f'[package]\nname = "{name}"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n',
        "src/main.rs": f'fn main() {{ println!("{name}: a small tool\\n\\nUSAGE: {name} [--help]"); }}\n',
        "build.rs": f"fn main() {{ std::thread::sleep(std::time::Duration::from_millis({int(build_seconds * 1000)})); }}\n",
    }
    for rel, text in files.items():
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / name / rel).write_text(text)
    return root / name


@contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def package_all(crates: list[Path], out: Path, settings: Settings) -> tuple[float, list[str]]:
    """(wall seconds, store paths) of packaging every crate at once."""
    started = time.perf_counter()
    with ThreadPoolExecutor(len(crates)) as pool:
        results = list(pool.map(lambda c: package_crate(c, out / c.name, settings), crates))
    return time.perf_counter() - started, [r.store_path for r in results]


def run(builds: int = 6, build_seconds: float = 3.0) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="flakebot-bench-builders-") as tmp:
        home = Path(tmp)
        home.chmod(0o755)
        base = Settings(
            workdir=str(home / "work"),
            cache_dir=str(home / "cache"),
            catalog_dir=str(home / "catalog"),
            nixpkgs="host",
            registry="local",
            local_registry=str(REGISTRY),
            nix_builders="ssh-ng://placeholder",
        )
        standin = ensure_standin(base)
        spec = (standin_feature(standin), builder_nix_conf(standin))
        with (
            fleet(home / "fleet", {"one": spec, "two": spec}) as pair,
            environment(NIX_SSHOPTS=pair.sshopts, NIX_CONFIG="max-jobs = 0"),
        ):
            for name in ("one", "two"):  # warm: each builder holds the stand-in's common inputs
                warm = dataclasses.replace(base, nix_builders=pair.setting(name))
                package_all([crate(home / "src", 0)], home / "out", warm)
            one = dataclasses.replace(base, nix_builders=pair.setting("one"))
            one_s, _ = package_all([crate(home / "src", build_seconds) for _ in range(builds)], home / "out", one)
            two = dataclasses.replace(base, nix_builders=pair.setting("one", "two"))
            crates = [crate(home / "src", build_seconds) for _ in range(builds)]
            two_s, paths = package_all(crates, home / "out", two)
            spread = [sum(pair[name].has(path) for path in paths) for name in ("one", "two")]
    return dataclasses.asdict(
        BuildersResult(
            builds=builds,
            build_seconds=build_seconds,
            one_builder_s=round(one_s, 2),
            two_builders_s=round(two_s, 2),
            ratio=round(two_s / one_s, 3),
            spread=spread,
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--builds", type=int, default=6)
    parser.add_argument("--build-seconds", type=float, default=3.0)
    options = parser.parse_args()
    print(json.dumps(run(options.builds, options.build_seconds), indent=1))
