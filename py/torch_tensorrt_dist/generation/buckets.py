"""Prefill lengths: prompts are left-padded to a bucket so a new length rarely recompiles."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "MIN_BUCKET",
    "check_lengths",
    "check_request",
    "left_pad",
    "prefill_bucket",
    "slot_bucket",
    "slot_buckets",
]

MIN_BUCKET = 16


def check_lengths(prompt_len: int, max_new_tokens: int, cache_len: int) -> None:
    """Raise ConfigError when the prompt plus new tokens cannot fit the KV cache."""
    if prompt_len < 1:
        raise ConfigError("a prompt is empty; give at least one token of text")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if prompt_len >= cache_len:
        raise ConfigError(
            f"the prompt has {prompt_len} tokens, but the model's max sequence length (KV cache) "
            f"is {cache_len}; shorten the prompt"
        )
    if prompt_len + max_new_tokens > cache_len:
        raise ConfigError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) = "
            f"{prompt_len + max_new_tokens} exceeds the KV cache length {cache_len}; use "
            f"max_new_tokens <= {cache_len - prompt_len}"
        )


def prefill_bucket(prompt_len: int, max_new_tokens: int, cache_len: int) -> int:
    """Smallest power of two >= prompt_len (at least MIN_BUCKET) that leaves room to decode.

    Shorter when a power of two would not leave ``max_new_tokens`` free slots: that length then
    gets its own graph.
    """
    check_lengths(prompt_len, max_new_tokens, cache_len)
    bucket = MIN_BUCKET
    while bucket < prompt_len:
        bucket *= 2
    return min(bucket, cache_len - max_new_tokens)


def slot_bucket(prompt_len: int, cache_len: int) -> int:
    """Prefill length of a prompt written into its own slot from position 0 (right-padded).

    The smallest power of two >= prompt_len (at least MIN_BUCKET), capped at ``cache_len``:
    decode overwrites the padding slot by slot, so no room for new tokens is needed.
    """
    if not 1 <= prompt_len <= cache_len:
        raise ConfigError(f"a {prompt_len}-token prompt does not fit a KV cache of {cache_len}")
    bucket = MIN_BUCKET
    while bucket < prompt_len:
        bucket *= 2
    return min(bucket, cache_len)


def slot_buckets(cache_len: int) -> list[int]:
    """Every prefill length :func:`slot_bucket` returns for a prompt that leaves room for one
    new token (warm-up compiles one graph each; then nothing recompiles)."""
    lengths, bucket = [cache_len - 1], MIN_BUCKET
    while bucket < cache_len - 1:
        lengths.append(bucket)
        bucket *= 2
    return sorted({slot_bucket(n, cache_len) for n in lengths if n >= 1})


def check_request(
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    max_batch_size: int,
    vocab_size: int,
    cache_len: int,
) -> int:
    """Validate a batch of token-id prompts against the caches; return its prefill bucket."""
    if not prompts:
        raise ConfigError("no prompt given")
    if len(prompts) > max_batch_size:
        raise ConfigError(
            f"{len(prompts)} prompts, but the KV cache holds {max_batch_size} rows; "
            f"use max_batch_size >= {len(prompts)}"
        )
    if any(not 0 <= i < vocab_size for ids in prompts for i in ids):
        raise ConfigError(f"a prompt holds token ids outside [0, {vocab_size})")
    return max(prefill_bucket(len(p), max_new_tokens, cache_len) for p in prompts)


def left_pad(
    prompts: Sequence[Sequence[int]],
    bucket: int,
    device: torch.device | str = "cpu",
    *,
    rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded (id 0) to ``bucket``: tokens [B, bucket] and pads [B] (int64).

    With ``rows`` (>= the number of prompts), B is ``rows``: the extra rows are all padding
    (pad = bucket), so a step always fills every KV-cache row and writes the cache in place.
    """
    rows = len(prompts) if rows is None else rows
    if rows < len(prompts):
        raise ValueError(f"rows={rows} is fewer than the {len(prompts)} prompts")
    tokens = torch.zeros(rows, bucket, dtype=torch.long)
    for row, ids in enumerate(prompts):
        tokens[row, bucket - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
    pads = [bucket - len(ids) for ids in prompts] + [bucket] * (rows - len(prompts))
    pad = torch.tensor(pads, dtype=torch.long)
    return tokens.to(device), pad.to(device)
