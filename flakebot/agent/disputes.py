"""Spec disputes: the edit model may say an acceptance example is wrong; the spec model settles it.

`dispute_example(n, reason)` is one more tool in the edit loop (each tool is declared by the function of its name). flakebot asks the spec model, in a separate
call that the transcript logs (stage "dispute"), to confirm example n or correct it. A correction replaces
the example in the spec, rewrites the acceptance test and freezes it again. At most MAX_DISPUTES per run;
every dispute is recorded (the edit stage's output, the manifest, and USAGE.md for corrected examples).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from flakebot.agent.tools import Toolbox, ToolResult
from flakebot.errors import FlakebotError, SpecError
from flakebot.llm.base import Model
from flakebot.toolschema import declare
from flakebot.toolspec import Example, ToolSpec

logger = logging.getLogger(__name__)

MAX_DISPUTES = 2
EXAMPLE_FIELDS = ("description", "args", "stdin", "files", "stdout", "exit_code")


def dispute_example(n: int, reason: str) -> None:
    """Say that acceptance example n (1-based) contradicts the need or the other examples. The spec's author confirms
    or corrects it; a corrected example replaces the frozen test. At most {MAX_DISPUTES} disputes per run: fix the
    code when the example is right.

    n: example number, 1-based
    reason: what is wrong with it
    """


def confirm_example(reason: str) -> None:
    """The example is right as written."""


def correct_example(example: Example, reason: str) -> None:
    """The example is wrong: give the whole corrected example."""


DISPUTE_TOOL = declare(dispute_example).schema()
RULING_TOOLS = [declare(confirm_example, closed=False).schema(), declare(correct_example, closed=False).schema()]


class DisputeDesk:
    """A Toolbox with `dispute_example` added: every other call goes to the toolbox unchanged."""

    def __init__(
        self,
        toolbox: Toolbox,
        spec: ToolSpec,
        need: str,
        spec_model: Callable[[], Model],
        refreeze: Callable[[ToolSpec], None],
        record: Callable[..., None] = lambda *_, **__: None,
    ) -> None:
        self.toolbox, self.spec, self.need = toolbox, spec, need
        self.spec_model, self.refreeze, self.record = spec_model, refreeze, record
        self.disputes: list[dict[str, Any]] = []

    def schemas(self) -> list[dict[str, Any]]:
        return [*self.toolbox.schemas(), DISPUTE_TOOL]

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != "dispute_example":
            return self.toolbox.call(name, arguments)
        problem = self._refusal(arguments)
        if problem:
            return ToolResult(False, problem, {"tool": name, "error": "refused"})
        return self._settle(int(arguments["n"]), str(arguments.get("reason", "")))

    @property
    def corrected(self) -> list[dict[str, Any]]:
        return [d for d in self.disputes if d["outcome"] == "corrected"]

    def _refusal(self, arguments: dict[str, Any]) -> str:
        n = arguments.get("n")
        if len(self.disputes) >= MAX_DISPUTES:
            return f"refused: the {MAX_DISPUTES} disputes this run allows are used up; make the code pass the examples"
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(self.spec.examples):
            return f"refused: n must be an example number from 1 to {len(self.spec.examples)}"
        if n <= self.spec.inherited_examples:
            return (
                f"refused: example {n} comes from the tool's earlier version, which callers rely on; it cannot change. "
                "Make the code pass it"
            )
        return ""

    def _settle(self, n: int, reason: str) -> ToolResult:
        old = asdict(self.spec.examples[n - 1])
        try:
            ruling, why, new = self._ask(n, reason)
        except FlakebotError as exc:
            return ToolResult(
                False,
                f"the spec's author could not be asked ({exc.one_line()}); the example stands",
                {"error": "failed"},
            )
        if ruling == "corrected" and new is not None:
            self.spec.examples[n - 1] = new
            self.refreeze(self.spec)
        entry = {
            "n": n,
            "reason": reason,
            "outcome": ruling,
            "ruling": why,
            "old": old,
            "new": asdict(new) if new and ruling == "corrected" else None,
        }
        self.disputes.append(entry)
        self.record("dispute", **entry)
        logger.info("dispute over example %d: %s (%s)", n, ruling, why)
        if ruling == "corrected":
            return ToolResult(
                True,
                f"example {n} corrected by the spec's author ({why}); the acceptance test was rewritten and frozen again.",
                {"dispute": entry},
            )
        return ToolResult(
            True,
            f"example {n} stands: the spec's author confirmed it ({why}). Make the code pass it.",
            {"dispute": entry},
        )

    def _ask(self, n: int, reason: str) -> tuple[str, str, Example | None]:
        """The spec model's ruling: ("corrected", why, example) or ("confirmed", why, None)."""
        messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": self._question(n, reason)}]
        reply = self.spec_model().complete(messages, RULING_TOOLS)
        call = reply.tool_calls[0] if reply.tool_calls else None
        if call is None or call.error or call.name not in ("confirm_example", "correct_example"):
            return "confirmed", "the spec's author gave no usable ruling, so the example stands", None
        why = str(call.arguments.get("reason", ""))
        if call.name == "confirm_example":
            return "confirmed", why, None
        try:
            example = self._example(call.arguments.get("example"))
        except SpecError as exc:
            return "confirmed", f"the correction was unusable ({exc.message}), so the example stands", None
        return "corrected", why, example

    def _example(self, data: Any) -> Example:
        fields = {k: v for k, v in (data or {}).items() if k in EXAMPLE_FIELDS} if isinstance(data, dict) else {}
        trial = ToolSpec.from_dict(
            {**self.spec.to_dict(), "examples": [fields, *(asdict(e) for e in self.spec.examples[1:])]},
            source="correction",
        )
        return trial.examples[0]

    def _question(self, n: int, reason: str) -> str:
        listing = "\n".join(f"{i}. {asdict(e)}" for i, e in enumerate(self.spec.examples, 1))
        return (
            f"Need: {self.need}\nTool: {self.spec.name}: {self.spec.summary}\nUsage: {self.spec.usage}\n\nAcceptance examples:\n{listing}\n\n"
            f"The engineer making the tool disputes example {n}: {reason}\n"
            "Call confirm_example if it is right, or correct_example with the whole corrected example."
        )


_SYSTEM = (
    "You wrote the specification of a command-line tool, with acceptance examples. An engineer building the tool says one "
    "example is wrong. Judge it against the need and the other examples only: engineers sometimes dispute a correct example "
    "to avoid work. Correct it only if it is really wrong."
)


def refreezer(toolbox: Toolbox, crate_dir: Path, crate_rel: str) -> Callable[[ToolSpec], None]:
    """Rewrite the acceptance test from the corrected spec and make the new content the frozen one."""
    from flakebot.agent.acceptance import write_acceptance_test

    def refreeze(spec: ToolSpec) -> None:
        for rel, digest in write_acceptance_test(spec, crate_dir).items():
            toolbox.refreeze(str(Path(crate_rel) / rel), digest)

    return refreeze
