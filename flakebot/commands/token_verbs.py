"""The tokens of team mode (`flakebot serve`): add, list, revoke, and the audit of what each token called. Offered on
the command line and in the Python API only: an agent never makes, sees or revokes a token (no MCP tool)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from flakebot import config
from flakebot.commands.common import settings_or_default
from flakebot.commands.table import Command, Param
from flakebot.team import audit
from flakebot.team.tokens import (
    DEFAULT_CALLS_PER_MINUTE,
    DEFAULT_CONCURRENT_CRAFTS,
    DEFAULT_TENANT,
    GRANTS,
    TokenStore,
)

CLI_API = frozenset({"cli", "api"})


def _store(settings: config.Settings | None) -> TokenStore:
    return TokenStore(settings_or_default(settings).path("workdir"))


def token_add(
    name: Annotated[
        str, Param("The token's name: who or what will use it (an agent, a team member).", positional=True)
    ],
    *,
    tenant: Annotated[str, Param("The tenant the token belongs to.", cli=("--tenant",))] = DEFAULT_TENANT,
    calls_per_minute: Annotated[
        int, Param("Tool calls it may make in any minute (past it: HTTP 429).", cli=("--calls-per-minute",))
    ] = DEFAULT_CALLS_PER_MINUTE,
    concurrent_crafts: Annotated[
        int,
        Param(
            "Long jobs (craft, improve, package, resume, service_up) it may run at once.", cli=("--concurrent-crafts",)
        ),
    ] = DEFAULT_CONCURRENT_CRAFTS,
    grant: Annotated[
        list[str] | None,
        Param(
            f"What else it may do (repeatable): {', '.join(GRANTS)} (read /metrics: every tenant's work, counted).",
            cli=("--grant",),
        ),
    ] = None,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Make a token for `flakebot serve` and print it, this once: only its SHA-256 is kept."""
    principal, token = _store(settings).add(name, tenant, calls_per_minute, concurrent_crafts, grant or ())
    return {**principal.public(), "token": token}


def token_list(settings: config.Settings | None = None) -> dict[str, Any]:
    """List the tokens: name, tenant, limits, when made and revoked (never a token)."""
    return {"tokens": [p.public() for p in _store(settings).principals()]}


def token_revoke(
    name: Annotated[str, Param("The token's name.", positional=True)], settings: config.Settings | None = None
) -> dict[str, Any]:
    """Revoke a token: the next request that carries it is refused (401), on a running server too."""
    return _store(settings).revoke(name).public()


def token_audit(
    principal: Annotated[
        str | None, Param("Only this token's calls (its name; a JWT user's: its principal_id).", cli=("--token",))
    ] = None,
    minutes: Annotated[float | None, Param("Only the calls of the last MINUTES.", cli=("--minutes",), least=0)] = None,
    settings: config.Settings | None = None,
) -> dict[str, Any]:
    """Print the audit of `flakebot serve`: one record per call (who, tool, argument digest, outcome, duration)."""
    since = time.time() - minutes * 60 if minutes is not None else None
    return {"records": audit.read(settings_or_default(settings).path("workdir"), principal, since)}


def _added_text(data: dict[str, Any]) -> str:
    return (
        f"{data['token']}\n"
        f"token {data['name']!r} (tenant {data['tenant']}, {data['calls_per_minute']} calls a minute, "
        f"{data['concurrent_crafts']} concurrent crafts{_granted(data)}). It is shown this once: only its hash is "
        "kept.\n"
        'Agents send it as "Authorization: Bearer TOKEN" (docs/team.md).'
    )


def _granted(data: dict[str, Any]) -> str:
    grants = data.get("grants") or ()
    return f", may read {' and '.join(grants)}" if grants else ""


def _list_text(data: dict[str, Any]) -> str:
    if not data["tokens"]:
        return "no tokens: make one with 'flakebot token add NAME'"
    lines = []
    for t in data["tokens"]:
        made = time.strftime("%Y-%m-%d %H:%M", time.localtime(t["created"]))
        state = f"revoked {time.strftime('%Y-%m-%d %H:%M', time.localtime(t['revoked']))}" if t["revoked"] else "active"
        limits = f"{t['calls_per_minute']}/min, {t['concurrent_crafts']} crafts"
        lines.append(f"{t['name']:<20} {t['tenant']:<12} {limits:<22} made {made}  {state}{_granted(t)}")
    return "\n".join(lines)


def _audit_text(data: dict[str, Any]) -> str:
    lines = []
    for r in data["records"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
        what = f"{r['method']} {r['tool'] or ''}".strip()
        lines.append(f"{when} {r['principal']} ({r['tenant']}) {what} {r['outcome']} {r['ms']} ms")
    return "\n".join(lines) or "no calls audited"


COMMANDS = [
    Command("token add", token_add, doors=CLI_API, text=_added_text),
    Command("token list", token_list, doors=CLI_API, text=_list_text),
    Command("token revoke", token_revoke, doors=CLI_API, text=lambda p: f"token {p['name']!r} revoked"),
    Command("token audit", token_audit, doors=CLI_API, text=_audit_text),
]
