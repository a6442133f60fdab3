"""The interface every section of a benchmark report implements, perf and reliability alike.

    run(setup)          -> the section's typed record (its rows), measured for real
    load(data)          -> that record again from the report's JSON (old reports stay readable)
    summarize(record)   -> the headline figures, a typed summary
    markdown(record)    -> the section's part of the Markdown report

A section is a plain class in its own module (no base class); each package lists its sections in one place
(`benchmarks.perf.SECTIONS`, `benchmarks.reliability.SECTIONS`), in report order. The perf sections' summaries are
their figures, which benchmarks/perf/figures.py makes from each section's result and orders across sections.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

SetupT = TypeVar("SetupT", contravariant=True)
RecordT = TypeVar("RecordT")
SummaryT = TypeVar("SummaryT", covariant=True)


class Section(Protocol[SetupT, RecordT, SummaryT]):
    name: str
    """The section's key in the report's JSON and on the command line."""

    def run(self, setup: SetupT) -> RecordT: ...

    def load(self, data: Any) -> RecordT: ...

    def summarize(self, record: RecordT) -> SummaryT: ...

    def markdown(self, record: RecordT) -> list[str]: ...


class Summary(Protocol):
    """A section's headline figures."""

    def lines(self) -> list[str]:
        """The figures as Markdown bullet lines (the report's and the README's summary)."""
        ...

    def json(self) -> Any:
        """The figures as the report's JSON holds them."""
        ...
