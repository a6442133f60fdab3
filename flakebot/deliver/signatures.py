"""Checking a store path's Nix signatures against the keys the user trusts, in flakebot itself.

`nix copy` checks signatures only of input-addressed paths: a content-addressed path (a catalog entry, anything
`nix store add-path` made) is let in unsigned, since its name fixes its content. Anyone can make such a path,
so a path from a shared catalog counts only when one of its signatures verifies here: ed25519 over Nix's
fingerprint `1;PATH;sha256:BASE32;NARSIZE;REFS`, from the path's record in this machine's store (whose NAR
hash Nix checked against the content as it copied).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

NIX_BASE32 = "0123456789abcdfghijklmnpqrsvwxyz"


def nix_base32(data: bytes) -> str:
    """Nix's base-32 encoding (its own alphabet, least significant bits first)."""
    length = (len(data) * 8 - 1) // 5 + 1
    chars = []
    for n in range(length - 1, -1, -1):
        bit = n * 5
        i, j = divmod(bit, 8)
        c = data[i] >> j
        if i + 1 < len(data):
            c |= data[i + 1] << (8 - j)
        chars.append(NIX_BASE32[c & 0x1F])
    return "".join(chars)


def base32_hash(nar_hash: str) -> str:
    """`sha256:BASE32` from `sha256-BASE64` (SRI, as nix path-info --json prints it) or that form already."""
    if nar_hash.startswith("sha256-"):
        return "sha256:" + nix_base32(base64.b64decode(nar_hash.removeprefix("sha256-")))
    return nar_hash


def fingerprint(info: dict[str, Any]) -> bytes:
    """What a Nix signature signs, from a `nix path-info --json` record."""
    refs = ",".join(sorted(info.get("references") or []))
    return f"1;{info['path']};{base32_hash(info['narHash'])};{info['narSize']};{refs}".encode()


def trusted_signer(info: dict[str, Any], keys: list[str]) -> str | None:
    """The first of `keys` (NAME:BASE64) with a valid signature on the path, or None."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    message = fingerprint(info)
    signatures = [sig.partition(":") for sig in info.get("signatures") or []]
    for key in keys:
        name, _, public = key.partition(":")
        try:
            verifier = Ed25519PublicKey.from_public_bytes(base64.b64decode(public))
        except (binascii.Error, ValueError):
            continue
        for signer, _, sig in signatures:
            if signer != name:
                continue
            try:
                verifier.verify(base64.b64decode(sig), message)
                return key
            except (InvalidSignature, binascii.Error, ValueError):
                continue
    return None
