"""vLLM's ``/tokenize`` and ``/detokenize`` (rank 0's HTTP layer; the ranks never see them).

    tokenize(body, model)     # {"count", "max_model_len", "tokens", "token_strs"}
    detokenize(body, model)   # {"prompt"}

``/tokenize`` takes a ``prompt`` (``add_special_tokens``, default true) or chat ``messages``
rendered as ``/v1/chat/completions`` renders them (``tools``, ``chat_template_kwargs``,
``add_generation_prompt`` default true; ``add_special_tokens`` default false: the template
writes its own); ``return_token_strs`` adds each token's text. ``/detokenize`` takes
``tokens``. A bad field is a 400 naming it.
"""

from __future__ import annotations

from typing import Any, cast

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.prepare import ServedModel
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.request_fields import check_unicode
from torch_tensorrt_dist.serving.schema import ChatRequest, parse_request
from torch_tensorrt_dist.serving.tool_fields import template_messages
from torch_tensorrt_dist.validation import check_bool

__all__ = ["detokenize", "tokenize"]

_CHAT_FIELDS = ("messages", "tools", "chat_template_kwargs")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    try:
        return check_bool(value, name=name)
    except ConfigError as exc:
        raise RequestError(400, str(exc), param=name) from None


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def _encode(text: str, model: ServedModel, special: bool, param: str) -> list[int]:
    try:
        return model.tokenizer.encode(text, add_special_tokens=special)
    except ConfigError as exc:
        raise RequestError(400, str(exc), param=param) from exc


def _chat_text(body: dict[str, Any], model: ServedModel) -> str:
    if model.chat is None:
        raise RequestError(
            400, f"model {model.name!r} has no chat template; send a prompt", param="messages"
        )
    fields = {k: body[k] for k in _CHAT_FIELDS if k in body}
    req = cast(ChatRequest, parse_request(fields, chat=True))
    try:
        return model.chat.render(
            template_messages(req.messages),
            add_generation_prompt=_flag(body, "add_generation_prompt", True),
            tools=req.tools or None,
            variables=req.chat_template_kwargs,
        )
    except Exception as exc:  # the template's own error on these messages
        raise RequestError(
            400, f"the chat template failed on these messages: {exc}", param="messages"
        ) from exc


def tokenize(body: Any, model: ServedModel) -> dict[str, Any]:
    body = _body(body)
    if "messages" in body:
        text = _chat_text(body, model)
        ids = _encode(text, model, _flag(body, "add_special_tokens", False), "messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise RequestError(400, "give prompt (a string) or messages", param="prompt")
        try:
            check_unicode(prompt, "prompt")
        except ConfigError as exc:
            raise RequestError(400, str(exc), param="prompt") from None
        ids = _encode(prompt, model, _flag(body, "add_special_tokens", True), "prompt")
    strs = None
    if _flag(body, "return_token_strs", False):
        strs = [model.tokenizer.token_text(i) for i in ids]
    return {
        "count": len(ids),
        "max_model_len": model.cache_len,
        "tokens": ids,
        "token_strs": strs,
    }


def detokenize(body: Any, model: ServedModel) -> dict[str, Any]:
    tokens = _body(body).get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise RequestError(400, "tokens must be a list of token ids", param="tokens")
    bad = [t for t in tokens if not 0 <= t < model.vocab_size]
    if bad:
        raise RequestError(
            400, f"tokens holds ids {bad[:4]} outside [0, {model.vocab_size})", param="tokens"
        )
    return {"prompt": model.tokenizer.decode(tokens)}
