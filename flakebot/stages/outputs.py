"""What each stage hands to the next: one dataclass per stage, stored in state.json as a plain dict.

A stage returns its Out; the engine stores `to_dict()` under state["outputs"][STAGE]; a later stage
reads it back with `ctx.get(AcquireOut)`. `from_dict` ignores keys it does not know and fills
missing ones with defaults, so runs written by an earlier format still load (see `_migrate`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from flakebot.nix.flake import PackageResult
from flakebot.toolspec import ToolSpec

T = TypeVar("T", bound="StageOut")


@dataclass
class StageOut:
    """Common to every stage output: the stage it belongs to, and the way to and from state.json."""

    STAGE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in _migrate(cls.STAGE, data).items() if k in known})


@dataclass
class SpecOut(StageOut):
    """The tool to build (from the model or --spec FILE), or the catalogued tool that already meets the need."""

    STAGE: ClassVar[str] = "spec"
    name: str = ""
    summary: str = ""
    usage: str = ""
    examples: list[dict[str, Any]] = field(default_factory=list)
    search_query: str = ""
    inherited_examples: int = 0  # improve: the first examples are the earlier version's, kept
    service: dict[str, Any] = field(default_factory=dict)  # craft --service: declaration and lifecycle examples
    source: str = ""  # "model" or "file PATH"
    reuse: str = ""  # a catalogued tool's name, when the model judged it equivalent
    reason: str = ""
    end_run: bool = False  # set with reuse: the run's work is done, only `always` stages follow

    @classmethod
    def of(cls, spec: ToolSpec, source: str) -> SpecOut:
        return cls.from_dict({**spec.to_dict(), "source": source})

    def tool_spec(self) -> ToolSpec:
        return ToolSpec.from_dict(self.to_dict())


@dataclass
class SearchOut(StageOut):
    STAGE: ClassVar[str] = "search"
    registry: str = ""
    query: str = ""
    candidates: list[dict[str, Any]] = field(default_factory=list)  # Candidate.to_dict(), best first


@dataclass
class ChoiceOut(StageOut):
    STAGE: ClassVar[str] = "choose"
    crate: dict[str, Any] = field(default_factory=dict)  # CrateInfo.to_dict()
    mode: str = ""  # "fork" (edit the crate) or "new" (a new crate depending on it)
    reason: str = ""
    by: str = ""  # "model" or "option"


@dataclass
class AcquireOut(StageOut):
    """The workspace: a git repository on the run's branch; the crate is at `crate_dir` (relative, "" at the top)."""

    STAGE: ClassVar[str] = "acquire"
    origin: dict[str, Any] = field(default_factory=dict)  # how the source was acquired (method, url, revision, ...)
    crate_dir: str = ""
    workspace: str = ""
    branch: str = ""
    target_dir: str = ""
    lockfile: str = ""  # "existing", "generated" or "failed"
    metadata_ok: bool = True
    cargo_error: str = ""
    fetch: dict[str, Any] = field(default_factory=dict)  # the host-side fetch (cargo/fetch.py FetchReport), online
    fork: bool = False
    push: bool = False
    delete_fork: bool = False
    # Dev-dependencies the crate source cannot satisfy, left out in a workspace commit (devdeps.Dropped.to_dict()):
    # the crate's own tests cannot build, so the loop runs the acceptance test alone.
    dropped_dev_dependencies: list[dict[str, Any]] = field(default_factory=list)
    untested: str = ""  # which of the crate's own tests could not run, and why (for the manifest)
    features: list[str] = field(default_factory=list)  # required-features of the tool's binary: cargo gets --features


@dataclass
class EditOut(StageOut):
    STAGE: ClassVar[str] = "edit"
    status: str = ""
    summary: str = ""
    iterations: int = 0
    commit: str = ""
    verdict: dict[str, Any] = field(default_factory=dict)
    binary: str = ""
    # acceptance examples the model disputed, and the rulings
    disputes: list[dict[str, Any]] = field(default_factory=list)
    # the spec's examples as a ruling corrected them (empty: as the spec stage gave them); see tested_spec
    examples: list[dict[str, Any]] = field(default_factory=list)


def tested_spec(spec: SpecOut, edit: EditOut) -> SpecOut:
    """The spec the tool was tested against: the spec stage's, with the examples a dispute corrected in the loop.
    Each stage keeps its own output; the edit stage never rewrites the spec stage's."""
    return dataclasses.replace(spec, examples=edit.examples) if edit.examples else spec


@dataclass
class LocateOut(StageOut):
    """The package pipeline's crate: a directory given by the user, or a crate acquired into the workspace."""

    STAGE: ClassVar[str] = "locate"
    kind: str = ""  # "path" or "crate"
    source_dir: str = ""  # the crate's directory: the PATH given, or workspace/crate_dir
    origin: dict[str, Any] = field(default_factory=dict)  # a crate's acquisition record (source/acquisition.py)
    workspace: str = ""
    crate_dir: str = ""  # a crate's directory in the workspace (relative, "" at the top), as AcquireOut.crate_dir


@dataclass
class InstructOut(StageOut):
    STAGE: ClassVar[str] = "instruct"
    manifest: dict[str, Any] = field(default_factory=dict)
    usage_markdown: str = ""
    catalog: dict[str, Any] = field(default_factory=dict)


@dataclass
class CatalogOut(StageOut):
    """The package pipeline's catalog stage: the packaged crate's manifest and catalog entry (empty: not asked)."""

    STAGE: ClassVar[str] = "catalog"
    manifest: dict[str, Any] = field(default_factory=dict)
    usage_markdown: str = ""
    catalog: dict[str, Any] = field(default_factory=dict)


@dataclass
class CleanOut(StageOut):
    STAGE: ClassVar[str] = "clean"
    kept: bool = False
    removed: list[str] = field(default_factory=list)
    forks: list[dict[str, Any]] = field(default_factory=list)
    pushed: dict[str, Any] | None = None


@dataclass
class PackageOut(StageOut, PackageResult):
    """The flake, the built store path and how to run the tool: what package_crate produced."""

    STAGE: ClassVar[str] = "package"
    run_id: str = ""  # set by flakebot.api.package for its caller
    catalog: dict[str, Any] = field(default_factory=dict)  # the catalog entry, when --catalog put the tool there

    @classmethod
    def of(cls, result: PackageResult) -> PackageOut:
        return cls(**dataclasses.asdict(result))

    def to_dict(self) -> dict[str, Any]:
        """Its fields; catalogued, also what it is (a tool) and the door to call it by (deliver/howto.py)."""
        from flakebot.deliver.howto import how_to_use

        data = super().to_dict()
        return {**data, **how_to_use(self.catalog["name"], "tool")} if self.catalog.get("name") else data


def _migrate(stage: str, data: dict[str, Any]) -> dict[str, Any]:
    """Outputs as format 1 stored them, in today's shape."""
    if stage in ("acquire", "locate") and "crate_dir" not in data:
        # format 1 kept crate_dir only inside origin (and the edit stage then looked for it at the top)
        return {**data, "crate_dir": (data.get("origin") or {}).get("crate_dir", "")}
    return data
