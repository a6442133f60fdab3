"""Nix's ed25519 signatures, checked in flakebot itself: on store paths, and on a shared catalog's index.

`nix copy` checks signatures only of input-addressed paths: a content-addressed path (a catalog entry, anything
`nix store add-path` made) is let in unsigned, since its name fixes its content. Anyone can make such a path,
so a path from a shared catalog counts only when one of its signatures verifies here: ed25519 over Nix's
fingerprint `1;PATH;sha256:BASE32;NARSIZE;REFS`, from the path's record in this machine's store (whose NAR
hash Nix checked against the content as it copied).

A shared catalog's index is signed with the same keys (`nix key generate-secret`, NAME:BASE64): `sign` and
`verified_signer` over the index's exact bytes, prefixed with INDEX_CONTEXT so that an index signature can never
be taken for a store path's (whose fingerprint starts with "1;") nor the other way round.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

NIX_BASE32 = "0123456789abcdfghijklmnpqrsvwxyz"
INDEX_FORMAT = 2  # 1 was unsigned
INDEX_CONTEXT = b"flakebot shared catalog index 2\n"


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
    return verified_signer(fingerprint(info), [str(sig) for sig in info.get("signatures") or []], keys)


def verified_signer(message: bytes, signatures: list[str], keys: list[str]) -> str | None:
    """The first of `keys` (NAME:BASE64) whose signature (NAME:BASE64SIG among `signatures`) on `message` verifies."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    signed = [sig.partition(":") for sig in signatures]
    for key in keys:
        name, _, public = key.partition(":")
        try:
            verifier = Ed25519PublicKey.from_public_bytes(base64.b64decode(public))
        except (binascii.Error, ValueError):
            continue
        for signer, _, sig in signed:
            if signer != name:
                continue
            try:
                verifier.verify(base64.b64decode(sig), message)
                return key
            except (InvalidSignature, binascii.Error, ValueError):
                continue
    return None


def sign(message: bytes, secret_key: str) -> str:
    """NAME:BASE64SIG, the ed25519 signature of `message` by a Nix secret key (NAME:BASE64 of seed and public key)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    name, _, data = secret_key.strip().partition(":")
    private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data)[:32])
    return f"{name}:{base64.b64encode(private.sign(message)).decode()}"


def public_key(secret_key: str) -> str:
    """The Nix public key (NAME:BASE64) of a Nix secret key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    name, _, data = secret_key.strip().partition(":")
    public = Ed25519PrivateKey.from_private_bytes(base64.b64decode(data)[:32]).public_key()
    return f"{name}:{base64.b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()}"


def signed_index(snapshot: dict[str, Any], secret_key: str) -> dict[str, Any]:
    """A shared catalog's index: the snapshot as exact JSON text, and its signature (flakebot.deliver.index reads it)."""
    text = json.dumps(snapshot, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return {"format": INDEX_FORMAT, "snapshot": text, "signatures": [sign(INDEX_CONTEXT + text.encode(), secret_key)]}


def index_signer(snapshot_text: str, signatures: list[str], keys: list[str]) -> str | None:
    """The configured key that signed this index snapshot text, or None."""
    return verified_signer(INDEX_CONTEXT + snapshot_text.encode(), signatures, keys)
