"""Static bearer tokens for `flakebot serve`: the small team's way in (OAuth 2.1's resource server, with flakebot as
the issuer of opaque tokens).

A token is `fbt_` and 256 random bits, shown once when made. The store keeps only its SHA-256: a salt adds nothing
to a hash of 256 random bits (no dictionary or table covers that space), and a plain digest lets a request's token
be found with one lookup. The store is one JSON file in the workdir's team/ directory (mode 0600), written
atomically under a lock; a server re-reads it when it changes, so `token revoke` takes effect on the next request.
A server verifies in several threads at once: a re-read happens under a lock and swaps one whole snapshot in, and a
request uses the one snapshot it took, so no thread sees half a store or an older one put back over a newer one.
A revoked token stays listed (revoked, with when) so the audit still names its principal; its name can be given to a
new token, which is a new principal (its own id).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from flakebot.errors import TeamError
from flakebot.fsutil import atomic_write_text

logger = logging.getLogger(__name__)

PREFIX = "fbt_"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
DEFAULT_TENANT = "default"
DEFAULT_CALLS_PER_MINUTE = 120
DEFAULT_CONCURRENT_CRAFTS = 2
MAX_CALLS_PER_MINUTE = 100_000
MAX_CONCURRENT_CRAFTS = 256
MAX_STORE_BYTES = 16 * 1024 * 1024  # some 50,000 tokens: a larger file is no store `add` wrote, and is not read whole
FORMAT = 1
# What a token may do beyond tool calls, each granted by name (`token add --grant`); nothing else is ever granted.
# metrics: read the front's /metrics, which count every tenant's work (a scraper's, not an agent's).
METRICS = "metrics"
GRANTS = (METRICS,)


@dataclass(frozen=True)
class Principal:
    """Who a token speaks for: its name, its id (the first hex digits of its hash: a new token under an old name is
    another principal), its tenant and its limits."""

    name: str
    id: str
    tenant: str
    calls_per_minute: int
    concurrent_crafts: int
    created: float
    revoked: float | None = None
    grants: tuple[str, ...] = ()  # of GRANTS: what else it may do (a JWT's principal: nothing)

    def public(self) -> dict[str, Any]:
        """What `token list` shows: everything but the hash (which is not here) and never the token."""
        return asdict(self)


class Verifier(Protocol):
    """What the front asks of a way in (these static tokens, an IdP's JWTs: flakebot.team.idtokens)."""

    def verify(self, token: str) -> Principal | None: ...

    def active(self) -> list[Principal]: ...

    def live(self) -> set[str]:
        """The ids of the principals listed as active, for what a server does while serving (its sessions kept open):
        a list that cannot be read now holds none, and says why once (logged), not at each look."""
        ...

    def revoked(self) -> set[str]:
        """The ids of principals let in once and never again (a revoked static token): they follow no job."""
        ...


class Verifiers:
    """Several ways in, tried in order: the first that knows a token names its principal."""

    def __init__(self, *verifiers: Verifier) -> None:
        self.verifiers = verifiers

    def verify(self, token: str) -> Principal | None:
        for verifier in self.verifiers:
            principal = verifier.verify(token)
            if principal is not None:
                return principal
        return None

    def active(self) -> list[Principal]:
        return [p for verifier in self.verifiers for p in verifier.active()]

    def live(self) -> set[str]:
        return {principal_id for verifier in self.verifiers for principal_id in verifier.live()}

    def revoked(self) -> set[str]:
        return {principal_id for verifier in self.verifiers for principal_id in verifier.revoked()}


def team_dir(workdir: Path) -> Path:
    return workdir / "team"


@dataclass(frozen=True)
class _Snapshot:
    """The store as one re-read found it: swapped in whole, so a thread never sees parts of two versions."""

    seen: tuple[int, ...] | None  # the file and its directory as they were before the read (None: no file)
    by_hash: dict[str, Principal]  # the active principals by their token's digest
    revoked: frozenset[str]  # the ids of the revoked ones


_NOTHING = _Snapshot(None, {}, frozenset())


# A change's timestamps are the kernel's coarse clock (a tick, some milliseconds; whole seconds on some filesystems):
# an in-place rewrite of the same size within one tick of a read leaves the stat as it was. A snapshot read this soon
# after the store's last change is not trusted to stand for it (git's "racily clean" index entries): re-read until
# the change is older than this.
RACY_NS = 2_000_000_000


def _racy(seen: tuple[int, ...] | None) -> bool:
    """Whether the store (or its directory) changed too recently for its stat to tell a later same-size rewrite."""
    return seen is not None and time.time_ns() - max(seen[2::4]) < RACY_NS


class TokenStore:
    """The tokens of one workdir: add, list, revoke, and verify (cached until the file changes)."""

    def __init__(self, workdir: Path) -> None:
        self.directory = team_dir(workdir)
        self.path = self.directory / "tokens.json"
        self._snapshot = _NOTHING
        self._reading = threading.Lock()  # one re-read at a time, and the refusal's bookkeeping with it
        # why the store was refused at its last read, and what was logged of it since: a front looks at the store
        # every second, and an unsafe store is one fact to log once (each consequence once), not once a second
        self._refused: str | None = None
        self._told: set[str] = set()

    # ---------------------------------------------------------------- administration

    def add(
        self,
        name: str,
        tenant: str = DEFAULT_TENANT,
        calls_per_minute: int = DEFAULT_CALLS_PER_MINUTE,
        concurrent_crafts: int = DEFAULT_CONCURRENT_CRAFTS,
        grants: Sequence[str] = (),
    ) -> tuple[Principal, str]:
        """A new token for `name` (refused while an active one has that name): its principal and the token.
        `grants`: names of GRANTS (TeamError for any other)."""
        _check_name("token name", name)
        for grant in grants:
            if grant not in GRANTS:
                raise TeamError(f"no grant {grant[:40]!r}", fix=f"grant one of: {', '.join(GRANTS)}")
        _check_name("tenant", tenant)
        _check_limit("calls per minute", calls_per_minute, MAX_CALLS_PER_MINUTE)
        _check_limit("concurrent crafts", concurrent_crafts, MAX_CONCURRENT_CRAFTS)
        token = PREFIX + secrets.token_urlsafe(32)
        digest = _digest(token)
        with self._locked() as records:
            if any(r["name"] == name and r.get("revoked") is None for r in records):
                raise TeamError(
                    f"a token named {name!r} exists already",
                    fix=f"pick another name, or 'flakebot token revoke {name}' first",
                )
            record = {
                "name": name,
                "id": digest[:16],
                "sha256": digest,
                "tenant": tenant,
                "calls_per_minute": calls_per_minute,
                "concurrent_crafts": concurrent_crafts,
                "created": time.time(),
                "revoked": None,
                "grants": sorted(set(grants)),
            }
            records.append(record)
        logger.info("token %s added (tenant %s)", name, tenant)
        return _principal(record), token

    def principals(self) -> list[Principal]:
        records = self._read()
        with self._well_formed():
            return [_principal(r) for r in records]

    def revoke(self, name: str) -> Principal:
        """Revoke the active token named `name`."""
        with self._locked() as records:
            active = [r for r in records if r["name"] == name and r.get("revoked") is None]
            if not active:
                raise TeamError(f"no active token is named {name!r}", fix="see 'flakebot token list'")
            active[0]["revoked"] = time.time()
        logger.info("token %s revoked", name)
        return _principal(active[0])

    # ---------------------------------------------------------------- a request's token

    def verify(self, token: str) -> Principal | None:
        """The active principal `token` belongs to, or None (unknown, revoked, malformed, or a store that became
        unsafe or unreadable while serving: every token refused, the reason logged)."""
        if not token.startswith(PREFIX) or len(token) > 200:
            return None
        snapshot = self._refreshed("refusing every token")
        return snapshot.by_hash.get(_digest(token))  # a lookup by digest: its timing says nothing about the token

    def active(self) -> list[Principal]:
        """The active principals (TeamError when the store is unsafe or unreadable: `serve` refuses to start)."""
        return list(self._current().by_hash.values())

    def live(self) -> set[str]:
        """The ids of the active principals; none while the store is unsafe or unreadable (logged once: every
        session of a static token is then ended)."""
        return {principal.id for principal in self._refreshed("ending every session").by_hash.values()}

    def revoked(self) -> set[str]:
        """The ids of this store's revoked tokens (a revoked record stays listed, and its token can never verify
        again). A principal this store never held (another front's store, a JWT) is not among them. A store that
        became unsafe or unreadable while serving holds none (the reason logged): its records may be anyone's, so
        they discount nobody's following, and a JWT caller's cancel, which needs no static token, still answers."""
        return set(self._refreshed("no token counted as revoked").revoked)

    def _refreshed(self, otherwise: str) -> _Snapshot:
        """_current for a request being served: a store that became unsafe or unreadable is logged (`otherwise`: what
        the request does then, once per reason) and an empty snapshot returned: nothing read from it before is used."""
        try:
            return self._current()
        except TeamError as exc:
            with self._reading:
                if otherwise not in self._told:
                    self._told.add(otherwise)
                    logger.error("%s: %s", otherwise, exc.one_line())
            return _NOTHING

    def _current(self) -> _Snapshot:
        """The store as the file holds it now, re-read only when it changed; TeamError when it is unsafe or unreadable.
        The unchanged path (nearly every request) takes no lock: a stat, and one read of the current snapshot."""
        snapshot = self._snapshot
        if snapshot.seen is not None and snapshot.seen == self._stat():
            return snapshot
        with self._reading:
            seen = self._stat()  # again under the lock: another thread may have re-read it meanwhile
            if self._snapshot.seen is not None and self._snapshot.seen == seen:
                return self._snapshot
            try:  # read after the stat: a change in between only makes the next look read again
                snapshot = self._snapshot_of(None if _racy(seen) else seen, self._read())
            except TeamError as exc:
                self._snapshot = _NOTHING  # nothing read before is used
                if exc.one_line() != self._refused:  # another reason: each consequence logged again
                    self._refused, self._told = exc.one_line(), set()
                raise
            if self._refused is not None:
                logger.warning("the token store is safe again (%s): tokens are verified from it", self.path)
                self._refused, self._told = None, set()
            self._snapshot = snapshot
            return snapshot

    def _snapshot_of(self, seen: tuple[int, ...] | None, records: list[Any]) -> _Snapshot:
        """The records as a snapshot; TeamError for a record that is not one `add` writes (a request met a KeyError)."""
        with self._well_formed():
            return _Snapshot(
                seen,
                {r["sha256"]: _principal(r) for r in records if r.get("revoked") is None},
                frozenset(str(r["id"]) for r in records if r.get("revoked") is not None),
            )

    @contextmanager
    def _well_formed(self) -> Iterator[None]:
        """TeamError for a record that is not one `add` writes: a field missing or of another type, or a number no int
        or float holds (Infinity, 10**400: an OverflowError raised out of a request's verify)."""
        try:
            yield
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
            raise TeamError(f"the token store {self.path} is malformed", fix="restore it or remove it") from None

    def _stat(self) -> tuple[int, ...] | None:
        """The file and its directory as they are, links not followed (a chmod, chown or a link changes ctime); None
        when there is no store, or one that cannot be looked at (its directory a file, or not searchable): read again
        at each look, where the read says why (an OSError raised here was a 500, and ended the revocation sweep)."""
        try:
            return tuple(
                value
                for st in (os.lstat(self.directory), os.lstat(self.path))
                for value in (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            )
        except OSError:
            return None

    # ---------------------------------------------------------------- the file

    def _read(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(_read_own(self.directory, self.path))
        except FileNotFoundError:
            return []
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested deeper than the parser goes
            raise TeamError(
                f"the token store {self.path} is unreadable: {exc}", fix="restore it or remove it"
            ) from None
        records = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(records, list):
            raise TeamError(f"the token store {self.path} is malformed", fix="restore it or remove it")
        return records

    @contextmanager
    def _locked(self) -> Iterator[list[dict[str, Any]]]:
        """The records under the store's lock, written back (0600, atomically) when the block ends without error."""
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        with open(self.directory / ".tokens.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = self._read()
            yield records
            # atomic_write_text makes its file with mode 0600 from the start
            atomic_write_text(self.path, json.dumps({"format": FORMAT, "tokens": records}, indent=2) + "\n")


def _read_own(directory: Path, path: Path) -> bytes:
    """The store's bytes, if only this user could have written them: a link (at the file or as its directory), a file
    or directory of another user, or one others may write, could hold a hash someone else chose, i.e. a token of
    theirs. Raises TeamError (FileNotFoundError when there is no store yet)."""
    fix = f"make {directory} and {path.name} this user's own, not writable by others (chmod 700 / 600), no links"
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        folder = os.open(directory, flags | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW with O_DIRECTORY: a link is ENOTDIR too
            what = "a symbolic link" if os.path.islink(directory) else "not a directory"
            raise TeamError(f"the token store's directory {directory} is {what}: refused", fix=fix) from None
        raise
    try:
        _check_own(folder, directory, fix)
        try:
            fd = os.open(path.name, flags, dir_fd=folder)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise TeamError(f"the token store {path} is a symbolic link: refused", fix=fix) from None
            raise
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(_check_own(fd, path, fix).st_mode):
                raise TeamError(f"the token store {path} is not a regular file", fix=fix)
            data = file.read(MAX_STORE_BYTES + 1)  # never the whole of a file grown huge (a sparse one costs no disk)
            if len(data) > MAX_STORE_BYTES:
                raise TeamError(
                    f"the token store {path} is too large (over {MAX_STORE_BYTES:,} bytes): no store `token add` wrote",
                    fix="restore it or remove it",
                )
            return data
    finally:
        os.close(folder)


def _check_own(fd: int, place: Path, fix: str) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        raise TeamError(
            f"the token store's {place} is not this user's alone (owner uid {st.st_uid}, mode {mode:o}): refused",
            fix=fix,
        )
    return st


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _principal(record: dict[str, Any]) -> Principal:
    return Principal(
        name=str(record["name"]),
        id=str(record["id"]),
        tenant=str(record["tenant"]),
        calls_per_minute=int(record["calls_per_minute"]),
        concurrent_crafts=int(record["concurrent_crafts"]),
        created=float(record["created"]),
        revoked=record.get("revoked"),
        grants=tuple(grant for grant in record.get("grants") or () if grant in GRANTS),  # an allow list, even here
    )


def check_tenant(tenant: str) -> None:
    """`tenant` is a tenant's name, as `token add --tenant` takes it (a TeamError otherwise)."""
    _check_name("tenant", tenant)


def _check_name(what: str, value: str) -> None:
    if not NAME.fullmatch(value):
        raise TeamError(
            f"{what} {value[:80]!r} is not a name", fix="use lower-case letters, digits, '.', '_' and '-' (64 at most)"
        )


def _check_limit(what: str, value: int, high: int) -> None:
    if not 1 <= value <= high:
        raise TeamError(f"{what} must be between 1 and {high:,}, got {value}", fix=f"pass {what} within them")
