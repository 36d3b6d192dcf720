"""The checks of a chat request's tool fields, one function per field (pure): ``tools``,
``tool_choice``, ``parallel_tool_calls``, and the ``tool_calls`` of assistant messages.

Each raises :class:`ToolFieldError` naming the exact field (``tools[2].function.parameters``)
and what was found; ``schema.py`` turns it into a 400 with that ``param``. The grammar engine's
own verdict on a schema comes later, when a grammar is built from it (``prepare.py``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "MAX_TOOLS",
    "ToolChoice",
    "ToolFieldError",
    "check_chat_template_kwargs",
    "check_message_tool_calls",
    "check_tool_choice",
    "check_tools",
]

#: The most tools a request may list (OpenAI's limit)
MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
#: schema keywords whose value is a schema, a list of schemas, or a map of schemas
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions")


class ToolFieldError(ConfigError):
    """A tool field that is wrong; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _schema(value: Any, where: str) -> None:
    """A JSON schema's shape: an object (or a boolean), each keyword of the right kind."""
    if isinstance(value, bool):
        return
    if not isinstance(value, dict):
        raise ToolFieldError(where, f"a JSON schema is an object, got {value!r:.60}")
    kind = value.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    bad = [k for k in kinds if k not in _TYPES]
    if bad:
        raise ToolFieldError(
            f"{where}.type", f"{bad[0]!r} is not a JSON schema type ({', '.join(sorted(_TYPES))})"
        )
    for key in _ONE:
        if key in value:
            _schema(value[key], f"{where}.{key}")
    for key in _LIST:
        if key in value:
            if not isinstance(value[key], list):
                raise ToolFieldError(f"{where}.{key}", "must be a list of schemas")
            for i, sub in enumerate(value[key]):
                _schema(sub, f"{where}.{key}[{i}]")
    for key in _MAP:
        if key in value:
            if not isinstance(value[key], dict):
                raise ToolFieldError(f"{where}.{key}", "must be an object of schemas")
            for name, sub in value[key].items():
                _schema(sub, f"{where}.{key}.{name}")
    required = value.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(r, str) for r in required)
    ):
        raise ToolFieldError(f"{where}.required", f"must be a list of names, got {required!r:.60}")


def check_tools(value: Any) -> list[dict[str, Any]]:
    """OpenAI's ``tools``: at most 128 ``{"type": "function", "function": {"name",
    "description"?, "parameters"? (a JSON schema), "strict"?}}``, names unique."""
    if not isinstance(value, list):
        raise ToolFieldError("tools", f"must be a list of tools, got {type(value).__name__}")
    if len(value) > MAX_TOOLS:
        raise ToolFieldError("tools", f"holds {len(value)} tools; at most {MAX_TOOLS} are allowed")
    seen: set[str] = set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ToolFieldError(f"{where}.type", 'must be "function" (the only kind of tool)')
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise ToolFieldError(f"{where}.function", "must be an object with a name")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ToolFieldError(
                f"{where}.function.name",
                f"must be 1-64 letters, digits, '_', '.' or '-', got {name!r:.80}",
            )
        if name in seen:
            raise ToolFieldError(f"{where}.function.name", f"{name!r} is listed twice")
        seen.add(name)
        if "description" in fn and not isinstance(fn["description"], str | None):
            raise ToolFieldError(f"{where}.function.description", "must be a string")
        if fn.get("parameters") is not None:
            _schema(fn["parameters"], f"{where}.function.parameters")
    return value


@dataclass(frozen=True)
class ToolChoice:
    """``tool_choice``: ``none``, ``auto``, ``required``, or ``function`` (named)."""

    mode: str
    function: str | None = None


def check_tool_choice(value: Any) -> ToolChoice:
    if value in ("none", "auto", "required"):
        return ToolChoice(value)
    fn = value.get("function") if isinstance(value, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str):
        raise ToolFieldError(
            "tool_choice",
            'must be "none", "auto", "required" or {"type": "function", "function": {"name": '
            f"...}}}}, got {value!r:.80}",
        )
    return ToolChoice("function", name)


def check_message_tool_calls(messages: list[dict[str, Any]]) -> None:
    """An assistant message's ``tool_calls``: ``{id, type: "function", function: {name,
    arguments: JSON text of an object}}`` each."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if calls is None:
            continue
        where = f"messages[{i}].tool_calls"
        if m.get("role") != "assistant" or not isinstance(calls, list):
            raise ToolFieldError(where, "only an assistant message has tool_calls, a list")
        for k, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ToolFieldError(f"{where}[{k}].function", "must be an object with a name")
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError as exc:
                    raise ToolFieldError(
                        f"{where}[{k}].function.arguments", f"is not JSON: {exc}"
                    ) from None
            if not isinstance(args, dict):
                raise ToolFieldError(
                    f"{where}[{k}].function.arguments", f"must be a JSON object, got {args!r:.60}"
                )


#: template variables a request cannot set (the server sets them)
_RESERVED = {"messages", "tools", "documents", "add_generation_prompt", "raise_exception"}


def check_chat_template_kwargs(value: Any) -> dict[str, Any]:
    """vLLM's ``chat_template_kwargs``: more variables for the chat template
    (``{"enable_thinking": false}``), none of those the server sets."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ToolFieldError("chat_template_kwargs", "must be an object of template variables")
    taken = sorted(set(value) & _RESERVED | {k for k in value if k.endswith("_token")})
    if taken:
        raise ToolFieldError(
            "chat_template_kwargs", f"{taken[0]!r} is set by the server; leave it out"
        )
    return value


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates read them: each call's ``arguments`` an object, not
    JSON text (transformers' and vLLM's convention; templates write ``arguments | tojson``)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            calls = [_call_for_template(c) for c in calls]
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def _call_for_template(call: dict[str, Any]) -> dict[str, Any]:
    fn = call["function"]
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        args = json.loads(args)
    return {**call, "function": {**fn, "arguments": args}}
