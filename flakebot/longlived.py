"""Imports kept out of Python's cyclic garbage collector. A collection walks every object its generations track; a
craft's imports (typer, pydantic, a stage's tool schemas, the model SDK) make over 100,000 objects that live as long
as the process, and before the first model reply the collections they set off took 0.10-0.13 s of a 0.7 s start
(two full ones walked them all). Imported with the collector paused and then frozen (gc.freeze), they are never
walked again; reference counting still frees whatever of them is dropped."""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()
_state = {"depth": 0, "modules": 0, "resume": False}  # the outermost block's: what to restore, what it started with


@contextlib.contextmanager
def imports_kept() -> Iterator[None]:
    """Run a block that may import with the collector paused; when it imported anything, freeze every tracked object
    (what it made is the process's from now on). A block that imports nothing new freezes nothing, so a long-lived
    server calling it again and again never freezes the garbage of its requests. Nested or concurrent blocks: the
    outermost one decides."""
    with _LOCK:
        if _state["depth"] == 0:
            _state.update(modules=len(sys.modules), resume=gc.isenabled())
            gc.disable()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                if len(sys.modules) > _state["modules"]:
                    gc.freeze()
                if _state["resume"]:
                    gc.enable()
