"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
one tag per call, after any content (Hermes 2 Pro, Qwen2.5, Qwen3 and their templates)."""

from __future__ import annotations

from torch_tensorrt_dist.serving.tools.calls import CallFormat, held_prefix

__all__ = ["HERMES", "START"]

START = "<tool_call>"


def split(text: str) -> tuple[int, int | None]:
    at = text.find(START)
    if at >= 0:
        return at, at + len(START)
    return len(text) - held_prefix(text, START), None


HERMES = CallFormat("hermes", split, depth=0, anywhere=True)
