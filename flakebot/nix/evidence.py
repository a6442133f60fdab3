"""Native inputs read from a failed build's log: a pkg-config module, a library the linker could not find, or a
program (perl, pkg-config, cmake, protoc, nasm, curl-config) a build step could not start; and whether it failed only on a lint the
crate denies (`#![deny(warnings)]` meeting a newer compiler's warnings).

build_inputs.py guesses from crate names before the build; this reads what the build itself said after it failed,
maps the module or library to a nixpkgs attribute (build_inputs.PACKAGES), and names the log line as the reason.

    missing_inputs(log_lines) -> {nixpkgs attribute: the log line that asked for it}
"""

from __future__ import annotations

import re

from flakebot.nix.build_inputs import PACKAGES

# pkg-config module names (as in `pkg-config --libs NAME`) and linker library names (`-lNAME`) -> nixpkgs attribute.
PKG_CONFIG_MODULES: dict[str, str] = {module: name for name, p in PACKAGES.items() for module in p.modules}
LINK_LIBRARIES: dict[str, str] = {library: name for name, p in PACKAGES.items() for library in p.libraries}

# What pkg-config (and the pkg-config crate quoting it) and the linkers print for a missing module or library.
_PKG_CONFIG = (
    re.compile(
        r"Package '?([\w.+-]+?)'?,? (?:was not found in the pkg-config search path|required by '[^']*', not found)"
    ),
    re.compile(r"The system library `([\w.+-]+)` required by crate `[\w-]+` was not found"),
    re.compile(r"No package '([\w.+-]+)' found"),
)
# A build step that could not start a program: the shell's "not found", the pkg-config crate's and cmake crate's
# words, and build scripts' own: curl-sys ("failed to run curl-config (...)"), nasm-rs ("Unable to run nasm: ..."),
# rav1e ("Make sure you have nasm installed"), prost-build ("Could not find `protoc`", "failed to invoke protoc"),
# the cc crate ("failed to find tool \"cc\""), perl's and make's "Can't exec \"perl\"". Only names of PROGRAMS count.
_PROGRAM = (
    re.compile(r"(?:^|[\s:])([\w.+-]+): (?:command )?not found"),
    re.compile(r"The (pkg-config) command could not be found"),
    re.compile(r"is `([\w.+-]+)` not installed"),
    re.compile(r"failed to run ([\w.+-]+) \("),
    re.compile(r"[Uu]nable to run (?:\S*/)?([\w.+-]+): "),
    re.compile(r"[Mm]ake sure you have ([\w.+-]+) installed"),
    re.compile(r"[Cc]ould(?:n't| not) find `?([\w.+-]+)`?(?: installation|$|[\s.,:])"),
    re.compile(r"failed to invoke ([\w.+-]+)\b"),
    re.compile(r"failed to find tool \"([\w.+-]+)\""),
    re.compile(r"Can't exec \"([\w.+-]+)\""),
)
PROGRAMS: dict[str, str] = {program: name for name, p in PACKAGES.items() for program in p.programs}
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
    names += [(m.group(1).lower(), PROGRAMS) for pattern in _PROGRAM for m in pattern.finditer(line)]
    return names + [(m.group(1), LINK_LIBRARIES) for pattern in _LINKER for m in pattern.finditer(line)]


# rustc's words for an error raised by a lint level (`#![deny(warnings)]`, `#[deny(...)]`, `-D warnings`).
_DENIED_LINT = re.compile(
    r"the lint level is defined here|implied by `#\[deny\(|`#\[deny\([\w:]+\)\]` on by default|`-D [\w:-]+`"
)
_CODED_ERROR = re.compile(r"error\[E\d+\]")


def worth_keeping(line: str) -> bool:
    """Whether a log line says something denied_lint or unknown_libraries weighs (a lint's level, a coded error, a
    library ld did not find): a long log pushes these out of the tail, so the build keeps them as they stream by."""
    return bool(_DENIED_LINT.search(line) or _CODED_ERROR.search(line) or any(p.search(line) for p in _LINKER))


def unknown_libraries(lines: list[str]) -> dict[str, str]:
    """-lNAME the linker did not find that no nixpkgs attribute of build_inputs.PACKAGES gives: {NAME: the line}."""
    found: dict[str, str] = {}
    for line in lines:
        for pattern in _LINKER:
            for match in pattern.finditer(line):
                name = match.group(1)
                if name not in LINK_LIBRARIES and name.removeprefix("lib") not in LINK_LIBRARIES:
                    found.setdefault(name, line.split("> ", 1)[-1].strip())
    return found


def denied_lint(lines: list[str]) -> str:
    """The line showing a failed build's errors came from a denied lint, or '' (no lint, or a real error too)."""
    if any(_CODED_ERROR.search(line) for line in lines):
        return ""
    found = next((line for line in lines if _DENIED_LINT.search(line)), "")
    return found.split("> ", 1)[-1].strip()
