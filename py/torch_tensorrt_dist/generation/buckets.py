"""Prefill lengths: prompts are left-padded to a bucket so a new length rarely recompiles."""

from __future__ import annotations

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["MIN_BUCKET", "check_lengths", "prefill_bucket"]

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
