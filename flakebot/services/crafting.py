"""`craft --service`: what the spec of a service says, and flakebot's own check of a crafted service's lifecycle.

A service's spec is a ToolSpec whose `service` holds {"protocol": "http", "declaration": ServiceSpec.to_dict(),
"examples": {"first": [...], "after_restart": [...]}}: the declaration `package-service` catalogs and the examples
format of its lifecycle check (lifecycle.Examples), not a second format. The frozen acceptance test
(templates/acceptance_service.rs.j2) runs that lifecycle inside `cargo test`; `lifecycle_failures` runs it again,
as `flakebot up` will, on the binary cargo built, so a green verdict never rests on the test harness alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakebot.config import Settings
from flakebot.errors import SpecError, UsageError
from flakebot.services.declaration import Health, ServiceSpec
from flakebot.services.lifecycle import Examples, Report, check_lifecycle
from flakebot.toolspec import ToolSpec, read_spec_file

PROTOCOLS = ("http",)
MAX_EXCHANGES = 12  # per life: the spec is a few requests, not a load test
TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "service-template"  # where craft --service starts


@dataclass(frozen=True)
class ServiceNeed:
    """What a crafted service must do beside its program: its declaration and the requests of its two lives."""

    declaration: ServiceSpec
    examples: Examples
    protocol: str = "http"

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "declaration": self.declaration.to_dict(),
            "examples": self.examples.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "spec") -> ServiceNeed:
        """The service part of a spec; a SpecError naming the problem (the model is told it and asked again)."""
        # its program starts from the template, which accepts on the socket flakebot hands in (unless it says not)
        declared = {"socket": "handoff", **dict(data.get("declaration") or {})}
        try:
            need = cls(
                ServiceSpec.from_dict(declared),
                Examples.from_dict(dict(data.get("examples") or {})),
                str(data.get("protocol", "http")),
            )
        except UsageError as exc:
            raise SpecError(f"{source}: {exc.message}", fix=exc.fix) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"{source}: malformed service part ({exc})", fix=FIX) from None
        problems = need.problems()
        if problems:
            raise SpecError(f"{source}: {'; '.join(problems)}", fix=FIX)
        return need

    def problems(self) -> list[str]:
        found = []
        if self.protocol not in PROTOCOLS:
            found.append(f"protocol {self.protocol!r} is not one of {', '.join(PROTOCOLS)}")
        if not 1 <= len(self.examples.first) <= MAX_EXCHANGES:
            found.append(f"{len(self.examples.first)} first examples given; 1 to {MAX_EXCHANGES} are needed")
        if not 1 <= len(self.examples.after_restart) <= MAX_EXCHANGES:
            found.append(
                f"{len(self.examples.after_restart)} after_restart examples given; 1 to {MAX_EXCHANGES} are needed "
                "(at least one request whose answer must survive a restart)"
            )
        if not 0.5 <= self.declaration.stop_grace_s <= 60 or not 1 <= self.declaration.start_s <= 120:
            found.append("stop_grace_s must be 0.5-60 and start_s 1-120 seconds")
        return found


FIX = (
    "give health (/PATH or tcp), port_env, 1-12 first and 1-12 after_restart examples "
    "{method, path, body, status, body_out, headers, headers_out}"
)


SPEC_FILE_FIX = (
    'a service\'s spec file is {"name", "summary", "usage", "service": {"declaration": {"health": "/PATH or tcp", '
    '"port_env": "PORT"}, "examples": {"first": [...], "after_restart": [...]}}} (docs/services.md, "Crafting a '
    'service")'
)


def load_service_spec(path: Path) -> ToolSpec:
    """craft --service --spec FILE: a spec with a service part (no command-line examples), checked as the model's
    would be; a SpecError with a service's advice, not a tool's."""
    data = read_spec_file(path)
    if not isinstance(data, dict) or not data.get("service"):
        raise SpecError(f"{path} has no service part", fix=SPEC_FILE_FIX)
    try:
        spec = ToolSpec.from_dict({"examples": [], **data}, source=str(path))
    except SpecError as exc:
        raise SpecError(exc.message, fix=SPEC_FILE_FIX) from None
    ServiceNeed.from_dict(spec.service, str(path))
    return spec


def from_answer(arguments: dict[str, Any]) -> dict[str, Any]:
    """The service part of a spec from the model's submit_service_spec arguments (checked: SpecError)."""
    try:
        declaration = ServiceSpec(
            port_env=str(arguments.get("port_env") or "PORT"),
            health=Health.parse(str(arguments.get("health") or "/health")),
            stop_grace_s=float(arguments.get("stop_grace_s") or 10.0),
            start_s=float(arguments.get("start_s") or 30.0),
            socket="handoff",  # its program starts from the template, which accepts on the socket flakebot holds
        )
    except UsageError as exc:
        raise SpecError(f"submit_service_spec: {exc.message}", fix=exc.fix) from None
    data = {
        "protocol": arguments.get("protocol") or "http",
        "declaration": declaration.to_dict(),
        "examples": {"first": arguments.get("first") or [], "after_restart": arguments.get("after_restart") or []},
    }
    return ServiceNeed.from_dict(data, "submit_service_spec").to_dict()


def lifecycle_of(binary: Path, service: dict[str, Any], settings: Settings) -> Report:
    """flakebot's own lifecycle check of `binary` (a regular file the caller checked), as `flakebot up` runs it."""
    need = ServiceNeed.from_dict(service)
    return check_lifecycle(binary, need.declaration, settings, need.examples)


def lifecycle_failures(binary: Path, service: dict[str, Any], settings: Settings) -> list[str]:
    """What the model is shown when flakebot's lifecycle check of the built binary fails ([] when it passed)."""
    report = lifecycle_of(binary, service, settings)
    if report.ok:
        return []
    output = "\n".join(report.log_tail[-8:])
    return [f"lifecycle check run by flakebot on the built binary: {report.first_problem()}\nits log:\n{output}"]
