"""What every command shares: the settings in force, the work directory, the checks a run's request passes before
any paid or long step (limits, options, the machine), and the settings a request overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flakebot import config, preflight
from flakebot.errors import UsageError

# What a long command's MCP description ends with: how an agent gets its result.
LONG = " Long: unless the request asks for progress, returns a run handle at once; follow it with `status`."


def settings_or_default(settings: config.Settings | None) -> config.Settings:
    return settings or config.load()


def workdir_of(settings: config.Settings) -> Path:
    """The work directory, refused at once when it names a file or a place no directory can be made (a reading
    command would otherwise say "No runs" there)."""
    workdir = settings.path("workdir")
    preflight.check_could_be_dir(workdir, "workdir")
    return workdir


def run_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The settings a request overrides (those given), coerced as their flags would be."""
    return {k: config.coerce(k, v, f"--{k.replace('_', '-')}") for k, v in given.items() if v is not None}


def check_limits(settings: config.Settings) -> None:
    """Limits that would stop a craft before its first edit fail at once instead."""
    for key, least in (("max_iterations", 1), ("max_tokens", 1), ("max_cost", 0)):
        if settings.get(key) < least:
            flag = f"--{key.replace('_', '-')}"
            raise UsageError(
                f"{key} must be at least {least}, got {settings.get(key)}",
                fix=f"pass {flag} with a larger value (or set {key} in flakebot.toml)",
            )


def check_craft_options(
    crate: str | None, mode: str | None, spec_file: str | None, stop_after: str | None, service: bool = False
) -> None:
    """Bad options, an unreadable spec file (a service's spec for `service`) and a missing nix fail before a run
    exists (and before any model call)."""
    from flakebot.stages.choose import MODES

    if mode is not None and mode not in MODES:
        raise UsageError(f"unknown --mode '{mode}'", fix=f"use one of: {', '.join(MODES)} (with --crate)")
    if mode is not None and not crate:
        raise UsageError(
            "--mode needs --crate", fix="name the crate to start from with --crate NAME, or leave --mode out"
        )
    if spec_file and service:
        from flakebot.services.crafting import load_service_spec

        load_service_spec(Path(spec_file))
    elif spec_file:
        from flakebot.toolspec import load_spec_file

        load_spec_file(Path(spec_file))
    if stop_after not in ("spec", "search", "choose", "acquire", "edit"):  # the run will reach the package stage
        from flakebot.nix.command import nix_program

        nix_program()


def check_crate(name: str, registry: str | None, settings: config.Settings) -> None:
    """A crate name (package's target, craft's --crate) is a name crates.io could hold (said back cut short), and
    one the registry holds when that registry is on this machine (local, a directory source, or any registry
    offline): asked now, not by a run's stage after a model call. crates.io is left to the run, as a network call
    has no place before a run or job starts."""
    from flakebot.crates.registries import open_registry
    from flakebot.stages.locate import CRATE_NAME

    if not CRATE_NAME.match(name):
        shown = name if len(name) <= 64 else name[:64] + "..."
        raise UsageError(
            f"'{shown}' is not a crate name", fix="name a crate: letters, digits, '-' and '_', at most 64 (e.g. csv)"
        )
    choice = registry or settings.registry or "auto"
    if choice in ("crates-io", "crates.io") or (choice == "auto" and not settings.offline):
        return
    open_registry(settings, choice).get(name)  # SearchError: not there


def check_host(settings: config.Settings, registry: str | None) -> None:
    """What the run will need of this machine, checked before the model is called: the registry, room to work, and
    the directories its runs and its tool go to (a read-only catalog fails now, not after the build)."""
    preflight.check_registry(settings, registry)
    preflight.check_writable_dir(workdir_of(settings), "workdir")
    preflight.check_writable_dir(settings.path("catalog_dir"), "catalog_dir")
    preflight.check_free_space(workdir_of(settings))
