"""`flakebot eval --record DIR`: turn a live run's transcript into a replayable model script (docs/scripts.md).

Every model reply the transcript holds becomes a turn of its stage, with its text, tool calls and token counts,
so `--model scripted:FILE` replays what the real model said, through the same stub server and SDK.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def script_from_transcript(transcript: Path, model: str, need: str) -> dict[str, Any]:
    """A format-1 script holding, per stage, the replies the model gave in the run behind `transcript`."""
    stages: dict[str, list[dict[str, Any]]] = {}
    for line in transcript.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "model_reply" and entry.get("stage"):
            stages.setdefault(entry["stage"], []).append(_turn(entry["reply"]))
    return {
        "format": 1,
        "sdk": "openai",
        "model": model,
        "description": f"Recorded from a live run of {model} on the need {need!r} (flakebot eval --record).",
        "stages": stages,
    }


def _turn(reply: dict[str, Any]) -> dict[str, Any]:
    turn: dict[str, Any] = {}
    if reply.get("text"):
        turn["content"] = reply["text"]
    if reply.get("tool_calls"):
        turn["tool_calls"] = [
            {"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in reply["tool_calls"]
        ]
    usage = reply.get("usage") or {}
    turn["usage"] = {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "cached_tokens") if k in usage}
    if not turn.get("content") and not turn.get("tool_calls"):
        turn["content"] = ""
    return turn


def write_recording(transcript: Path, dest: Path, model: str, need: str) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(script_from_transcript(transcript, model, need), indent=1, ensure_ascii=False) + "\n")
    logger.info("recorded %s's session for %r in %s", model, need, dest)
    return dest
