"""One exception tree for flakebot.

    FlakebotError                      exit 1
    ├── UsageError                     exit 2   bad arguments or input
    ├── ConfigError                    exit 3   unknown key, bad TOML, bad value
    ├── RunError                       exit 4   run id unknown, state.json corrupt, workdir unusable
    ├── SearchError                    exit 10  registry unusable, query empty, crates.io failing
    ├── AcquireError                   exit 20  clone, fork, archive, workspace layout
    ├── ModelError                     exit 30  provider, key, transport, script
    │   └── BudgetExceeded             exit 31  tokens / cost / time budget spent
    ├── SandboxError                   exit 40  sandbox required but unavailable, command failed to start
    ├── EditError                      exit 41  the loop ended without green tests
    ├── SpecError                      exit 42  the need could not become a spec
    ├── NixError                       exit 50  nix missing, flake build or smoke run failed
    ├── CatalogError                   exit 60  tool unknown, catalog unusable
    └── Interrupted                    exit 130 Ctrl-C / SIGTERM

Every error carries a one-line `message` naming the problem and a `fix` naming the remedy.
Errors that end a run also carry `stage` and any data useful to a caller (`details`).
Only the CLI turns these into a red line and an exit code.
"""

from __future__ import annotations

from typing import Any


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

        message = redact_text(message)  # error messages quote logs and commands: a key must not reach a terminal or state.json
        super().__init__(message)
        self.message = message
        self.fix = redact_text(fix) if fix else fix
        self.stage = stage
        self.details = redact(details)

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


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, list, dict, type(None)))


class UsageError(FlakebotError):
    exit_code = 2


class ConfigError(FlakebotError):
    exit_code = 3


class RunError(FlakebotError):
    exit_code = 4


class SearchError(FlakebotError):
    exit_code = 10


class AcquireError(FlakebotError):
    exit_code = 20


class ModelError(FlakebotError):
    exit_code = 30


class BudgetExceeded(ModelError):
    exit_code = 31


class SandboxError(FlakebotError):
    exit_code = 40


class EditError(FlakebotError):
    exit_code = 41


class SpecError(FlakebotError):
    exit_code = 42


class NixError(FlakebotError):
    exit_code = 50


class CatalogError(FlakebotError):
    exit_code = 60


class Interrupted(FlakebotError):
    exit_code = 130


EXIT_CODES = {cls.__name__: cls.exit_code for cls in FlakebotError.__subclasses__()}
