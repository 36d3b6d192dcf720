"""Mistral tool calls: ``[TOOL_CALLS]`` then a JSON list of ``{"name", "arguments"}`` objects
(Mistral 7B v0.3, Mixtral 8x22B, Mistral Nemo and their templates), or, from the v11
tokenizers on (Mistral Small 3.x, Magistral, Devstral), ``[TOOL_CALLS]name[ARGS]{...}`` per
call; a call id is 9 letters and digits, as those templates require of the history."""

from __future__ import annotations

import json

from torch_tensorrt_dist.serving.tools.calls import CallFormat, alnum_id, held_prefix
from torch_tensorrt_dist.serving.tools.scan import value_end

__all__ = ["ARGS", "MISTRAL", "START"]

START, ARGS = "[TOOL_CALLS]", "[ARGS]"


def split(text: str) -> tuple[int, int | None]:
    at = text.find(START)
    if at >= 0:
        return at, at + len(START)
    return len(text) - held_prefix(text, START), None


def _one(call: str) -> str:
    """``name[ARGS]{...}`` (maybe cut short) as ``{"name": ..., "arguments": {...}}``."""
    name, sep, args = call.partition(ARGS)
    if not sep:  # the name still growing; what may begin [ARGS] is held back
        name = name[: len(name) - held_prefix(name, ARGS)]
        return '{"name": "' + name.strip()
    head = '{"name": ' + json.dumps(name.strip()) + ', "arguments": '
    args = args.lstrip()
    end = value_end(args, 0) if args else None
    if end is None:
        return head + args
    return head + args[:end] + "}"  # what follows the arguments (a next [TOOL_CALLS]) is not them


def normalize(region: str) -> str:
    """The v11 form as the JSON list of the older one (the list form as it is)."""
    if region.lstrip().startswith("[") or not region.strip():
        return region
    return "[" + ", ".join(_one(c) for c in region.split(START))  # the list left open


MISTRAL = CallFormat("mistral", split, depth=1, new_id=alnum_id, normalize=normalize)
