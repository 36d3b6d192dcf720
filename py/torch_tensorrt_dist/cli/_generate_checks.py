"""``generate``'s checks of its options and of the request, before anything is loaded.

They run in the launching process (so ``--tp 2`` refuses in one line before any rank starts)
and again on every rank (programs started by torchrun directly). Each refusal is one
``ConfigError`` line naming the option.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.validation import check_int, check_text

__all__ = ["check_options", "check_request_fits"]


def check_options(ns: argparse.Namespace) -> None:
    """The options' own ranges: rank counts and lengths >= 1, text that encodes as UTF-8,
    sampling floats finite and in range, a 64-bit seed."""
    from torch_tensorrt_dist.generation import SamplingConfig

    if ns.tp < 1 or ns.pp < 1 or ns.ep < 1:
        raise ConfigError(f"--tp, --pp and --ep must be >= 1, got tp={ns.tp} pp={ns.pp} ep={ns.ep}")
    if ns.verify and ns.engine == "none":
        raise ConfigError("--verify checks a compiled engine; --engine none compiles nothing")
    prompts = ns.prompt or []
    for i, text in enumerate(prompts):
        check_text(text, name="--prompt" if len(prompts) == 1 else f"--prompt #{i + 1}")
    check_int(ns.max_new_tokens, name="--max-new-tokens", low=1)
    for option in ("max_seq_len", "microbatches"):
        value = getattr(ns, option, None)
        if value is not None:
            check_int(value, name=f"--{option.replace('_', '-')}", low=1)
    SamplingConfig(ns.temperature, ns.top_k, ns.top_p, ns.seed)  # temperature, top-k/p, seed


def check_request_fits(
    prompts: Sequence[Sequence[int]], *, vocab_size: int, max_seq_len: int | None, model_max: int
) -> None:
    """Token ids within the vocabulary and a cache the model's positions allow, checked on the
    tokenized prompts before the model is loaded or a prompt echoed."""
    if max_seq_len is not None and max_seq_len > model_max:
        raise ConfigError(
            f"--max-seq-len {max_seq_len} exceeds the model's {model_max} positions "
            f"(max_position_embeddings); use --max-seq-len <= {model_max}"
        )
    for i, ids in enumerate(prompts):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ConfigError(
                f"prompt #{i + 1} encodes to token id {bad[0]}, outside the model's vocabulary "
                f"[0, {vocab_size}) (config.json vocab_size): the tokenizer is not this model's"
            )
