"""One exception tree for flakebot.

    FlakebotError                      exit 1
    ├── UsageError                     exit 2   bad arguments or input
    │   └── UnsafePath (an OSError)    exit 2   a link, '..' or a non-file inside a tree someone else wrote
    ├── ConfigError                    exit 3   unknown key, bad TOML, bad value
    ├── RunError                       exit 4   run id unknown, state.json corrupt, workdir unusable
    ├── HostError                      exit 5   this machine: disk full, read-only or unwritable directory
    ├── SearchError                    exit 10  registry unusable, query empty, crates.io failing
    ├── AcquireError                   exit 20  clone, fork, archive, workspace layout
    ├── ModelError                     exit 30  provider, key, transport, script
    │   └── BudgetExceeded             exit 31  tokens / cost / time budget spent
    ├── SandboxError                   exit 40  sandbox required but unavailable, command failed to start
    │   ├── UpgradeRefused             exit 43  a service's new version failed its checks
    │   └── PrivilegeError             exit 44  not root, and this needs what root has (pasta's tun device)
    ├── EditError                      exit 41  the loop ended without green tests
    ├── SpecError                      exit 42  the need could not become a spec
    ├── NixError                       exit 50  nix missing, flake build or smoke run failed
    ├── CatalogError                   exit 60  tool unknown, catalog unusable
    │   └── CatalogTrustError          exit 61  a shared catalog's index refused (unsigned, stale, malformed)
    ├── TeamError                      exit 70  team mode: a token name unknown, taken or malformed
    │   ├── BindRefused                exit 71  `serve` on a non-loopback address without TLS and tokens
    │   └── QuotaExceeded              exit 72  a tenant's quota used up (crafts in flight, crafts per day)
    └── Interrupted                    exit 130 Ctrl-C / SIGTERM

Every error carries a one-line `message` naming the problem and a `fix` naming the remedy.
Errors that end a run also carry `stage`, the `run_id` (set by the pipeline) and any data useful to a
caller (`details`). Only the CLI turns these into a red line and an exit code; `result()` is the object
`--json` and the MCP server hand to programs.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AcquireError",
    "BindRefused",
    "BudgetExceeded",
    "CatalogError",
    "CatalogTrustError",
    "ConfigError",
    "EditError",
    "FlakebotError",
    "HostError",
    "Interrupted",
    "ModelError",
    "NixError",
    "PrivilegeError",
    "QuotaExceeded",
    "RunError",
    "SandboxError",
    "SearchError",
    "SpecError",
    "TeamError",
    "UnsafePath",
    "UsageError",
    "error_classes",
    "exit_code_classes",
    "exit_code_table",
]


class FlakebotError(Exception):
    """Root of every error flakebot raises on purpose."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        fix: str | None = None,
        stage: str | None = None,
        **details: Any,
    ) -> None:
        from flakebot.redact import redact, redact_text

        # error messages quote logs and commands: a key must not reach a terminal or state.json
        message = bounded(redact_text(message))
        super().__init__(message)
        self.message = message
        self.fix = bounded(redact_text(fix)) if fix else fix
        self.stage = stage
        self.details = redact(details)
        self.run_id: str | None = None  # set by the pipeline when the error ends a run

    def one_line(self) -> str:
        """The message and its fix as one line, as the CLI prints it."""
        text = self.message.rstrip(".")
        if self.stage:
            text = f"[{self.stage}] {text}"
        if self.fix:
            text = f"{text}. Fix: {self.fix}"
        return text.replace("\n", " ")

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "message": self.message,
            "fix": self.fix,
            "stage": self.stage,
            "exit_code": self.exit_code,
            "details": {k: v for k, v in self.details.items() if _jsonable(v)},
        }

    def result(self) -> dict[str, Any]:
        """The one object a program gets for this error: `--json` prints it on stdout, MCP returns it."""
        return {
            "error": self.message,
            "fix": self.fix,
            "exit_code": self.exit_code,
            "run_id": self.run_id,
            "stage": self.stage,
            "type": type(self).__name__,
            "details": self.to_dict()["details"],
        }


MESSAGE_LIMIT = 2000  # characters of an error's message or fix: they echo input, and input has no bound of its own


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` whole when short; else its start and end around a note of how much was cut (a 100 KB name echoed in
    an error is no help to anyone reading it, on a terminal or over MCP)."""
    if len(text) <= limit:
        return text
    head, tail = limit * 3 // 4, limit // 5
    return f"{text[:head]} [... {len(text) - head - tail:,} characters cut ...] {text[-tail:]}"


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict, type(None)))


class UsageError(FlakebotError):
    """Bad arguments or input."""

    exit_code = 2


class ConfigError(FlakebotError):
    """Configuration: unknown key, invalid TOML, bad value."""

    exit_code = 3


class RunError(FlakebotError):
    """Run unknown, state.json corrupt, work directory unusable."""

    exit_code = 4


class HostError(FlakebotError):
    """This machine: disk full, a read-only or unwritable directory, a missing permission (never the model's doing)."""

    exit_code = 5


class SearchError(FlakebotError):
    """Search: registry unusable, query empty, crates.io failing."""

    exit_code = 10


class AcquireError(FlakebotError):
    """Acquiring the crate: clone, fork, archive, workspace layout."""

    exit_code = 20


class ModelError(FlakebotError):
    """Model provider: key, transport, script."""

    exit_code = 30


class BudgetExceeded(ModelError):
    """Budget spent: tokens, cost or time."""

    exit_code = 31


class SandboxError(FlakebotError):
    """Sandbox required but unavailable, or a command failed to start."""

    exit_code = 40


class UpgradeRefused(SandboxError):
    """A service's new version failed its checks; the running version keeps serving."""

    exit_code = 43


class PrivilegeError(SandboxError):
    """flakebot is not root and this needs what root has (a device, a namespace it may not join)."""

    exit_code = 44


class EditError(FlakebotError):
    """The edit loop ended without green tests."""

    exit_code = 41


class SpecError(FlakebotError):
    """The need could not become a spec."""

    exit_code = 42


class NixError(FlakebotError):
    """Nix: missing, flake build or smoke run failed."""

    exit_code = 50


class CatalogError(FlakebotError):
    """Catalog: tool unknown, catalog unusable."""

    exit_code = 60


class CatalogTrustError(CatalogError):
    """A shared catalog's index refused: unsigned, by an untrusted key, expired, rolled back or malformed."""

    exit_code = 61


class TeamError(FlakebotError):
    """Team mode: a token name unknown, taken or malformed, or a token store unusable."""

    exit_code = 70


class BindRefused(TeamError):
    """`flakebot serve` refused an address beyond loopback: TLS and at least one token are needed there."""

    exit_code = 71


class QuotaExceeded(TeamError):
    """A tenant's quota is used up: crafts in flight or crafts per day (team mode)."""

    exit_code = 72


class UnsafePath(UsageError, OSError):
    """A path inside an untrusted tree refused by flakebot.safefs (details: `path` and `rule`): input flakebot will
    not use. An OSError too, so a caller that already treats a failed file operation as "not done" (a cache
    skipped, a tool call failed) keeps doing so."""


class Interrupted(FlakebotError):
    """Interrupted (Ctrl-C, SIGTERM)."""

    exit_code = 130


def exit_code_table() -> str:
    """The README's exit-code table, generated from the classes above (tests/test_errors.py keeps them in step)."""
    rows = ["| code | error | meaning |", "| --- | --- | --- |", "| 0 | | success |"]
    for cls in sorted(exit_code_classes(), key=lambda c: c.exit_code):
        rows.append(f"| {cls.exit_code} | {cls.__name__} | {(cls.__doc__ or '').strip().rstrip('.')} |")
    return "\n".join(rows) + "\n"


def exit_code_classes() -> list[type[FlakebotError]]:
    """The errors that own an exit code (subclasses elsewhere, such as ScriptError, share their parent's)."""
    return [cls for cls in error_classes(FlakebotError) if "exit_code" in vars(cls)]


def error_classes(cls: type[FlakebotError]) -> list[type[FlakebotError]]:
    """Every subclass of `cls`, depth first."""
    return [c for sub in cls.__subclasses__() for c in (sub, *error_classes(sub))]
