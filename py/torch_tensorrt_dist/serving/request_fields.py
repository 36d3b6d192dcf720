"""The checks of the HTTP API's request fields, one function per field (pure).

Each returns the value as the request model holds it, or raises ``ConfigError`` whose message
names the field, says what it must be and what was found (``schema.py`` turns it into a 400
whose ``param`` is the field). Text must be valid Unicode: a lone surrogate, which JSON's
``\\ud800`` escapes can spell, cannot be tokenized. :func:`unsupported_field` names the first
field of a body that this server cannot honour (``UNSUPPORTED``), which is refused by name.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.sampling import LOGPROBS_MAX, TEMPERATURE_RANGE
from torch_tensorrt_dist.validation import check_float, check_int

__all__ = [
    "MAX_STOP_CHARS",
    "StreamOptions",
    "check_completion_logprobs",
    "check_guided_choice",
    "check_guided_json",
    "check_guided_regex",
    "check_messages",
    "check_model",
    "check_prompts",
    "check_response_format",
    "check_stop",
    "check_stream_options",
    "check_temperature",
    "check_top_k",
    "check_unicode",
    "unsupported_field",
]

#: The longest stop string accepted (characters): matching it costs time at every token.
MAX_STOP_CHARS = 256
ROLES = ("system", "developer", "user", "assistant", "tool")
#: field -> the values that mean "off"; another value is refused (this server cannot honour it)
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "suffix": ("",),
    "functions": ([],),
    "min_p": (0, 0.0),
    "use_beam_search": (False,),
    "length_penalty": (1, 1.0),
    "prompt_logprobs": (),
    "include_stop_str_in_output": (False,),
    "guided_grammar": (),
    "allowed_token_ids": (),
    "bad_words": ([],),
    # issue 56: what would change the answer unseen if ignored
    "function_call": ("none",),
    "truncate_prompt_tokens": (),
    "skip_special_tokens": (True,),
    "prediction": (),
    "audio": (),
    "modalities": (["text"],),
    "web_search_options": (),
    "structured_outputs": (),
}
UNSUPPORTED_CHAT: dict[str, tuple[Any, ...]] = {
    "echo": (False,),
    "continue_final_message": (False,),
    "add_generation_prompt": (True,),
    "chat_template": (),
}
#: the tool fields a completion cannot take (a chat can: ``ChatRequest``)
UNSUPPORTED_COMPLETION: dict[str, tuple[Any, ...]] = {"tools": ([],), "tool_choice": ("none",)}


def check_unicode(value: str, what: str) -> str:
    """``value`` when it is valid Unicode (no lone surrogate: it cannot be tokenized)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what} holds a lone surrogate (U+{ord(value[exc.start]):04X}) at character "
            f"{exc.start}, which is not Unicode text; send valid UTF-8"
        ) from None
    return value


def check_temperature(value: Any) -> float:
    """OpenAI's range [0, 2], without the sliver above 0 that sampling refuses
    (``TEMPERATURE_RANGE``: logits / temperature would overflow)."""
    t = check_float(value, name="temperature", low=0.0, high=2.0)
    if 0 < t < TEMPERATURE_RANGE[0]:
        raise ConfigError(
            f"temperature must be 0 (greedy) or in [{TEMPERATURE_RANGE[0]:g}, 2], got {t}"
        )
    return t


def check_top_k(value: Any) -> int | None:
    """vLLM's ``top_k``: -1 or 0 keep every token."""
    k = check_int(value, name="top_k (-1 or 0: all tokens)", low=-1)
    return None if k <= 0 else k


def check_model(value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError("model must be a string")
    return value


def check_stop(stop: Any) -> tuple[str, ...]:
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or any(not isinstance(s, str) or not s for s in items):
        raise ConfigError("stop must be a non-empty string or a list of non-empty strings")
    if len(items) > 4:
        raise ConfigError(f"stop holds {len(items)} strings; at most 4 are allowed")
    for s in items:
        if len(s) > MAX_STOP_CHARS:
            raise ConfigError(
                f"a stop string has {len(s)} characters; at most {MAX_STOP_CHARS} are allowed"
            )
        check_unicode(s, "a stop string")
    return tuple(items)


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's: the usage so far on every chunk."""


def check_stream_options(value: Any) -> StreamOptions | None:
    if not value:
        return None
    if not isinstance(value, dict):
        raise ConfigError("stream_options must be an object")
    return StreamOptions(
        include_usage=bool(value.get("include_usage", False)),
        continuous_usage_stats=bool(value.get("continuous_usage_stats", False)),
    )


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _token_ids(ids: list[Any], where: str) -> tuple[int, ...]:
    """Token ids: integers (a float only when it is one, as JSON may spell ``5.0``)."""
    out = []
    for k, x in enumerate(ids):
        if isinstance(x, float):
            if not x.is_integer():
                raise ConfigError(f"{where}[{k}] is {x}; token ids are integers")
            x = int(x)
        out.append(x)
    return tuple(out)


_PROMPT = "prompt must be a non-empty string or a list of token ids, or a list of those"


def check_prompts(p: Any) -> tuple[str | tuple[int, ...], ...]:
    """One prompt (a string, a list of token ids) or a batch (a list of those)."""
    if isinstance(p, str) and p:
        return (check_unicode(p, "prompt"),)
    if isinstance(p, list) and p and all(_is_number(i) for i in p):
        return (_token_ids(p, "prompt"),)
    if not (isinstance(p, list) and p and all(isinstance(i, str | list) for i in p)):
        raise ConfigError(_PROMPT)
    out: list[str | tuple[int, ...]] = []
    for k, item in enumerate(p):
        if isinstance(item, str) and item:
            out.append(check_unicode(item, f"prompt[{k}]"))
        elif isinstance(item, list) and item and all(_is_number(i) for i in item):
            out.append(_token_ids(item, f"prompt[{k}]"))
        else:
            raise ConfigError(f"prompt[{k}] must be a non-empty string or a list of token ids")
    return tuple(out)


def _content(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return check_unicode(content, f"messages[{index}].content")
    if isinstance(content, list):  # parts: only text is understood
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ConfigError(
                    f"messages[{index}]: content part {kind!r} is not supported; send text"
                )
            text = part.get("text", "")
            if not isinstance(text, str):
                raise ConfigError(f"messages[{index}]: a text part's text must be a string")
            texts.append(check_unicode(text, f"messages[{index}].content"))
        return "\n".join(texts)
    raise ConfigError(f"messages[{index}].content must be a string or a list of text parts")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise ConfigError("messages must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise ConfigError(f"messages[{i}].role {role!r} is not one of {', '.join(ROLES)}")
        out.append({**m, "content": _content(m, i)})
    return out


def check_response_format(value: Any) -> GrammarSpec | None:
    """OpenAI's ``response_format``: ``text`` (none), ``json_object``, or ``json_schema`` with
    its ``json_schema.schema``."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec.json_object()
    if kind == "json_schema":
        inner = value.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict | bool):
            raise ConfigError(
                "response_format json_schema needs json_schema.schema: the JSON schema (an "
                'object) the output must follow, e.g. {"type": "json_schema", "json_schema": '
                '{"name": "x", "schema": {"type": "object"}}}'
            )
        return GrammarSpec.json_schema(schema)
    raise ConfigError(
        f"response_format must be an object whose type is text, json_object or json_schema, "
        f"got {value!r:.100}"
    )


def check_guided_json(value: Any) -> GrammarSpec:
    if isinstance(value, str):
        return GrammarSpec.json_schema(check_unicode(value, "guided_json"))
    if not isinstance(value, dict | bool):
        raise ConfigError("guided_json must be a JSON schema (an object, or its JSON text)")
    return GrammarSpec.json_schema(value)


def check_guided_regex(value: Any) -> GrammarSpec:
    if not isinstance(value, str) or not value:
        raise ConfigError("guided_regex must be a non-empty string (a regular expression)")
    return GrammarSpec.regex(check_unicode(value, "guided_regex"))


def check_guided_choice(value: Any) -> GrammarSpec:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ConfigError("guided_choice must be a non-empty list of strings")
    return GrammarSpec.choice(
        [check_unicode(c, f"guided_choice[{i}]") for i, c in enumerate(value)]
    )


def check_completion_logprobs(value: Any) -> int | None:
    if value is False:  # some clients send false for "none"
        return None
    return check_int(value, name="logprobs", low=0, high=LOGPROBS_MAX)


def unsupported_field(body: dict[str, Any], *, chat: bool) -> str | None:
    """The first field of ``body`` that this server cannot honour (``UNSUPPORTED``: set, and
    to none of the values that mean "off"), or None."""
    table = {**UNSUPPORTED, **(UNSUPPORTED_CHAT if chat else UNSUPPORTED_COMPLETION)}
    for name, off in table.items():
        value = body.get(name)
        if value is not None and not any(value == o and type(value) is type(o) for o in off):
            return name
    return None
