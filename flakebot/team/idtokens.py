"""JWTs from the team's identity provider, verified here with its public key (`flakebot serve --jwt-issuer URL
--jwt-audience AUD --jwt-key FILE`): no network fetch, so a front works offline and an IdP outage stops no call.

The key file is a PEM public key or a JWKS (JSON) as the IdP publishes it, saved to disk. The algorithms accepted are
pinned by the key's own type (RSA: RS256/384/512; EC: the one ES* of its curve; Ed25519: EdDSA; a JWKS key: its
`alg`, else its type's): `none` and every HMAC algorithm are never accepted, so a token "signed" with the public key as
an HMAC secret is refused. Issuer, audience, expiry and subject are required and checked (PyJWT, over cryptography).

A token's principal is its `sub` (its id: a digest of issuer and subject), its tenant the claim named by
--jwt-tenant-claim (a token without it, or with a value that is not a tenant name, is refused: no token falls into
another's tenant by default), its limits the static tokens' defaults.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from flakebot.errors import UsageError
from flakebot.team.tokens import (
    DEFAULT_CALLS_PER_MINUTE,
    DEFAULT_CONCURRENT_CRAFTS,
    NAME,
    PREFIX,
    Principal,
)

logger = logging.getLogger(__name__)

ID_PREFIX = "jwt-"  # a JWT principal's id: no static token's id (hex digits) starts so

DEFAULT_TENANT_CLAIM = "flakebot_tenant"
LEEWAY_SECONDS = 30  # clock skew between the IdP and this machine
MAX_TOKEN = 16 * 1024
RSA_ALGORITHMS = ["RS256", "RS384", "RS512"]
EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
ASYMMETRIC = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}


@dataclass(frozen=True)
class JwtOptions:
    issuer: str
    audience: str
    key: Path
    tenant_claim: str = DEFAULT_TENANT_CLAIM


def jwt_options(issuer: str | None, audience: str | None, key: Path | None, tenant_claim: str) -> JwtOptions | None:
    """The --jwt-* options as one JwtOptions (None when none is given; all three or a UsageError)."""
    if issuer is None and audience is None and key is None:
        return None
    if issuer is None or audience is None or key is None:
        raise UsageError(
            "--jwt-issuer, --jwt-audience and --jwt-key go together",
            fix="pass all three: the provider's issuer URL, the audience its tokens name, its public key file",
        )
    if not issuer.startswith(("https://", "http://")):
        raise UsageError(f"--jwt-issuer {issuer[:80]!r} is not a URL", fix="pass the provider's issuer (its `iss`)")
    if not tenant_claim:
        raise UsageError("--jwt-tenant-claim is empty", fix="name the claim that carries the tenant")
    return JwtOptions(issuer, audience, key, tenant_claim)


@dataclass(frozen=True)
class _Key:
    key: Any
    algorithms: list[str]
    kid: str | None = None


class JwtVerifier:
    """Verifies the IdP's JWTs with the keys of one file (read once, at start)."""

    def __init__(self, options: JwtOptions) -> None:
        self.options = options
        self.keys = load_keys(options.key)

    def verify(self, token: str) -> Principal | None:
        """The principal of a valid token (signature, issuer, audience, expiry), or None."""
        if token.startswith(PREFIX) or len(token) > MAX_TOKEN:
            return None
        try:
            header = jwt.get_unverified_header(token)
            key = self._key(header.get("kid"))
            if key is None:
                return None
            claims = jwt.decode(
                token,
                key.key,
                algorithms=key.algorithms,
                audience=self.options.audience,
                issuer=self.options.issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            logger.debug("a JWT refused: %s", type(exc).__name__)  # never the token itself
            return None
        return self._principal(claims)

    def active(self) -> list[Principal]:
        return []  # the IdP knows its users; none is listed here

    def _key(self, kid: Any) -> _Key | None:
        if kid is not None:
            return next((k for k in self.keys if k.kid == kid), None)
        return self.keys[0] if len(self.keys) == 1 else None  # several keys: the token must say which

    def _principal(self, claims: dict[str, Any]) -> Principal | None:
        subject, tenant = claims.get("sub"), claims.get(self.options.tenant_claim)
        if not isinstance(subject, str) or not subject or len(subject) > 256:
            return None
        if not isinstance(tenant, str) or not NAME.fullmatch(tenant):  # "$" passes "acme\n"
            logger.debug("a JWT refused: no tenant in its %s claim", self.options.tenant_claim)
            return None
        digest = hashlib.sha256(f"{self.options.issuer}\0{subject}".encode()).hexdigest()
        issued = claims.get("iat")
        return Principal(
            name=subject,
            id=ID_PREFIX + digest[:16],
            tenant=tenant,
            calls_per_minute=DEFAULT_CALLS_PER_MINUTE,
            concurrent_crafts=DEFAULT_CONCURRENT_CRAFTS,
            created=float(issued) if isinstance(issued, int | float) else time.time(),
        )


def load_keys(path: Path) -> list[_Key]:
    """The public keys of a PEM or JWKS file, each with the algorithms it may verify (else one UsageError line)."""
    fix = "pass the identity provider's public key as PEM, or its JWKS saved as JSON"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --jwt-key {path}: {exc.strerror or exc}", fix=fix) from None
    if data.lstrip().startswith(b"{"):
        return _jwks(path, data, fix)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise UsageError(f"--jwt-key {path} is neither a PEM public key nor a JWKS", fix=fix) from None
    algorithms = _algorithms(key)
    if not algorithms:
        raise UsageError(f"--jwt-key {path} is a {type(key).__name__}, which signs no JWT flakebot accepts", fix=fix)
    return [_Key(key, algorithms)]


def _jwks(path: Path, data: bytes, fix: str) -> list[_Key]:
    try:
        document = json.loads(data)
        keys = [jwt.PyJWK(k) for k in document["keys"] if k.get("use", "sig") == "sig"]
    except (ValueError, KeyError, TypeError, AttributeError, jwt.PyJWTError) as exc:
        raise UsageError(f"--jwt-key {path} is not a usable JWKS: {exc}", fix=fix) from None
    usable = [_Key(k.key, [k.algorithm_name], k.key_id) for k in keys if k.algorithm_name in ASYMMETRIC]
    if not usable:
        raise UsageError(f"--jwt-key {path} holds no public signing key", fix=fix)
    return usable


def _algorithms(key: Any) -> list[str]:
    if isinstance(key, rsa.RSAPublicKey):
        return list(RSA_ALGORITHMS)
    if isinstance(key, ec.EllipticCurvePublicKey):
        return [EC_ALGORITHMS[key.curve.name]] if key.curve.name in EC_ALGORITHMS else []
    if isinstance(key, ed25519.Ed25519PublicKey):
        return ["EdDSA"]
    return []
