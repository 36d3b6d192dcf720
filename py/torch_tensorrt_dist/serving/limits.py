"""How large a request may be, decided from the model before any work is done (pure).

    limits = request_limits(tokenizer, cache_len=256)     # body bytes, prompt characters...
    check_prompt_size(params, limits)                     # RequestError(400) before tokenizing
    max_new = check_fit(len(ids), params, cache_len=256)  # after: names prompt or max_tokens

A prompt must fit the KV cache: at most ``cache_len - 1`` tokens. No token's text is longer
than the longest entry of the tokenizer's vocabulary (its pieces spell their text with at least
as many characters: byte-level BPE writes a byte as a character, SentencePiece a space as
``▁``, a byte-fallback piece six), so a prompt longer than ``cache_len`` times that, doubled
for normalizers that merge characters (NFC/NFKC), cannot fit, and is refused before the
tokenizer sees it. The body limit follows: every character of such a prompt escaped in JSON
(``\\uXXXX``, 6 bytes), plus 1 MiB for the rest of the request. A chat has at most
``cache_len`` messages (every template spends a token on a message's role). Stop strings are
bounded too (``MAX_STOP_CHARS``, checked in ``schema.py``): each costs time on every rank at
every token of its request. A list of prompts is checked prompt by prompt (each is one request
of the step loop, and counts in ``--max-queue``).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.schema import MAX_STOP_CHARS, ChatRequest, Params

__all__ = [
    "MAX_STOP_CHARS",
    "RequestLimits",
    "check_fit",
    "check_prompt_size",
    "longest_token_chars",
    "prompt_chars",
    "request_limits",
]

_SLACK_BYTES = 1 << 20


@dataclass(frozen=True)
class RequestLimits:
    """The largest request a server takes: body bytes, prompt characters, chat messages."""

    body_bytes: int
    prompt_chars: int
    messages: int
    cache_len: int


def longest_token_chars(tokenizer: Tokenizer) -> int:
    """The most characters one token's text can take: the longest piece of the vocabulary
    (``tokenizers`` tokenizers), else 4 (the byte tokenizer: one byte, at most one character)."""
    inner = getattr(tokenizer, "_tok", None)
    vocab = inner.get_vocab(with_added_tokens=True) if inner is not None else None
    if not vocab:
        return 4
    return max(1, max(len(piece) for piece in vocab))


def request_limits(tokenizer: Tokenizer, *, cache_len: int) -> RequestLimits:
    """The limits of a server whose requests hold at most ``cache_len`` tokens."""
    chars = 2 * cache_len * longest_token_chars(tokenizer)
    return RequestLimits(
        body_bytes=6 * chars + _SLACK_BYTES,
        prompt_chars=chars,
        messages=cache_len,
        cache_len=cache_len,
    )


def prompt_chars(params: Params) -> int:
    """The characters of a request's prompts (a list of token ids counts its ids; a chat, its
    messages' content)."""
    if isinstance(params, ChatRequest):
        return sum(len(m["content"]) for m in params.messages)
    return sum(len(prompt) for prompt in params.prompts)


def check_prompt_size(params: Params, limits: RequestLimits) -> None:
    """RequestError(400) for a prompt that cannot fit the KV cache, told from its size alone
    (before the chat template and the tokenizer run)."""
    fits = f"a prompt that fits the KV cache ({limits.cache_len} tokens) has at most"
    if isinstance(params, ChatRequest):
        if len(params.messages) > limits.messages:
            raise RequestError(
                400,
                f"messages holds {len(params.messages)} messages; {fits} {limits.messages}",
                param="messages",
            )
        chars = prompt_chars(params)
        if chars > limits.prompt_chars:
            raise RequestError(
                400,
                f"the messages' content has {chars} characters; {fits} "
                f"{limits.prompt_chars}: shorten them",
                param="messages",
            )
        return
    for k, prompt in enumerate(params.prompts):
        what = "prompt" if len(params.prompts) == 1 else f"prompt[{k}]"
        if isinstance(prompt, str) and len(prompt) > limits.prompt_chars:
            raise RequestError(
                400,
                f"{what} has {len(prompt)} characters; {fits} {limits.prompt_chars}: shorten it",
                param="prompt",
            )
        if isinstance(prompt, tuple) and len(prompt) >= limits.cache_len:
            raise RequestError(
                400,
                f"{what} has {len(prompt)} token ids; the KV cache holds {limits.cache_len} "
                "tokens per request (prompt and completion): shorten it",
                param="prompt",
            )


def check_fit(prompt_tokens: int, params: Params, *, cache_len: int) -> int:
    """The tokens to generate for a prompt of ``prompt_tokens`` tokens: ``max_tokens``, or
    (unset: chat) what the longest request served leaves; RequestError(400) naming the field
    that does not fit."""
    what = "messages" if params.chat else "prompt"
    if prompt_tokens >= cache_len:
        raise RequestError(
            400,
            f"the prompt has {prompt_tokens} tokens; a request holds at most {cache_len} tokens "
            "(prompt and completion, the server's --max-seq-len): shorten it",
            param=what,
        )
    max_new = params.max_new
    if max_new is None:
        return cache_len - prompt_tokens
    if prompt_tokens + max_new > cache_len:
        name = params.max_tokens_param
        raise RequestError(
            400,
            f"{name} {max_new} + the prompt's {prompt_tokens} tokens = "
            f"{prompt_tokens + max_new} exceeds the longest request served, "
            f"{cache_len} tokens; use {name} <= {cache_len - prompt_tokens}",
            param=name,
        )
    return max_new
