"""What each stage hands on (flakebot/stages/outputs.py): typed, and readable from runs an earlier format wrote."""

from __future__ import annotations

from flakebot.stages.outputs import AcquireOut, LocateOut


def test_a_located_crate_says_where_it_is_in_the_workspace() -> None:
    located = LocateOut(kind="crate", source_dir="/w/ws/tool", workspace="/w/ws", crate_dir="tool")
    assert LocateOut.from_dict(located.to_dict()) == located


def test_an_earlier_runs_outputs_take_crate_dir_from_the_acquisition_record() -> None:
    origin = {"method": "archive", "crate_dir": "member"}
    assert LocateOut.from_dict({"kind": "crate", "origin": origin}).crate_dir == "member"
    assert AcquireOut.from_dict({"origin": origin}).crate_dir == "member"
    assert LocateOut.from_dict({"kind": "path", "source_dir": "/src"}).crate_dir == ""
