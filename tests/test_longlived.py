"""Imports kept out of the cyclic collector: frozen when something was imported, nothing frozen otherwise, the
collector left as the caller had it."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot.longlived import imports_kept
from tests.conftest import REPO


@pytest.fixture
def fresh_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a module no one imported yet; what the test froze is unfrozen after it."""
    (tmp_path / "kept_for_the_test.py").write_text("TABLE = [{'row': n} for n in range(1000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kept_for_the_test"
    sys.modules.pop("kept_for_the_test", None)
    gc.unfreeze()


def test_an_import_is_made_with_the_collector_paused_and_frozen_after(fresh_module: str) -> None:
    frozen = gc.get_freeze_count()
    with imports_kept():
        assert not gc.isenabled()
        module = __import__(fresh_module)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(module.TABLE)


def test_a_block_that_imports_nothing_new_freezes_nothing() -> None:
    frozen = gc.get_freeze_count()
    garbage = [[n] for n in range(1000)]  # a server's requests: never made permanent
    with imports_kept():
        import json  # noqa: F401  # already imported

    assert gc.get_freeze_count() == frozen and gc.isenabled()
    del garbage


def test_nested_blocks_and_a_paused_collector_are_left_as_found(fresh_module: str) -> None:
    with imports_kept():
        with imports_kept():
            __import__(fresh_module)
        assert not gc.isenabled()  # the outer block still runs
    assert gc.isenabled()
    gc.disable()
    try:
        with imports_kept():
            pass
        assert not gc.isenabled()  # the caller's pause is the caller's
    finally:
        gc.enable()


def test_a_processs_first_model_client_keeps_the_sdk_frozen_and_the_second_freezes_nothing(tmp_path: Path) -> None:
    """Through the real SDK and stub server, in a process that has not imported it yet."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"format": 1, "turns": [{"content": "hi"}, {"content": "again"}]}))
    program = f"""
import gc, json
from flakebot import config
from flakebot.llm.providers import resolve_model
settings = config.load({{}})
counts = []
for _ in range(2):
    with resolve_model("scripted:{script}", settings) as model:
        counts.append(gc.get_freeze_count())
print(json.dumps({{"counts": counts, "enabled": gc.isenabled()}}))
"""
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    first, second = seen["counts"]
    assert first > 20_000, seen  # the SDK's modules, classes and pydantic schemas
    assert second <= first and seen["enabled"], seen  # frozen objects dropped are still freed
