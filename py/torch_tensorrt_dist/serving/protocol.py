"""OpenAI's completion and chat-completion bodies: errors and responses (pure).

    raise RequestError(400, "max_tokens must be ...", param="max_tokens")   # OpenAI's error body
    body = response(True, rid=..., created=..., model=..., choices=[choice(True, ...)], usage=...)

What a request may hold, and its checks, is ``schema.py``; a logprobs object's shape is
``logprobs.py``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RequestError", "choice", "chunk", "error_body", "response", "usage"]

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


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict[str, Any]:
    """OpenAI's usage object; ``cached``: prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _head(chat: bool, rid: str, created: int, model: str, stream: bool) -> dict[str, Any]:
    kind = ("chat.completion" if chat else "text_completion") + (
        ".chunk" if stream and chat else ""
    )
    return {"id": rid, "object": kind, "created": created, "model": model}


def choice(
    chat: bool,
    *,
    index: int,
    text: str,
    finish: str,
    logprobs: dict[str, Any] | None = None,
    message: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One choice of a finished, non-streamed request (``message``: a chat's message where
    it is more than its text: tool calls, reasoning)."""
    if chat:
        message = message or {"role": "assistant", "content": text}
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def response(
    chat: bool,
    *,
    rid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The body of a finished, non-streamed request."""
    return {**_head(chat, rid, created, model, False), "choices": choices, "usage": usage}


def chunk(
    chat: bool,
    *,
    rid: str,
    created: int,
    model: str,
    text: str | None,
    index: int = 0,
    finish: str | None = None,
    first: bool = False,
    logprobs: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
    delta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One server-sent event's object: choice ``index``'s new text (and its tokens' logprobs),
    or its end (``finish``), or the usage (``usage``, no choices). ``delta``: a chat delta
    other than text (tool calls, reasoning; ``text`` is then ignored)."""
    head = _head(chat, rid, created, model, True)
    if usage is not None:
        return {**head, "choices": [], "usage": usage}
    if chat:
        d: dict[str, Any] = {"role": "assistant"} if first else {}
        if delta is not None:
            d.update(delta)
        elif text is not None:
            d["content"] = text
        one: dict[str, Any] = {
            "index": index,
            "delta": d,
            "logprobs": logprobs,
            "finish_reason": finish,
        }
    else:
        one = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
    return {**head, "choices": [one]}
