"""OpenAI's completion and chat-completion formats: request checks and response bodies (pure).

    params = parse_request(body, chat=False)     # RequestError(400, ...) on a bad field
    body = response(params, rid=..., text=..., finish="stop", usage=usage(5, 7), ...)

Honoured fields: ``prompt`` (one string, or one list of token ids) / ``messages``,
``max_tokens`` (chat: also ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``,
``stop`` (up to 4 strings of at most 256 characters), ``n`` (1 only), ``stream``,
``stream_options.include_usage``, ``model``. Fields this server cannot honour are refused by
name when set to anything but their default; others (``user``, ``metadata``...) are ignored.
Text must be valid Unicode (a lone surrogate, which JSON's ``\ud800`` escapes can spell, is
refused by field). Every refusal is a :class:`RequestError` naming the field (``param``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.sampling import TEMPERATURE_RANGE, check_top_p
from torch_tensorrt_dist.validation import check_float, check_int, check_seed

__all__ = [
    "MAX_STOP_CHARS",
    "Params",
    "RequestError",
    "chunk",
    "error_body",
    "parse_request",
    "response",
    "usage",
]

#: The longest stop string accepted (characters): matching it costs time at every token.
MAX_STOP_CHARS = 256
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}
#: field -> its default; another value is refused (this server cannot honour it)
_UNSUPPORTED: dict[str, Any] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
}
_ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(Exception):
    """An HTTP error with OpenAI's error body."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class Params:
    """A checked request."""

    chat: bool
    prompt: str | list[int] | None
    messages: list[dict[str, Any]] | None
    max_tokens: int | None
    """None: chat's default, what the KV cache leaves after the prompt."""
    max_tokens_param: str
    """The field ``max_tokens`` came from (chat: ``max_completion_tokens`` too)."""
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str | None


def _bad(message: str, param: str) -> RequestError:
    return RequestError(400, message, param=param)


def _checked(name: str, check: Callable[[], Any]) -> Any:
    """A shared validator's value (``validation.py``), its ConfigError as a 400 naming the field."""
    try:
        return check()
    except ConfigError as exc:
        raise _bad(str(exc), name) from None


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    return float(_checked(name, lambda: check_float(value, name=name, low=low, high=high)))


def _int(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    return int(_checked(name, lambda: check_int(value, name=name, low=low)))


def _temperature(body: dict[str, Any]) -> float:
    """OpenAI's range [0, 2], without the sliver above 0 that sampling refuses
    (``TEMPERATURE_RANGE``: logits / temperature would overflow)."""
    t = _number(body, "temperature", 1.0, 0.0, 2.0)
    if 0 < t < TEMPERATURE_RANGE[0]:
        raise _bad(
            f"temperature must be 0 (greedy) or in [{TEMPERATURE_RANGE[0]:g}, 2], got {t}",
            "temperature",
        )
    return t


def _top_p(body: dict[str, Any]) -> float:
    value = body.get("top_p")
    return 1.0 if value is None else float(_checked("top_p", lambda: check_top_p(value)))


def _text(value: str, what: str, param: str) -> str:
    """``value`` when it is valid Unicode (no lone surrogate: it cannot be tokenized)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(
            f"{what} holds a lone surrogate (U+{ord(value[exc.start]):04X}) at character "
            f"{exc.start}, which is not Unicode text; send valid UTF-8",
            param,
        ) from None
    return value


def _seed(body: dict[str, Any]) -> int | None:
    value = body.get("seed")
    return None if value is None else int(_checked("seed", lambda: check_seed(value)))


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or any(not isinstance(s, str) or not s for s in items):
        raise _bad("stop must be a non-empty string or a list of non-empty strings", "stop")
    if len(items) > 4:
        raise _bad(f"stop holds {len(items)} strings; at most 4 are allowed", "stop")
    for s in items:
        if len(s) > MAX_STOP_CHARS:
            raise _bad(
                f"a stop string has {len(s)} characters; at most {MAX_STOP_CHARS} are allowed",
                "stop",
            )
        _text(s, "a stop string", "stop")
    return tuple(items)


def _prompt(body: dict[str, Any]) -> str | list[int]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str) and p:
        return _text(p, "prompt", "prompt")
    if isinstance(p, list) and p and all(_is_number(i) for i in p):
        return [_token_id(i, k) for k, i in enumerate(p)]
    if isinstance(p, list) and len(p) > 1 and all(isinstance(i, str | list) for i in p):
        raise _bad("one prompt per request: send a string or one list of token ids", "prompt")
    raise _bad("prompt must be a non-empty string or a list of token ids", "prompt")


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _token_id(x: int | float, index: int) -> int:
    """A token id: an integer (a float only when it is one, as JSON may spell ``5.0``)."""
    if isinstance(x, float):
        if not x.is_integer():
            raise _bad(f"prompt[{index}] is {x}; token ids are integers", "prompt")
        return int(x)
    return x


def _content(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return _text(content, f"messages[{index}].content", "messages")
    if isinstance(content, list):  # parts: only text is understood
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(
                    f"messages[{index}]: content part {kind!r} is not supported; send text",
                    "messages",
                )
            text = part.get("text", "")
            if not isinstance(text, str):
                raise _bad(f"messages[{index}]: a text part's text must be a string", "messages")
            texts.append(_text(text, f"messages[{index}].content", "messages"))
        return "\n".join(texts)
    raise _bad(f"messages[{index}].content must be a string or a list of text parts", "messages")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else None
            raise _bad(f"messages[{i}].role {role!r} is not one of {', '.join(_ROLES)}", "messages")
        out.append({**m, "content": _content(m, i)})
    return out


def parse_request(body: Any, *, chat: bool) -> Params:
    """Check a ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    for name, defaults in _UNSUPPORTED.items():
        if name in body and body[name] not in defaults:
            raise _bad(f"{name} is not supported by this server; leave it unset", name)
    if _int(body, "n", 1) not in (None, 1):
        raise _bad(f"n={body['n']}: this server returns one choice per request (n=1)", "n")
    max_tokens, max_param = _int(body, "max_tokens", 1), "max_tokens"
    if chat and max_tokens is None and body.get("max_completion_tokens") is not None:
        max_tokens, max_param = _int(body, "max_completion_tokens", 1), "max_completion_tokens"
    if not chat and max_tokens is None:
        max_tokens = 16  # OpenAI's default for completions
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise _bad("stream_options must be an object", "stream_options")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model must be a string", "model")
    return Params(
        chat=chat,
        prompt=None if chat else _prompt(body),
        messages=_messages(body) if chat else None,
        max_tokens=max_tokens,
        max_tokens_param=max_param,
        temperature=_temperature(body),
        top_p=_top_p(body),
        seed=_seed(body),
        stop=_stop(body),
        stream=stream,
        include_usage=stream and bool(options.get("include_usage", False)),
        model=model,
    )


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached``: prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _head(params: Params, rid: str, created: int, model: str, stream: bool) -> dict[str, Any]:
    kind = ("chat.completion" if params.chat else "text_completion") + (
        ".chunk" if stream and params.chat else ""
    )
    return {"id": rid, "object": kind, "created": created, "model": model}


def response(
    params: Params,
    *,
    rid: str,
    created: int,
    model: str,
    text: str,
    finish: str,
    usage: dict[str, int],
) -> dict[str, Any]:
    """The body of a finished, non-streamed request."""
    if params.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {**_head(params, rid, created, model, False), "choices": [choice], "usage": usage}


def chunk(
    params: Params,
    *,
    rid: str,
    created: int,
    model: str,
    text: str | None,
    finish: str | None = None,
    first: bool = False,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One server-sent event's object: new text, or the end (``finish``), or the usage
    (``usage``, no choices)."""
    head = _head(params, rid, created, model, True)
    if usage is not None:
        return {**head, "choices": [], "usage": usage}
    if params.chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
    return {**head, "choices": [choice]}
