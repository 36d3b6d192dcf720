"""Per-request isolation: what one request's failure in the step loop tells its client (pure).

The generation core fails a request alone when its grammar, its logits settings, its sampling
or its text raises (``GenerationCore.isolate``: the request emits ``finish="error"`` with a
:class:`RowError`, the same on every rank); the leader answers it with :func:`row_failure` and
cancels the submission's sequences on every rank at the next step (a no-op where the core has
freed them already), and every other request goes on.

    failed = row_failure(error, sampling=sub.sampling, stop=sub.stop, grammar=sub.grammar_param)
"""

from __future__ import annotations

from torch_tensorrt_dist.generation.core import RowError
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.serving.bridge import Failed

__all__ = ["row_failure"]


def row_failure(
    error: RowError,
    *,
    sampling: SamplingConfig,
    stop: tuple[str, ...],
    grammar: str | None = None,
) -> Failed:
    """The HTTP answer to a request the core failed: its grammar (400, naming the field it
    came from, ``grammar``: ``response_format`` or ``guided_*``), its logits settings (400,
    naming the first one set), every token masked (400, naming the grammar's field or
    ``min_tokens``; 500 when nothing of the request masks: the model's logits were not finite),
    its sampling (400, naming ``top_p`` or ``temperature``), the
    text its stop strings are matched on (400, ``stop``), or the text shown (500: the model's
    tokens, not the request, could not be decoded)."""
    if error.stage in ("join", "grammar"):
        what = "compiling" if error.stage == "join" else "following"
        return Failed(
            400, f"{what} the grammar failed ({error.message}); change {grammar}", grammar
        )
    if error.stage == "processing":
        param = next((f for f in _PROCESSING if _is_set(sampling, f)), "logit_bias")
        return Failed(
            400, f"applying the sampling settings failed ({error.message}); change {param}", param
        )
    if error.stage == "masked":
        return _masked(error, sampling, grammar)
    if error.stage == "sampling":
        param = "top_p" if sampling.top_p is not None else "temperature"
        return Failed(
            400,
            f"sampling failed for temperature={sampling.temperature:g}, top_p="
            f"{1.0 if sampling.top_p is None else sampling.top_p:g} ({error.message}); "
            f"change {param}",
            param,
        )
    if stop:
        return Failed(
            400,
            f"matching the stop strings on the generated text failed ({error.message}); "
            "change stop",
            "stop",
        )
    return Failed(500, f"decoding the generated tokens to text failed ({error.message})")


def _masked(error: RowError, sampling: SamplingConfig, grammar: str | None) -> Failed:
    """No token was left to draw: what of the request masks, or the model's logits."""
    param = grammar or ("min_tokens" if sampling.min_tokens else None)
    if param is None:
        return Failed(500, f"sampling found no token to draw ({error.message})")
    return Failed(400, f"sampling found no token to draw ({error.message}); change {param}", param)


#: the settings of ``logits_process``, in the order they apply
_PROCESSING = (
    "min_tokens",
    "logit_bias",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)


def _is_set(sampling: SamplingConfig, name: str) -> bool:
    value = getattr(sampling, name)
    return bool(value != 1.0 if name == "repetition_penalty" else value)
