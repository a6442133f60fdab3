"""The host-toolchain stand-in for nixpkgs: a flake rendered for this machine, for offline builds.

Generated flakes name `github:NixOS/nixpkgs/nixos-26.05`; offline, builds pass
`--override-input nixpkgs path:<stand-in>` instead. The stand-in's Nix files are static
(templates/standin/); only host.json (where builds see the toolchain, RUSTUP_HOME and the local crate
directory source, the host paths bound there, the checksums that source vouches for, the URL .crate files are
fetched from) and licenses.json are rendered. Files are rewritten only when their content changes, so the
stand-in keeps its store hash and builds stay cached.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from flakebot import launcher, probecache
from flakebot.config import Settings, rustup_home
from flakebot.errors import NixError
from flakebot.fsutil import atomic_write_text
from flakebot.nix import build_inputs, builders, licenses
from flakebot.render import template_dir

logger = logging.getLogger(__name__)

# Where builds see the host toolchain, RUSTUP_HOME and the crate registry (bind-mounted, readable, not writable).
SANDBOX_ROOT = "/flakebot"
TEMPLATE_DIR = template_dir() / "standin"
STATIC_FILES = (
    "flake.nix",
    "lib.nix",
    "pkgs.nix",
    "rust.nix",
    "cargo-build.sh",
    "vendor-crates.sh",
    "fetch-git.sh",
    "git-crate.sh",
    "host-input.sh",
    "docker.nix",
    "docker-image.sh",
)
# What nixpkgs' stdenv puts on a builder's PATH (coreutils, findutils, diffutils, sed, grep, awk, tar, gzip, bzip2, xz,
# make, patch, bash, the C compiler and binutils): a stand-in build sees these host programs and the toolchain, and
# other programs (perl, python3, cmake, protoc, pkg-config) only when it declares them (build_inputs.PACKAGES).
STDENV_PROGRAMS = (
    *("bash", "sh", "[", "basename", "cat", "chmod", "chown", "cksum", "comm", "cp", "csplit", "cut", "date", "dd"),
    *("df", "dirname", "du", "echo", "env", "expand", "expr", "factor", "false", "fold", "head", "id", "install"),
    *("join", "link", "ln", "ls", "md5sum", "mkdir", "mktemp", "mv", "nl", "nproc", "numfmt", "od", "paste"),
    *("printenv", "printf", "pwd", "readlink", "realpath", "rm", "rmdir", "seq", "sha1sum", "sha256sum", "sha512sum"),
    *("shuf", "sleep", "sort", "split", "stat", "sum", "tac", "tail", "tee", "test", "timeout", "touch", "tr", "true"),
    *("truncate", "tsort", "uname", "unexpand", "uniq", "unlink", "wc", "whoami", "yes", "base64", "b2sum"),
    *("find", "xargs", "diff", "cmp", "diff3", "sdiff", "sed", "grep", "egrep", "fgrep", "awk", "gawk", "tar"),
    *("gzip", "gunzip", "zcat", "bzip2", "bunzip2", "xz", "unxz", "make", "patch", "cc", "gcc", "c++", "g++", "cpp"),
    *("ld", "ld.bfd", "as", "ar", "nm", "ranlib", "strip", "objcopy", "objdump", "readelf", "strings", "size"),
)
# Where host programs are looked for: directories every build sees (command.SYSTEM_PATHS), never /root's.
HOST_BIN_DIRS = ("/usr/bin", "/bin", "/usr/local/bin")
PKG_CONFIG_DIRS = (
    "/usr/local/lib/x86_64-linux-gnu/pkgconfig",
    "/usr/local/lib/pkgconfig",
    "/usr/local/share/pkgconfig",
    "/usr/lib/pkgconfig",
    "/usr/share/pkgconfig",
)


def standin_dir(settings: Settings) -> Path:
    """Where this machine's stand-in lives (inside flakebot's cache directory)."""
    return settings.path("cache_dir") / "nixpkgs-host"


def ensure_standin(settings: Settings) -> Path:
    """Render (or refresh) the stand-in flake for this machine and return its directory."""
    directory = standin_dir(settings)
    files = {name: (TEMPLATE_DIR / name).read_text() for name in STATIC_FILES}
    files["host.json"] = host_json(settings)
    files["licenses.json"] = _licenses_json()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            path = directory / name
            if not path.is_file() or path.read_text() != text:
                atomic_write_text(path, text)
    except OSError as exc:
        raise NixError(
            f"cannot write the nixpkgs stand-in in {directory}: {exc.strerror}",
            fix="make flakebot's cache directory writable (setting cache_dir)",
        ) from None
    return directory


# host_facts' answer as host.json's text, kept in this process while nothing it read has changed (_fingerprint): a
# craft asks it in the edit loop's deps plan, the deps build and the package build, each time two rustc processes and
# ~0.1 s of reads. The text, not the facts: a kept answer is neither copied nor rendered again (~3 ms a call).
_facts: dict[tuple[Any, ...], tuple[tuple[Any, ...], str]] = {}


def host_facts(settings: Settings) -> dict[str, Any]:
    """This machine's toolchain as the stand-in needs it (_host_facts), asked again only when what it read changed."""
    return dict(json.loads(host_json(settings)))  # the caller's own copy: it may change it


def host_json(settings: Settings) -> str:
    """host_facts as the stand-in's host.json holds them."""
    sysroot = rust_sysroot()
    # what else they are read with: PATH finds bash, RUSTUP_HOME is where builds see the toolchain
    where = (os.environ.get("PATH", ""), str(rustup_home()), str(sysroot))
    key = (settings.local_registry, settings.cratesio_static_url, settings.nix_builders, *where)
    seen = _fingerprint(Path(settings.local_registry).expanduser(), sysroot)
    kept = _facts.get(key)
    if kept is not None and kept[0] == seen:
        return kept[1]
    text = json.dumps(_host_facts(settings, sysroot), indent=2, sort_keys=True) + "\n"
    _facts.clear()  # one machine, one answer: a changed toolchain or registry replaces it
    _facts[key] = (seen, text)
    return text


@functools.cache
def _licenses_json() -> str:
    """The stand-in's licenses.json: flakebot's own table, the same for the process's life."""
    return json.dumps(licenses.license_table(), indent=2, sort_keys=True) + "\n"


def _fingerprint(registry: Path, sysroot: Path) -> tuple[Any, ...]:
    """What host facts are read from, as the kernel stamps it: installing, removing or upgrading a crate (dpkg renames
    files into place), a toolchain's binaries, a host program or a pkg-config module changes a directory's or file's
    inode, size or times here."""
    places = [registry, sysroot / "bin", sysroot / "bin" / "rustc", sysroot / "bin" / "cargo", Path("/usr/lib")]
    places += [Path(d) for d in (*HOST_BIN_DIRS, *pkg_config_dirs())]  # the multiarch one holds most .pc files
    # the C compiler whose --version the builders' feature digests, stamped through its links: update-alternatives
    # retargets /etc/alternatives/cc and leaves /usr/bin as it was
    places += [Path(p) for p in host_programs(("cc",)).values()]
    return (*((str(place), probecache.stamp(place)) for place in places), *_crate_stamps(registry))


def _crate_stamps(registry: Path) -> list[tuple[str, tuple[Any, ...], tuple[Any, ...]]]:
    """Each crate's directory and the checksum file it vouches with, stamped through any link (what cargo reads): a
    crate retargeted, replaced or rewritten changes a device, inode, size or time. os.stat, not probecache.stamp's
    realpath: a registry holds hundreds of crates, and resolving each path component by component cost most of the
    fingerprint (~6 ms a call, three calls a craft)."""
    try:
        with os.scandir(registry) as entries:
            names = sorted(entry.name for entry in entries)
    except OSError:
        return []
    # the paths joined as text: a Path made per crate cost ~4 ms a call (pathlib), the stats themselves ~0.7 ms
    top = os.fspath(registry)
    return [(name, _stat(f"{top}/{name}"), _stat(f"{top}/{name}/.cargo-checksum.json")) for name in names]


def _stat(path: Path | str) -> tuple[Any, ...]:
    try:
        info = os.stat(path)
    except OSError as exc:
        return ("missing", exc.errno or 0)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _host_facts(settings: Settings, sysroot: Path) -> dict[str, Any]:
    """This machine's toolchain as the stand-in needs it: absolute paths only (builders get an empty PATH).

    Builds see the toolchain, RUSTUP_HOME and the registry at SANDBOX_ROOT paths (sandboxPaths maps them to the host
    paths for extra-sandbox-paths): a build user cannot traverse /root or a 0700 directory above them, and the host
    paths are then no part of the derivations."""
    registry = Path(settings.local_registry).expanduser().resolve()
    if not registry.is_dir():
        raise NixError(
            f"the local crate registry {registry} does not exist",
            fix="install Debian's Rust crates (apt-get install librust-<name>-dev) or set local_registry to a cargo directory source",
        )
    mounts, toolchain_bin, rustup_home = toolchain_mounts(sysroot)
    mounts[f"{SANDBOX_ROOT}/registry"] = str(registry)
    bash = shutil.which("bash") or "/bin/bash"
    host_bin = sysroot / "bin"
    path_dirs = [toolchain_bin, "/usr/local/bin", "/usr/bin", "/bin"]
    facts = {
        "bash": bash,
        "toolchainBin": toolchain_bin,
        # devShells link the host's own tools (`nix develop` runs them on the host, outside any sandbox)
        "hostToolchainBin": str(host_bin),
        "hostToolchainTools": sorted(p.name for p in host_bin.iterdir()),
        "rustupHome": rustup_home,
        "registry": f"{SANDBOX_ROOT}/registry",
        "sandboxPaths": mounts,
        "registryChecksums": registry_checksums(registry),
        "cratesioStaticUrl": settings.cratesio_static_url.rstrip("/"),  # .crate downloads for locks with checksums
        "path": ":".join(dict.fromkeys(path_dirs)),
        # the builder's PATH: the toolchain and the stdenv programs; a declared input adds its own bin/
        "stdenv": host_programs(STDENV_PROGRAMS),
        "packages": {name: package_links(package) for name, package in build_inputs.PACKAGES.items()},
        # -lNAME of each attribute: the build's cc refuses one whose attribute is not declared (as ld finds none)
        "libraries": {
            name: list(package.libraries) for name, package in build_inputs.PACKAGES.items() if package.libraries
        },
        "hostTriple": host_triple(sysroot),
    }
    if settings.nix_builders:  # derivations then require it (builders.py); without builders they stay as they were
        facts["systemFeature"] = builders.toolchain_feature(facts, sysroot)
    return facts


def host_programs(names: tuple[str, ...]) -> dict[str, str]:
    """{program: its host path} for the names found in HOST_BIN_DIRS (a missing one is left out)."""
    found: dict[str, str] = {}
    for name in names:
        path = shutil.which(name, path=os.pathsep.join(HOST_BIN_DIRS))
        if path is not None:
            found[name] = path
    return found


def package_links(package: build_inputs.Package) -> dict[str, str]:
    """What the stand-in's placeholder for one nixpkgs attribute links: bin/PROGRAM and lib/pkgconfig/MODULE.pc ->
    host file. The host lacking one leaves it out, so the build fails as it would without the attribute."""
    links = {f"bin/{name}": path for name, path in host_programs(package.programs).items()}
    todo, seen = list(package.modules), set(package.modules)
    while todo:  # with the modules its .pc files require: in nixpkgs the attribute's closure gives them
        module = todo.pop(0)
        found = next((Path(d, f"{module}.pc") for d in pkg_config_dirs() if Path(d, f"{module}.pc").is_file()), None)
        if found is not None:
            links[f"lib/pkgconfig/{module}.pc"] = str(found)
            for required in pc_requires(found):
                if required not in seen:
                    seen.add(required)
                    todo.append(required)
    return links


def pc_requires(pc_file: Path) -> list[str]:
    """The modules a .pc file's Requires and Requires.private name (versions and operators left out)."""
    names: list[str] = []
    for line in pc_file.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Requires", "Requires.private"):
            words = value.replace(",", " ").split()
            names += [w for i, w in enumerate(words) if w[0].isalpha() and not (i and words[i - 1] in _PC_OPERATORS)]
    return names


_PC_OPERATORS = ("=", "<", ">", "<=", ">=", "!=")


def pkg_config_dirs() -> list[str]:
    """The host's pkg-config search path (its multiarch directory included)."""
    multiarch = [str(p) for p in Path("/usr/lib").glob("*-linux-gnu*/pkgconfig")]
    return [*PKG_CONFIG_DIRS[:3], *sorted(multiarch), *PKG_CONFIG_DIRS[3:]]


def host_triple(sysroot: Path) -> str:
    """The toolchain's host target triple (nixpkgs builds with `--target` it, so output lands in target/TRIPLE/)."""
    try:
        version = rustc_report(sysroot / "bin" / "rustc")
    except (OSError, subprocess.SubprocessError) as exc:
        raise NixError(f"cannot ask rustc for its host triple ({exc})", fix="check that 'rustc -vV' works") from None
    return next((line.split(":", 1)[1].strip() for line in version.splitlines() if line.startswith("host:")), "")


def toolchain_mounts(sysroot: Path) -> tuple[dict[str, str], str, str]:
    """({in-sandbox path: host path}, the toolchain's bin/ and RUSTUP_HOME as builds see them): RUSTUP_HOME at
    SANDBOX_ROOT/rustup (the toolchain inside it), or the toolchain alone at SANDBOX_ROOT/toolchain."""
    home = rustup_home().resolve()
    sysroot = sysroot.resolve()
    if home.is_dir() and sysroot.is_relative_to(home):
        inside = f"{SANDBOX_ROOT}/rustup"
        return {inside: str(home)}, f"{inside}/{sysroot.relative_to(home)}/bin", inside
    mounts = {f"{SANDBOX_ROOT}/toolchain": str(sysroot)}
    if home.is_dir():
        mounts[f"{SANDBOX_ROOT}/rustup"] = str(home)
    return mounts, f"{SANDBOX_ROOT}/toolchain/bin", f"{SANDBOX_ROOT}/rustup" if home.is_dir() else ""


def registry_checksums(registry: Path) -> dict[str, str]:
    """NAME-VERSION -> sha256 for the crates of the directory source that name a real package checksum: a lock whose
    crates all match these builds from the directory source, without fetching (see templates/standin/rust.nix)."""
    found: dict[str, str] = {}
    for entry in sorted(registry.glob("*/.cargo-checksum.json")):
        try:
            package = json.loads(entry.read_text()).get("package")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(package, str) and re.fullmatch(r"[0-9a-f]{64}", package):
            found[entry.parent.name] = package
    return found


def rustc_report(rustc: Path) -> str:
    """`rustc -vV` of a toolchain's own rustc (not rustup's proxy), asked once per binary (probecache, across
    processes): an update replaces the file, and a new inode or time asks again. Raises OSError or SubprocessError
    when it does not run."""
    return probecache.output(rustc, "-vV")


def rust_sysroot() -> Path:
    """The host toolchain's sysroot (its bin/ holds the real cargo and rustc, not rustup's proxies), asked once
    (probecache, across processes) while the proxy, its environment (the pinned RUSTUP_TOOLCHAIN) and what rustup
    chooses a toolchain by (its settings, its toolchains, toolchain files in or above the directory it is asked
    from) are unchanged."""
    from flakebot.cargo.runner import Cargo, cargo_program

    cargo = Path(cargo_program())
    rustc = shutil.which("rustc") or str(cargo.with_name("rustc"))
    env = launcher.host_env(Cargo(target_dir=Path(os.devnull)).env())
    where = launcher.neutral_dir()  # launcher.run's directory: rustup looks for toolchain files from there up
    question = ["--print sysroot", rustc, sorted((k, v) for k, v in env.items() if _chooses_toolchain(k)), where]
    files = [Path(rustc), *probecache.toolchain_choice(Path(env.get("RUSTUP_HOME") or rustup_home()), where)]
    kept = Path(probecache.remembered(question, files, lambda: str(_ask_sysroot(rustc, env))))
    if (kept / "bin" / "cargo").exists():
        return kept
    return _ask_sysroot(rustc, env)  # the toolchain went away under an unchanged key: rustup's own answer decides


def _chooses_toolchain(name: str) -> bool:
    """Whether an environment variable can change what rustup's proxy and rustc answer (the rest of the host
    environment, its locale or XDG homes, cannot: a craft run with other XDG homes, as each benchmark craft is, asked
    again for nothing)."""
    return name in ("PATH", "HOME") or name.startswith(("RUSTUP_", "CARGO_", "RUSTC", "RUST_"))


def _ask_sysroot(rustc: str, env: dict[str, str]) -> Path:
    try:
        sysroot = launcher.run(
            [rustc, "--print", "sysroot"], capture_output=True, text=True, env=env, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise NixError(
            f"cannot ask rustc for its sysroot ({exc})",
            fix="install Rust (https://rustup.rs) and check that 'rustc --print sysroot' works",
        ) from None
    if not (Path(sysroot) / "bin" / "cargo").exists():
        raise NixError(
            f"no cargo next to rustc in {Path(sysroot) / 'bin'}",
            fix="install cargo for the active toolchain (rustup component add cargo)",
        )
    return Path(sysroot)
