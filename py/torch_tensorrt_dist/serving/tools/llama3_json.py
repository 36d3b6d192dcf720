"""Llama 3.1 / 3.2 JSON tool calls: the whole answer is ``{"name": ..., "parameters": {...}}``
(several joined by ``;``), optionally after ``<|python_tag|>``; an answer that starts
otherwise is content (the format Meta's templates ask for when tools are given)."""

from __future__ import annotations

import re

from torch_tensorrt_dist.serving.tools.calls import CallFormat

__all__ = ["LLAMA3_JSON", "PYTHON_TAG"]

PYTHON_TAG = "<|python_tag|>"


_BLANKS = re.compile(r"\s*")


def split(text: str) -> tuple[int, int | None]:
    # only the blanks at the start are read: a stream splits its whole text at every piece
    skipped = _BLANKS.match(text).end()  # type: ignore[union-attr]
    rest = len(text) - skipped
    if not rest or (rest < len(PYTHON_TAG) and PYTHON_TAG.startswith(text[skipped:])):
        return 0, None  # undecided: hold
    if text.startswith(PYTHON_TAG, skipped):
        return 0, skipped + len(PYTHON_TAG)
    if text.startswith("{", skipped):
        return 0, skipped
    return len(text), None


LLAMA3_JSON = CallFormat("llama3_json", split, depth=0, args_keys=("parameters", "arguments"))
