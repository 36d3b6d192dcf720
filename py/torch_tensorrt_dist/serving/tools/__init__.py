"""Tool calls in a model's text, one module per format, each pure (``calls.py`` holds what they
share):

    fmt = FORMATS["hermes"]                 # or format_for_template(source) (None: unknown)
    parsed = fmt.parse(text)                # Parsed(content, [ToolCall]); fmt.stream(): deltas

``hermes`` (Hermes, Qwen), ``llama3_json`` (Llama 3.1+), ``mistral`` (Mistral, Mixtral); the
calls a grammar forces (``tool_choice`` "required" or named) are read by ``forced.py``.
"""

from __future__ import annotations

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.tools.calls import CallFormat, Parsed, ToolCall
from torch_tensorrt_dist.serving.tools.hermes import HERMES
from torch_tensorrt_dist.serving.tools.llama3_json import LLAMA3_JSON, PYTHON_TAG
from torch_tensorrt_dist.serving.tools.mistral import MISTRAL

__all__ = [
    "FORMATS",
    "CallFormat",
    "Parsed",
    "ToolCall",
    "format_for_template",
    "served_format",
    "tool_format",
]

FORMATS: dict[str, CallFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL)}

#: text a family's chat template holds -> its format (the first that matches)
_TEMPLATE_MARKS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    (PYTHON_TAG, "llama3_json"),
)


def format_for_template(source: str | None) -> str | None:
    """The tool-call format a chat template asks its model for (None: not recognised)."""
    if not source:
        return None
    return next((name for mark, name in _TEMPLATE_MARKS if mark in source), None)


def tool_format(name: str) -> CallFormat:
    """The format named ``name`` (``--tool-call-parser``); ConfigError naming the choices."""
    if name not in FORMATS:
        raise ConfigError(
            f"--tool-call-parser {name!r} is not known; choose one of {', '.join(FORMATS)}"
        )
    return FORMATS[name]


def served_format(parser: str | None, template: str | None) -> CallFormat | None:
    """``--tool-call-parser``, else the format the chat template asks for (None: unknown)."""
    name = parser or format_for_template(template)
    return tool_format(name) if name is not None else None
