"""Mistral tool calls: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` objects
(Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo and their templates); a call id is 9 letters
and digits, as those templates require of the history."""

from __future__ import annotations

from torch_tensorrt_dist.serving.tools.calls import CallFormat, alnum_id, held_prefix

__all__ = ["MISTRAL", "START"]

START = "[TOOL_CALLS]"


def split(text: str) -> tuple[int, int | None]:
    at = text.find(START)
    if at >= 0:
        return at, at + len(START)
    return len(text) - held_prefix(text, START), None


MISTRAL = CallFormat("mistral", split, depth=1, new_id=alnum_id)
