"""Native inputs read from a failed build's log: a pkg-config module or a library the linker could not find.

deps.py guesses from crate names before the build; this reads what the build itself said after it failed,
maps the module or library to a nixpkgs attribute, and names the log line as the reason.

    missing_inputs(log_lines) -> {nixpkgs attribute: the log line that asked for it}
"""

from __future__ import annotations

import re

# pkg-config module names (as in `pkg-config --libs NAME`) -> nixpkgs attribute.
PKG_CONFIG_MODULES: dict[str, str] = {
    "alsa": "alsa-lib",
    "bzip2": "bzip2",
    "dbus-1": "dbus",
    "expat": "expat",
    "fontconfig": "fontconfig",
    "freetype2": "freetype",
    "gmp": "gmp",
    "gpgme": "gpgme",
    "hogweed": "nettle",
    "libcurl": "curl",
    "libgit2": "libgit2",
    "liblzma": "xz",
    "libpcap": "libpcap",
    "libpq": "postgresql",
    "libseccomp": "libseccomp",
    "libsodium": "libsodium",
    "libssh2": "libssh2",
    "libudev": "udev",
    "libusb-1.0": "libusb1",
    "libzmq": "zeromq",
    "libzstd": "zstd",
    "ncurses": "ncurses",
    "nettle": "nettle",
    "oniguruma": "oniguruma",
    "openssl": "openssl",
    "sqlite3": "sqlite",
    "zlib": "zlib",
}

# Linker library names (`-lNAME`) -> nixpkgs attribute.
LINK_LIBRARIES: dict[str, str] = {
    "asound": "alsa-lib",
    "bz2": "bzip2",
    "crypto": "openssl",
    "curl": "curl",
    "dbus-1": "dbus",
    "expat": "expat",
    "fontconfig": "fontconfig",
    "freetype": "freetype",
    "git2": "libgit2",
    "gmp": "gmp",
    "gpgme": "gpgme",
    "hogweed": "nettle",
    "lzma": "xz",
    "ncurses": "ncurses",
    "nettle": "nettle",
    "onig": "oniguruma",
    "pcap": "libpcap",
    "pq": "postgresql",
    "seccomp": "libseccomp",
    "sodium": "libsodium",
    "sqlite3": "sqlite",
    "ssh2": "libssh2",
    "ssl": "openssl",
    "udev": "udev",
    "usb-1.0": "libusb1",
    "z": "zlib",
    "zmq": "zeromq",
    "zstd": "zstd",
}

# What pkg-config (and the pkg-config crate quoting it) and the linkers print for a missing module or library.
_PKG_CONFIG = (
    re.compile(
        r"Package '?([\w.+-]+?)'?,? (?:was not found in the pkg-config search path|required by '[^']*', not found)"
    ),
    re.compile(r"The system library `([\w.+-]+)` required by crate `[\w-]+` was not found"),
    re.compile(r"No package '([\w.+-]+)' found"),
)
_LINKER = (
    re.compile(r"cannot find -l([\w.+-]+)"),
    re.compile(r"unable to find library -l([\w.+-]+)"),
    re.compile(r"library not found for -l([\w.+-]+)"),
)


def missing_inputs(lines: list[str]) -> dict[str, str]:
    """The nixpkgs attributes a failed build's log asks for, each with the (first) line that asked."""
    found: dict[str, str] = {}
    for line in lines:
        for name, table in _names(line):
            attribute = table.get(name) or table.get(name.removeprefix("lib"))
            if attribute and attribute not in found:
                found[attribute] = line.split("> ", 1)[-1].strip()
    return found


def _names(line: str) -> list[tuple[str, dict[str, str]]]:
    names = [(m.group(1), PKG_CONFIG_MODULES) for pattern in _PKG_CONFIG for m in pattern.finditer(line)]
    return names + [(m.group(1), LINK_LIBRARIES) for pattern in _LINKER for m in pattern.finditer(line)]


def attribute_paths() -> list[str]:
    """Every attribute this module can add (the host stand-in must provide each one)."""
    return sorted(set(PKG_CONFIG_MODULES.values()) | set(LINK_LIBRARIES.values()))
