"""A front's own admission (flakebot.team.admission.MemoryAdmission): calls per minute, and what it keeps."""

from __future__ import annotations

from flakebot.team.admission import WINDOW_SECONDS, MemoryAdmission
from flakebot.team.tokens import Principal


def principal(n: int, calls_per_minute: int = 2) -> Principal:
    return Principal(f"jwt-user-{n}", f"jwt-{n}", "acme", calls_per_minute, 1, 0.0)


def test_a_principal_seen_once_is_forgotten_a_minute_later_and_its_limit_still_holds() -> None:
    """Each principal's window of calls stayed in memory for the front's life, though JWT subjects are unbounded: a
    front seen by many subjects grew without end. A window whose last call left the minute is dropped now (looked
    for at most once a minute); a principal still calling keeps its count."""
    now = [1000.0]
    admission = MemoryAdmission(clock=lambda: now[0])
    for n in range(1000):
        assert admission.admit_call(principal(n)) is None
    busy = principal(-1)
    assert admission.admit_call(busy) is None and admission.admit_call(busy) is None
    assert admission.admit_call(busy) is not None  # its limit, 2 a minute
    now[0] += WINDOW_SECONDS - 1
    assert admission.admit_call(busy) is not None  # still within its minute: still refused
    now[0] += 2  # a minute since everyone's calls, one second since busy's last refused one
    assert admission.admit_call(busy) is None
    assert len(admission._calls) == 1, len(admission._calls)  # the thousand forgotten; busy counted afresh
