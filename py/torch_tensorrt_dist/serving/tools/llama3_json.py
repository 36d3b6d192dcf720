"""Llama 3.1 / 3.2 JSON tool calls: the whole answer is ``{"name": ..., "parameters": {...}}``
(several joined by ``;``), optionally after ``<|python_tag|>``; an answer that starts
otherwise is content (the format Meta's templates ask for when tools are given)."""

from __future__ import annotations

from torch_tensorrt_dist.serving.tools.calls import CallFormat

__all__ = ["LLAMA3_JSON", "PYTHON_TAG"]

PYTHON_TAG = "<|python_tag|>"


def split(text: str) -> tuple[int, int | None]:
    head = text.lstrip()
    skipped = len(text) - len(head)
    if not head or (PYTHON_TAG.startswith(head) and head != PYTHON_TAG):
        return 0, None  # undecided: hold
    if head.startswith(PYTHON_TAG):
        return 0, skipped + len(PYTHON_TAG)
    if head.startswith("{"):
        return 0, skipped
    return len(text), None


LLAMA3_JSON = CallFormat("llama3_json", split, depth=0, args_keys=("parameters", "arguments"))
