"""SPDX licence expressions (Cargo.toml `license`) mapped to nixpkgs' `lib.licenses` attribute names."""

from __future__ import annotations

import re

# SPDX id -> attribute of nixpkgs' lib/licenses.nix (as of nixos-25.05).
# Deprecated SPDX ids without -only/-or-later mean "only"; a trailing "+" means "or later".
SPDX_TO_NIX: dict[str, str] = {
    "0BSD": "bsd0",
    "AGPL-3.0": "agpl3Only",
    "AGPL-3.0-only": "agpl3Only",
    "AGPL-3.0-or-later": "agpl3Plus",
    "Apache-2.0": "asl20",
    "Artistic-2.0": "artistic2",
    "BSD-1-Clause": "bsd1",
    "BSD-2-Clause": "bsd2",
    "BSD-2-Clause-Patent": "bsd2Patent",
    "BSD-3-Clause": "bsd3",
    "BSD-3-Clause-Clear": "bsd3Clear",
    "BSD-4-Clause": "bsdOriginal",
    "BSL-1.0": "boost",
    "BUSL-1.1": "bsl11",
    "CC-BY-3.0": "cc-by-30",
    "CC-BY-4.0": "cc-by-40",
    "CC-BY-SA-4.0": "cc-by-sa-40",
    "CC0-1.0": "cc0",
    "CDDL-1.0": "cddl",
    "curl": "curl",
    "EPL-1.0": "epl10",
    "EPL-2.0": "epl20",
    "EUPL-1.1": "eupl11",
    "EUPL-1.2": "eupl12",
    "GPL-2.0": "gpl2Only",
    "GPL-2.0-only": "gpl2Only",
    "GPL-2.0-or-later": "gpl2Plus",
    "GPL-2.0+": "gpl2Plus",
    "GPL-3.0": "gpl3Only",
    "GPL-3.0-only": "gpl3Only",
    "GPL-3.0-or-later": "gpl3Plus",
    "GPL-3.0+": "gpl3Plus",
    "HPND": "hpnd",
    "ICU": "icu",
    "ISC": "isc",
    "LGPL-2.0": "lgpl2Only",
    "LGPL-2.0-only": "lgpl2Only",
    "LGPL-2.0-or-later": "lgpl2Plus",
    "LGPL-2.0+": "lgpl2Plus",
    "LGPL-2.1": "lgpl21Only",
    "LGPL-2.1-only": "lgpl21Only",
    "LGPL-2.1-or-later": "lgpl21Plus",
    "LGPL-2.1+": "lgpl21Plus",
    "LGPL-3.0": "lgpl3Only",
    "LGPL-3.0-only": "lgpl3Only",
    "LGPL-3.0-or-later": "lgpl3Plus",
    "LGPL-3.0+": "lgpl3Plus",
    "LLVM-exception": "llvm-exception",
    "MIT": "mit",
    "MIT-0": "mit0",
    "MPL-1.1": "mpl11",
    "MPL-2.0": "mpl20",
    "MS-PL": "mspl",
    "NCSA": "ncsa",
    "OFL-1.1": "ofl",
    "OpenSSL": "openssl",
    "PostgreSQL": "postgresql",
    "Python-2.0": "psfl",
    "Unicode-3.0": "unicode-30",
    "Unicode-DFS-2016": "unicode-dfs-2016",
    "Unlicense": "unlicense",
    "UPL-1.0": "upl",
    "Vim": "vim",
    "WTFPL": "wtfpl",
    "X11": "x11",
    "Zlib": "zlib",
    "ZPL-2.1": "zpl21",
}

# lib.licenses entries that nixpkgs marks unfree (everything else in the table is free).
UNFREE = {"bsl11"}

_BY_LOWER = {spdx.lower(): name for spdx, name in SPDX_TO_NIX.items()}
_TOKEN = re.compile(r"[()]|\s+|/")
_OPERATORS = {"or", "and", "with"}


def spdx_ids(expression: str) -> list[str]:
    """The licence ids named in an SPDX expression ("MIT OR Apache-2.0", old-style "MIT/Apache-2.0")."""
    ids: list[str] = []
    for token in _TOKEN.split(expression or ""):
        if token and token.lower() not in _OPERATORS and token not in ids:
            ids.append(token)
    return ids


def nix_licenses(expression: str) -> tuple[list[str], list[str]]:
    """(lib.licenses attribute names, SPDX ids with no nixpkgs equivalent) for an SPDX expression."""
    names: list[str] = []
    unknown: list[str] = []
    for spdx in spdx_ids(expression):
        name = _BY_LOWER.get(spdx.lower())
        if name is None:
            unknown.append(spdx)
        elif name not in names:
            names.append(name)
    return names, unknown


def license_table() -> dict[str, dict[str, object]]:
    """Every attribute this module can emit, shaped like lib.licenses entries (for the host stand-in)."""
    table: dict[str, dict[str, object]] = {}
    for spdx, name in SPDX_TO_NIX.items():
        table.setdefault(name, {"shortName": name, "spdxId": spdx, "free": name not in UNFREE})
    return table
