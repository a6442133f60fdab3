"""JWTs from the team's identity provider, verified here with its public keys (`flakebot serve --jwt-issuer URL
--jwt-audience AUD`): from a file (--jwt-key FILE: no network fetch, so a front works offline and an IdP outage stops
no call), or fetched from the provider and cached (--jwt-jwks URL, or by default the jwks_uri of the issuer's OpenID
configuration: flakebot.team.jwks).

The key file is a PEM public key or a JWKS (JSON) as the IdP publishes it, saved to disk. The algorithms accepted are
pinned by the key's own type (RSA: RS256/384/512; EC: the one ES* of its curve; Ed25519: EdDSA; a JWKS key: its
`alg`, else its type's): `none` and every HMAC algorithm are never accepted, so a token "signed" with the public key as
an HMAC secret is refused. Issuer, audience, expiry and subject are required and checked (PyJWT, over cryptography).

A token's principal is its `sub` (its id: a digest of issuer and subject), its tenant the claim named by
--jwt-tenant-claim (a token without it, or with a value that is not a tenant name, is refused: no token falls into
another's tenant by default), its limits those its limits claim names, held to the front's caps
(flakebot.team.claimlimits: a claim that cannot be read refuses the token, in one log line naming the claim).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from flakebot.errors import UsageError
from flakebot.team.claimlimits import DEFAULT_LIMITS_CLAIM, Caps, ClaimRefused, caps, limits
from flakebot.team.jwks import DEFAULT_TTL_SECONDS, REFETCH_SECONDS, Key, RemoteKeys, check_url, parse_jwks
from flakebot.team.tokens import NAME, PREFIX, Principal

logger = logging.getLogger(__name__)

ID_PREFIX = "jwt-"  # a JWT principal's id: no static token's id (hex digits) starts so


def concurrent_crafts_set_by(principal_id: str) -> str:
    """What sets a principal's concurrent crafts, as a refusal names it for the caller to ask about: a JWT's limits
    claim (held to the front's cap), a static token's `token add` option."""
    return (
        "its JWT's limits claim, up to the front's cap"
        if principal_id.startswith(ID_PREFIX)
        else "token add --concurrent-crafts"
    )


DEFAULT_TENANT_CLAIM = "flakebot_tenant"
REGISTERED_CLAIMS = ("iss", "sub", "aud", "exp", "nbf", "iat", "jti")  # RFC 7519's: none holds a limits object
LEEWAY_SECONDS = 30  # clock skew between the IdP and this machine
MAX_TOKEN = 16 * 1024
MAX_CANDIDATES = 4  # keys one kid may name that a token is tried against
MAX_TOLD = 64  # distinct refusals of a limits claim logged (an IdP signing a bad claim: once each, not per request)
RSA_ALGORITHMS = ["RS256", "RS384", "RS512"]
EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


@dataclass(frozen=True)
class JwtOptions:
    issuer: str
    audience: str
    key: Path | None = None  # a key file; None: fetched (jwks_url, else discovered from the issuer)
    tenant_claim: str = DEFAULT_TENANT_CLAIM
    jwks_url: str | None = None
    jwks_ttl: float = DEFAULT_TTL_SECONDS
    refetch_seconds: float = REFETCH_SECONDS
    limits_claim: str = DEFAULT_LIMITS_CLAIM
    caps: Caps = Caps()  # the most a limits claim may give

    @property
    def fetched(self) -> bool:
        """Whether keys come over the network (a verification may then wait for a fetch)."""
        return self.key is None


def jwt_options(
    issuer: str | None,
    audience: str | None,
    key: Path | None,
    tenant_claim: str,
    jwks_url: str | None = None,
    jwks_ttl: float = DEFAULT_TTL_SECONDS,
    limits_claim: str = DEFAULT_LIMITS_CLAIM,
    max_calls_per_minute: int | None = None,
    max_concurrent_crafts: int | None = None,
) -> JwtOptions | None:
    """The --jwt-* options as one JwtOptions (None when none is given), else a UsageError."""
    if issuer is None and audience is None and key is None and jwks_url is None:
        if max_calls_per_minute is not None or max_concurrent_crafts is not None:
            raise UsageError(
                "--jwt-max-calls-per-minute and --jwt-max-concurrent-crafts cap JWTs' limits: they need --jwt-issuer",
                fix="pass --jwt-issuer and --jwt-audience too, or leave the caps out (static tokens have their own)",
            )
        return None
    if issuer is None or audience is None:
        raise UsageError(
            "--jwt-issuer and --jwt-audience go together (with --jwt-key or --jwt-jwks, or neither)",
            fix="pass the provider's issuer URL and the audience its tokens name; its keys: a file (--jwt-key), "
            "a JWKS URL (--jwt-jwks), or by default the jwks_uri of the issuer's OpenID configuration",
        )
    if not issuer.startswith(("https://", "http://")):
        raise UsageError(f"--jwt-issuer {issuer[:80]!r} is not a URL", fix="pass the provider's issuer (its `iss`)")
    if not tenant_claim:
        raise UsageError("--jwt-tenant-claim is empty", fix="name the claim that carries the tenant")
    if not limits_claim or limits_claim == tenant_claim or limits_claim in REGISTERED_CLAIMS:
        raise UsageError(  # a registered claim would refuse every token, said in the log only once
            f"--jwt-limits-claim {limits_claim!r} is empty, the tenant's claim or one RFC 7519 registers",
            fix="name the claim that carries the limits object (flakebot_limits by default)",
        )
    held_to = caps(max_calls_per_minute, max_concurrent_crafts)
    if key is not None and jwks_url is not None:
        raise UsageError("--jwt-key and --jwt-jwks exclude each other", fix="pass the key file or the JWKS URL")
    if not jwks_ttl > 0:
        raise UsageError(f"--jwt-jwks-ttl {jwks_ttl} is not positive", fix="pass seconds, e.g. 300")
    if key is None:  # fetched: from here, or from what the issuer's configuration names
        check_url(jwks_url or issuer, "--jwt-jwks" if jwks_url else "--jwt-issuer (whose keys are fetched)")
    return JwtOptions(issuer, audience, key, tenant_claim, jwks_url, jwks_ttl, limits_claim=limits_claim, caps=held_to)


class JwtVerifier:
    """Verifies the IdP's JWTs with the keys of one file (read once, at start) or fetched from the IdP."""

    def __init__(self, options: JwtOptions) -> None:
        self.options = options
        self.keys = load_keys(options.key) if options.key is not None else []
        self.remote = (
            None
            if options.key is not None
            else RemoteKeys(options.issuer, options.jwks_url, options.jwks_ttl, options.refetch_seconds)
        )
        self._told: set[str] = set()  # the limits claims' refusals logged

    def verify(self, token: str) -> Principal | None:
        """The principal of a valid token (signature, issuer, audience, expiry), or None."""
        if token.startswith(PREFIX) or len(token) > MAX_TOKEN:
            return None
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            logger.debug("a JWT refused: %s", type(exc).__name__)  # never the token itself
            return None
        refusal = "no key held names its kid"
        for key in self._keys(header.get("kid")):
            try:
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
                refusal = type(exc).__name__
                continue
            return self._principal(claims)
        logger.debug("a JWT refused: %s", refusal)  # never the token itself
        return None

    def active(self) -> list[Principal]:
        return []  # the IdP knows its users; none is listed here

    def live(self) -> set[str]:
        return set()  # a JWT's session is left to its token's expiry

    def revoked(self) -> set[str]:
        return set()  # the IdP revokes, not this server: a subject whose token expired may come back with a new one

    def _keys(self, kid: Any) -> list[Key]:
        if self.remote is None:
            return _pick(self.keys, kid)
        found = _pick(self.remote.keys(), kid)
        if not found:  # rotated keys, or a made-up kid: one fetch at most per refetch interval
            found = _pick(self.remote.after_unknown_kid(), kid)
        return found

    def _principal(self, claims: dict[str, Any]) -> Principal | None:
        subject, tenant = claims.get("sub"), claims.get(self.options.tenant_claim)
        if not isinstance(subject, str) or not subject or len(subject) > 256:
            return None
        if not isinstance(tenant, str) or not NAME.fullmatch(tenant):  # "$" passes "acme\n"
            logger.debug("a JWT refused: no tenant in its %s claim", self.options.tenant_claim)
            return None
        try:
            held = limits(claims, self.options.limits_claim, self.options.caps)
        except ClaimRefused as exc:
            self._refused(str(exc))
            return None
        digest = hashlib.sha256(f"{self.options.issuer}\0{subject}".encode()).hexdigest()
        return Principal(
            name=subject,
            id=ID_PREFIX + digest[:16],
            tenant=tenant,
            calls_per_minute=held["calls_per_minute"],
            concurrent_crafts=held["concurrent_crafts"],
            created=_issued(claims),
        )

    def _refused(self, why: str) -> None:
        """A signed token refused for its limits claim: the IdP's configuration, for the admin to mend (a warning, once
        per reason, MAX_TOLD reasons at most: its user's every request would repeat it)."""
        if why in self._told or len(self._told) >= MAX_TOLD:
            return
        self._told.add(why)
        logger.warning("a JWT refused: %s", why)


def _issued(claims: dict[str, Any]) -> float:
    """When the token was issued: its iat, else now. PyJWT checked only that iat is not in the future: one far in the
    past (-10**400) is let through, and no float holds it (an OverflowError out of a request's verify, a 500)."""
    issued = claims.get("iat")
    if isinstance(issued, int | float) and not isinstance(issued, bool) and 0 <= issued <= time.time() + LEEWAY_SECONDS:
        return float(issued)
    return time.time()


def _pick(keys: list[Key], kid: Any) -> list[Key]:
    """The keys a token naming kid may be signed with: those under that kid (a provider may reuse one across a
    rotation; at most MAX_CANDIDATES, each verification costs), or the only key when it names none."""
    if kid is not None:
        return [k for k in keys if k.kid == kid][:MAX_CANDIDATES]
    return keys[:1] if len(keys) == 1 else []  # several keys: the token must say which


def load_keys(path: Path) -> list[Key]:
    """The public keys of a PEM or JWKS file, each with the algorithms it may verify (else one UsageError line)."""
    fix = "pass the identity provider's public key as PEM, or its JWKS saved as JSON"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read --jwt-key {path}: {exc.strerror or exc}", fix=fix) from None
    if data.lstrip().startswith(b"{"):
        try:
            return parse_jwks(data)
        except ValueError as exc:
            raise UsageError(f"--jwt-key {path}: {exc}", fix=fix) from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise UsageError(f"--jwt-key {path} is neither a PEM public key nor a JWKS", fix=fix) from None
    algorithms = _algorithms(key)
    if not algorithms:
        raise UsageError(f"--jwt-key {path} is a {type(key).__name__}, which signs no JWT flakebot accepts", fix=fix)
    return [Key(key, algorithms)]


def _algorithms(key: Any) -> list[str]:
    if isinstance(key, rsa.RSAPublicKey):
        return list(RSA_ALGORITHMS)
    if isinstance(key, ec.EllipticCurvePublicKey):
        return [EC_ALGORITHMS[key.curve.name]] if key.curve.name in EC_ALGORITHMS else []
    if isinstance(key, ed25519.Ed25519PublicKey):
        return ["EdDSA"]
    return []
