"""Native build inputs a crate needs, read from the crate names in its Cargo.lock (as nix-init does), and the one
table of the nixpkgs attributes flakebot can declare: what each gives a build (programs, pkg-config modules, -l
libraries). evidence.py reads a failed build's log through it; the host stand-in links those host programs and .pc
files into its placeholder for the attribute, and a build sees only what it declares, as with nixpkgs.

Names are nixpkgs attribute paths. Under `strictDeps` (which buildRustPackage sets) tools that run
at build time (pkg-config, protobuf, cmake) go in nativeBuildInputs; libraries linked into the
binary (openssl, sqlite, zlib, ...) go in buildInputs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from flakebot.errors import NixError


@dataclass(frozen=True)
class Needs:
    """What one -sys (or build helper) crate needs from nixpkgs."""

    native: tuple[str, ...] = ()
    build: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Package:
    """What one nixpkgs attribute gives a build: programs on PATH, pkg-config modules, libraries for -lNAME."""

    programs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()


# nixpkgs attribute -> what it gives (the ONE table: evidence.py and the host stand-in read it).
PACKAGES: dict[str, Package] = {
    "alsa-lib": Package(modules=("alsa",), libraries=("asound",)),
    "bzip2": Package(modules=("bzip2",), libraries=("bz2",)),
    "cmake": Package(programs=("cmake",)),
    "curl": Package(modules=("libcurl",), libraries=("curl",)),
    "curl.dev": Package(programs=("curl-config",)),  # curl's dev output: curl-sys asks curl-config for HTTP2
    "dbus": Package(modules=("dbus-1",), libraries=("dbus-1",)),
    "expat": Package(modules=("expat",), libraries=("expat",)),
    "fontconfig": Package(modules=("fontconfig",), libraries=("fontconfig",)),
    "freetype": Package(modules=("freetype2",), libraries=("freetype",)),
    "glib": Package(modules=("glib-2.0",), libraries=("glib-2.0",)),
    "gmp": Package(modules=("gmp",), libraries=("gmp",)),
    "gpgme": Package(programs=("gpgme-config",), modules=("gpgme",), libraries=("gpgme",)),
    "libgit2": Package(modules=("libgit2",), libraries=("git2",)),
    "libpcap": Package(modules=("libpcap",), libraries=("pcap",)),
    "libslirp": Package(modules=("slirp",), libraries=("slirp",)),  # its slirp.pc requires glib-2.0
    "libseccomp": Package(modules=("libseccomp",), libraries=("seccomp",)),
    "libsodium": Package(modules=("libsodium",), libraries=("sodium",)),
    "libssh2": Package(modules=("libssh2",), libraries=("ssh2",)),
    "libusb1": Package(modules=("libusb-1.0",), libraries=("usb-1.0",)),
    "nasm": Package(programs=("nasm",)),
    "ncurses": Package(modules=("ncurses", "ncursesw"), libraries=("ncurses", "ncursesw")),
    "nettle": Package(modules=("nettle", "hogweed"), libraries=("nettle", "hogweed")),
    "oniguruma": Package(modules=("oniguruma",), libraries=("onig",)),
    "openssl": Package(modules=("openssl", "libssl", "libcrypto"), libraries=("ssl", "crypto")),
    "pam": Package(libraries=("pam", "pam_misc", "pamc")),  # linux-pam on Linux (nixpkgs' `pam`)
    "perl": Package(programs=("perl",)),
    "pkg-config": Package(programs=("pkg-config",)),
    "postgresql": Package(modules=("libpq",), libraries=("pq",)),
    "protobuf": Package(programs=("protoc",)),
    "python3": Package(programs=("python3",)),
    "rustPlatform.bindgenHook": Package(libraries=("clang",)),  # it brings libclang
    "sqlite": Package(modules=("sqlite3",), libraries=("sqlite3",)),
    "udev": Package(modules=("libudev",), libraries=("udev",)),
    "xz": Package(modules=("liblzma",), libraries=("lzma",)),
    "zeromq": Package(modules=("libzmq",), libraries=("zmq",)),
    "zlib": Package(modules=("zlib",), libraries=("z",)),
    "zstd": Package(modules=("libzstd",), libraries=("zstd",)),
}


# Crate name in Cargo.lock -> nixpkgs inputs. The `pkg-config` crate itself brings pkg-config.
NATIVE_INPUTS: dict[str, Needs] = {
    "alsa-sys": Needs(build=("alsa-lib",)),
    "bindgen": Needs(native=("rustPlatform.bindgenHook",)),
    "bzip2-sys": Needs(build=("bzip2",)),
    "cmake": Needs(native=("cmake",)),
    "curl-sys": Needs(native=("curl.dev",), build=("curl",)),  # curl-config on PATH, as nixpkgs' cargo-c has it
    "expat-sys": Needs(build=("expat",)),
    "freetype-sys": Needs(build=("freetype",)),
    "gpgme-sys": Needs(native=("gpgme",), build=("gpgme",)),
    "libdbus-sys": Needs(build=("dbus",)),
    "libgit2-sys": Needs(build=("libgit2",)),
    # pkg-config's `slirp >= 4.2.0`, whose slirp.pc requires glib-2.0 (nixpkgs' libslirp propagates glib)
    "libslirp-sys": Needs(build=("libslirp", "glib")),
    "libsodium-sys": Needs(build=("libsodium",)),
    "libsqlite3-sys": Needs(build=("sqlite",)),
    "libssh2-sys": Needs(build=("libssh2",)),
    "libudev-sys": Needs(build=("udev",)),
    "libusb1-sys": Needs(build=("libusb1",)),
    "libz-sys": Needs(build=("zlib",)),
    "nasm-rs": Needs(native=("nasm",)),  # as nixpkgs' rav1e declares nasm
    "lzma-sys": Needs(build=("xz",)),
    "ncurses": Needs(build=("ncurses",)),
    "nettle-sys": Needs(build=("nettle",)),
    "onig_sys": Needs(build=("oniguruma",), env=(("RUSTONIG_SYSTEM_LIBONIG", "true"),)),
    "openssl-sys": Needs(build=("openssl",)),
    "pam-sys": Needs(build=("pam",)),
    "pcap-sys": Needs(build=("libpcap",)),
    "pkg-config": Needs(native=("pkg-config",)),
    "pq-sys": Needs(build=("postgresql",)),
    "prost-build": Needs(native=("protobuf",)),
    "seccomp-sys": Needs(build=("libseccomp",)),
    "servo-fontconfig-sys": Needs(build=("fontconfig",)),
    "yeslogic-fontconfig-sys": Needs(build=("fontconfig",)),
    "zmq-sys": Needs(build=("zeromq",)),
}


@dataclass
class NativeInputs:
    """nativeBuildInputs, buildInputs and env for a generated flake, and which crates asked for them."""

    native_build_inputs: list[str] = field(default_factory=list)
    build_inputs: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    because: dict[str, list[str]] = field(default_factory=dict)

    def add_evidence(self, found: dict[str, str]) -> list[str]:
        """Add what a failed build asked for ({attribute: log line}): programs to nativeBuildInputs, libraries to
        buildInputs (with pkg-config, which finds them); returns those added."""
        for name, line in found.items():
            package = PACKAGES.get(name, Package())
            tool = bool(package.programs) and not package.modules
            _add(self.native_build_inputs if tool else self.build_inputs, self.because, name, f"build log: {line}")
        if self.build_inputs and "pkg-config" not in self.native_build_inputs:
            _add(self.native_build_inputs, self.because, "pkg-config", "buildInputs")
        return list(found)

    def declared(self) -> list[str]:
        """Every attribute the flake already gives the build."""
        return self.native_build_inputs + self.build_inputs

    def to_dict(self) -> dict[str, object]:
        return {
            "nativeBuildInputs": self.native_build_inputs,
            "buildInputs": self.build_inputs,
            "env": self.env,
            "because": self.because,
        }


def lock_packages(lock_file: Path) -> list[dict[str, object]]:
    """The [[package]] entries of a Cargo.lock."""
    try:
        data = tomllib.loads(lock_file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise NixError(
            f"cannot read {lock_file}: {exc}",
            fix=f"remove {lock_file} so flakebot regenerates it, or fix it with 'cargo generate-lockfile'",
        ) from None
    packages = data.get("package", [])
    return [p for p in packages if isinstance(p, dict)]


def native_inputs(crate_names: list[str]) -> NativeInputs:
    """The nixpkgs inputs the given crates (from Cargo.lock) need, in a stable order."""
    result = NativeInputs()
    for crate in sorted(set(crate_names)):
        needs = NATIVE_INPUTS.get(crate)
        if needs is None:
            continue
        for name in needs.native:
            _add(result.native_build_inputs, result.because, name, crate)
        for name in needs.build:
            _add(result.build_inputs, result.because, name, crate)
        result.env.update(dict(needs.env))
    if result.build_inputs and "pkg-config" not in result.native_build_inputs:
        # -sys crates find their libraries through pkg-config; nix-init adds it whenever a library is needed.
        _add(result.native_build_inputs, result.because, "pkg-config", "buildInputs")
    return result


def all_attribute_paths() -> list[str]:
    """Every nixpkgs attribute flakebot can emit (the host stand-in provides each one)."""
    return sorted(PACKAGES)


def _add(target: list[str], because: dict[str, list[str]], name: str, crate: str) -> None:
    if name not in target:
        target.append(name)
    because.setdefault(name, [])
    if crate not in because[name]:
        because[name].append(crate)
