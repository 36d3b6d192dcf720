"""The calls a grammar forces (``tool_choice`` "required" or a named function), in the shape
vLLM forces them, whatever the model's own format:

- named: the answer is the function's arguments, a JSON object (:class:`Named`);
- required: the answer is a JSON list of ``{"name": ..., "parameters": {...}}``, at least one
  (one only without ``parallel_tool_calls``) (:data:`REQUIRED`).

The grammars (JSON schemas) that force them: :func:`named_schema`, :func:`required_schema`.
Their JSON is compact, one space after ``:`` and ``,`` and no other white space
(``COMPACT``, llguidance's options): a call is read by a program, and the white space other
grammars allow between tokens (up to 16 characters) let the demo model's random weights spend
all 164 tokens it had left on it (3 of 3 seeds, "required").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.serving.tools.calls import (
    CallFormat,
    Delta,
    Parsed,
    ToolCall,
    openai_id,
)

__all__ = ["COMPACT", "REQUIRED", "Named", "named_schema", "required_schema"]

#: llguidance's JSON options of a call: json.dumps' separators, no other white space
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _at_start(text: str) -> tuple[int, int | None]:
    return 0, 0


REQUIRED = CallFormat("required", _at_start, depth=1, args_keys=("parameters",))


@dataclass(frozen=True)
class Named:
    """``tool_choice`` naming ``function``: the whole answer is its arguments."""

    function: str

    @property
    def name(self) -> str:
        return f"named:{self.function}"

    def parse(self, text: str) -> Parsed:
        args = text.strip()
        try:
            value = json.loads(args)
        except json.JSONDecodeError:
            return Parsed(text or None)  # cut by max_tokens: the text as it is
        if not isinstance(value, dict):
            return Parsed(text or None)
        return Parsed(None, [ToolCall(openai_id(), self.function, text.lstrip())])

    def stream(self) -> NamedStream:
        return NamedStream(self.function)


class NamedStream:
    def __init__(self, function: str) -> None:
        self.function, self.id = function, openai_id()
        self.called = False

    def feed(self, piece: str) -> list[Delta]:
        if not self.called:
            piece = piece.lstrip()
            if not piece:
                return []
            self.called = True
            head = {"index": 0, "id": self.id, "type": "function"}
            out: list[Delta] = [
                {"tool_calls": [{**head, "function": {"name": self.function, "arguments": ""}}]}
            ]
        else:
            out = []
        if piece:
            out.append({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        return out

    def finish(self) -> list[Delta]:
        return []


def _parameters(tool: dict[str, Any]) -> Any:
    params = tool["function"].get("parameters")  # absent or null: no arguments
    return params if params is not None else {"type": "object", "properties": {}}


def named_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The grammar of a named call: the function's parameters."""
    params = _parameters(tool)
    schema = dict(params) if isinstance(params, dict) else {"allOf": [params]}
    return {**schema, "x-guidance": COMPACT}


def required_schema(tools: list[dict[str, Any]], *, parallel: bool) -> dict[str, Any]:
    """The grammar of "required": a list of calls of the given functions, each
    ``{"name": <one of them>, "parameters": <its parameters>}``."""
    each = [
        {
            "type": "object",
            "properties": {"name": {"const": t["function"]["name"]}, "parameters": _parameters(t)},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    items = each[0] if len(each) == 1 else {"anyOf": each}
    schema: dict[str, Any] = {"type": "array", "items": items, "minItems": 1, "x-guidance": COMPACT}
    if not parallel:
        schema["maxItems"] = 1
    return schema
