"""Team mode: what lets one flakebot serve many agents (`flakebot serve` is flakebot.mcp.front) and spread their
crafts over workers.

    tokens.py     static bearer tokens: made once, stored as their SHA-256 only, each naming a principal, its tenant
                  and its limits; revoked by name; verified on every request (a revocation is seen at once)
    idtokens.py   an identity provider's JWTs, verified here with its public key (algorithms pinned by the key),
                  behind the same verifier as the static tokens (tokens.Verifier)
    claimlimits.py a JWT principal's limits: its IdP's limits claim, checked, held to the caps the front sets
    jwks.py       the identity provider's keys fetched from its JWKS URL (or its OpenID configuration's jwks_uri):
                  cached for a TTL, fetched again on an unknown kid at most once per interval, HTTPS beyond loopback
    admission.py  what one token may do now: tool calls per minute (a sliding window) and concurrent long jobs, behind
                  a small protocol a shared (PostgreSQL) version can replace
    audit.py      the append-only audit: one JSON line per call (principal, tenant, tool, argument digest, outcome,
                  duration), never the arguments' text
    db.py         the PostgreSQL connection and schema (jobs, tenants, audit)
    dburl.py      which database (--database, else FLAKEBOT_DATABASE_URL), a password on a command line refused
    queue.py      the work queue: one craft per need, tenant quotas exact under races, fair claims, leases
    worker.py     `flakebot worker`'s loop: claim a job, run today's pipeline on it, write the result back; it sweeps lost
                  fronts too
    fronts.py     each front's lease; a lost front's waited calls' followings ended by a sweep (fronts, workers)
    frontqueue.py the front's link to the queue: enqueue the request the door checked, read rows as their tenant
    tenancy.py    whose a front's detached job is (its tenant, beside its journal) and which runs a tenant made
    metrics.py    the front's metrics in Prometheus' text format: calls, latency, refusals, the queue's depth

May import deliver, pipeline, validation (a job's request is checked as the doors check their
arguments) and the leaves. The HTTP door itself lives with the other MCP door (flakebot.mcp.front):
nothing in the library imports a door.
"""
