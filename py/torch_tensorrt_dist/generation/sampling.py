"""Token sampling: greedy, temperature, top-k, top-p, from a seeded ``torch.Generator``; and the
per-request settings that shape the logits before it (penalties, bias, min tokens, logprobs).

Every rank holds the same logits (the LM head ends in an all-gather or is replicated) and seeds
the same generator, so every rank draws the same token without a broadcast. A
:class:`SamplingConfig` is what a rank needs to know about a request's sampling: it is immutable,
validated on construction (an error names the OpenAI field), and travels to every rank as JSON
(:meth:`SamplingConfig.to_json` / :meth:`SamplingConfig.from_json`) when the request joins.
The logits processing it describes is in :mod:`.logits_process`; the grammar of structured
output in :mod:`.grammar`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.draw import draw
from torch_tensorrt_dist.validation import check_bool, check_float, check_int, check_seed

__all__ = [
    "LOGPROBS_MAX",
    "REPETITION_RANGE",
    "TEMPERATURE_RANGE",
    "SamplingConfig",
    "check_field",
    "check_top_p",
    "make_generator",
    "sample",
    "sample_each",
    "sample_probs",
    "sample_rows",
]

TEMPERATURE_RANGE = (1e-3, 100.0)
"""Non-zero temperatures allowed: below, sampling is greedy in all but name (and logits /
temperature can overflow float32); above, the distribution is uniform noise."""
LOGPROBS_MAX = 20
"""Most alternatives per token that ``logprobs`` may ask for (OpenAI's ``top_logprobs`` limit)."""
PENALTY_RANGE = (-2.0, 2.0)
"""OpenAI's range of ``presence_penalty`` and ``frequency_penalty``."""
REPETITION_RANGE = (0.01, 100.0)
"""``repetition_penalty``'s range (vLLM and HF ask only for > 0; real use is 1 to 2): a penalty p
multiplies a logit by at most max(p, 1 / p) = 100, which keeps a finite logit finite in float32.
Below 0.01 a logit divided by p overflows (1e-300 is 0 in float32: every seen token's logit
became inf, and the sampler's softmax NaN)."""
BIAS_RANGE = (-100.0, 100.0)
"""OpenAI's range of a ``logit_bias`` value."""


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def check_top_p(value: float, *, name: str = "top_p") -> float:
    """``value`` as a top_p in (0, 1] that stays above 0 in float32, the precision sampling
    compares in (ConfigError otherwise): 1e-300 would be 0 there."""
    p = check_float(value, name=name, low=0.0, high=1.0, low_open=True)
    if _float32(p) == 0.0:
        raise ConfigError(
            f"{name} {p:g} is 0 in float32, the precision sampling runs in; give a value "
            f">= {2.0**-149:.3g} (the smallest positive float32) or leave it unset"
        )
    return p


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is picked, and what the request asks to see of it."""

    temperature: float = 0.0
    """0 means greedy (argmax); else (in ``TEMPERATURE_RANGE``) samples from
    softmax(logits / temperature)."""
    top_k: int | None = None
    """Keep only the k most likely tokens (None or 0: all)."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability reaches p (None or 1: all)."""
    seed: int = 0
    """Seed of the generator every rank creates identically."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token the output holds (OpenAI, in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time the output holds it (OpenAI, in [-2, 2])."""
    repetition_penalty: float = 1.0
    """Divides the positive logits (multiplies the negative ones) of every token in the prompt
    or the output (vLLM, HF ``generate``); 1 is off, in ``REPETITION_RANGE``."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits, sorted by id, each bias in [-100, 100]. A
    mapping (OpenAI's ``{"50256": -100}``, keys as text) is accepted and normalised."""
    min_tokens: int = 0
    """End-of-text ids and ``stop_token_ids`` are masked until this many tokens are out."""
    ignore_eos: bool = False
    """End-of-text ids do not end the request (vLLM); ``stop_token_ids`` still do."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the request besides end-of-text (vLLM); shown in ``tokens``."""
    logprobs: int | None = None
    """None: no logprobs; k in [0, ``LOGPROBS_MAX``]: the chosen token's logprob and the k most
    likely alternatives, per token (see :mod:`.logits_process` for which logits)."""

    def __post_init__(self) -> None:
        for f in fields(self):  # each value as the config holds it (an int penalty: a float)
            object.__setattr__(self, f.name, check_field(f.name, getattr(self, f.name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def shapes_logits(self) -> bool:
        """Whether any setting changes the logits before sampling (penalties, bias, min
        tokens): rows without one sample from the model's logits as they are."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.min_tokens
        )

    def end_ids(self, eos_ids: Iterable[int]) -> tuple[int, ...]:
        """The ids that end the request: end-of-text (unless ``ignore_eos``), then
        ``stop_token_ids``."""
        ids = () if self.ignore_eos else tuple(eos_ids)
        return tuple(dict.fromkeys((*ids, *self.stop_token_ids)))

    def check_for(
        self,
        *,
        vocab_size: int,
        max_new_tokens: int | None = None,
        eos_ids: Iterable[int] | None = None,
    ) -> None:
        """What a config alone cannot check: token ids within the model's vocabulary,
        ``min_tokens`` within the request's ``max_tokens`` (where given), and ``min_tokens``
        leaving a token to sample (where the model's end-of-text ``eos_ids`` are given: what
        it holds back, :meth:`end_ids`, must not be the whole vocabulary)."""
        for name, ids in (
            ("logit_bias", [i for i, _ in self.logit_bias]),
            ("stop_token_ids", list(self.stop_token_ids)),
        ):
            bad = [i for i in ids if i >= vocab_size]
            if bad:
                raise ConfigError(
                    f"{name} holds token ids {bad[:5]} outside the vocabulary of "
                    f"{vocab_size} tokens (ids 0..{vocab_size - 1})"
                )
        if max_new_tokens is not None and self.min_tokens > max_new_tokens:
            raise ConfigError(
                f"min_tokens ({self.min_tokens}) exceeds max_tokens ({max_new_tokens}); "
                f"use min_tokens <= {max_new_tokens}"
            )
        if eos_ids is not None and self.min_tokens:
            held = {i for i in self.end_ids(eos_ids) if 0 <= i < vocab_size}
            if len(held) == vocab_size:
                raise ConfigError(
                    f"min_tokens ({self.min_tokens}) holds back every token: the end-of-text "
                    f"ids and stop_token_ids together are all {vocab_size} ids of the "
                    "vocabulary, so nothing is left to sample; set min_tokens 0 or leave ids "
                    "out of stop_token_ids"
                )

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (``json.dumps`` writes floats so that they read back
        bit for bit); :meth:`from_json` rebuilds an equal config."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["logit_bias"] = [list(pair) for pair in self.logit_bias]
        out["stop_token_ids"] = list(self.stop_token_ids)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SamplingConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"sampling settings hold unknown fields {unknown}")
        kwargs = dict(data)
        if "logit_bias" in kwargs:
            kwargs["logit_bias"] = tuple(tuple(pair) for pair in kwargs["logit_bias"])
        if "stop_token_ids" in kwargs:
            kwargs["stop_token_ids"] = tuple(kwargs["stop_token_ids"])
        return cls(**kwargs)


def _temperature(t: Any) -> float:
    # NaN fails every comparison; logits / temperature must stay finite in float32
    if (
        isinstance(t, bool)
        or not isinstance(t, int | float)
        or not (t == 0 or TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1])
    ):
        low, high = TEMPERATURE_RANGE
        raise ConfigError(f"temperature must be 0 (greedy) or in [{low:g}, {high:g}], got {t}")
    return float(t)


def _penalty(name: str) -> Callable[[Any], float]:
    low, high = PENALTY_RANGE
    return lambda v: check_float(v, name=name, low=low, high=high)


def _optional(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: None if v is None else check(v)


_CHECKS: dict[str, Callable[[Any], Any]] = {
    "temperature": _temperature,
    "top_k": _optional(lambda v: check_int(v, name="top_k (0: all tokens)", low=0)),
    "top_p": _optional(check_top_p),
    "seed": check_seed,
    "presence_penalty": _penalty("presence_penalty"),
    "frequency_penalty": _penalty("frequency_penalty"),
    "repetition_penalty": lambda v: check_float(
        v, name="repetition_penalty", low=REPETITION_RANGE[0], high=REPETITION_RANGE[1]
    ),
    "logit_bias": lambda v: _logit_bias(v),
    "min_tokens": lambda v: check_int(v, name="min_tokens", low=0),
    "ignore_eos": lambda v: check_bool(v, name="ignore_eos"),
    # deduplicated, in order
    "stop_token_ids": lambda v: tuple(dict.fromkeys(_token_ids(v, name="stop_token_ids"))),
    "logprobs": _optional(lambda v: check_int(v, name="logprobs", low=0, high=LOGPROBS_MAX)),
}


def check_field(name: str, value: Any) -> Any:
    """``value`` as :class:`SamplingConfig` holds field ``name`` (normalised: an int penalty
    becomes its float, a ``logit_bias`` mapping sorted pairs); ConfigError naming the field.
    The one check of each field: the config's and the HTTP schema's (``serving/schema.py``)."""
    return _CHECKS[name](value)


def _token_ids(ids: Any, *, name: str) -> list[int]:
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise ConfigError(f"{name} must be a list of token ids, got {ids!r}")
    return [check_int(i, name=f"{name}[{n}]", low=0) for n, i in enumerate(ids)]


def _logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """``bias`` (a mapping id -> bias, ids as int or text, or (id, bias) pairs) as sorted
    (int, float) pairs; ConfigError naming the entry otherwise."""
    if isinstance(bias, Mapping):
        pairs = list(bias.items())
    elif isinstance(bias, Sequence) and not isinstance(bias, str | bytes):
        pairs = list(bias)
    else:
        raise ConfigError(
            f'logit_bias must map token ids to biases, e.g. {{"50256": -100}}, got {bias!r}'
        )
    out: dict[int, float] = {}
    low, high = BIAS_RANGE
    for pair in pairs:
        if not isinstance(pair, Sequence) or isinstance(pair, str | bytes) or len(pair) != 2:
            raise ConfigError(f"logit_bias entries must be (token id, bias) pairs, got {pair!r}")
        key, value = pair
        token = key
        if isinstance(key, str):
            token = int(key) if key.strip().isdigit() else key
        token = check_int(token, name=f"logit_bias key {key!r} (a token id)", low=0)
        if token in out:
            raise ConfigError(f"logit_bias names token {token} twice")
        out[token] = check_float(value, name=f"logit_bias[{key!r}]", low=low, high=high)
    return tuple(sorted(out.items()))


def make_generator(cfg: SamplingConfig) -> torch.Generator:
    """A CPU generator seeded with ``cfg.seed`` (CPU so every device type draws the same)."""
    return torch.Generator(device="cpu").manual_seed(cfg.seed)


def sample(logits: Tensor, cfg: SamplingConfig, generator: torch.Generator) -> Tensor:
    """Next token per row. logits: [B, V] -> [B] int64 (on logits' device).

    Every accepted setting keeps at least one token: the row's maximum is subtracted before
    dividing by the temperature (finite logits stay finite at any temperature), and top-p
    always keeps the most likely token (a top_p below float32's resolution keeps only it)."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    probs = sample_probs(logits, cfg)  # [B, V]: the rows draw one after the other
    tokens = draw(probs, [generator] * probs.shape[0])
    return torch.tensor(tokens, dtype=torch.long).to(logits.device)


#: vocabularies above which :func:`sample_each` shifts and scales a row at a time
_ROW_AT_A_TIME = 16_384


def sample_each(
    logits: Tensor,
    cfgs: Sequence[SamplingConfig | None],
    generators: Sequence[torch.Generator | None],
) -> list[int | None]:
    """Row ``i``'s token as ``sample(logits[i : i + 1], cfgs[i], generators[i])`` draws it,
    the rows together: logits: [B, V] -> B tokens. None where the row is left to
    :func:`sample`: ``cfgs[i]`` None (not drawn: its generator is not advanced), top-k or top-p
    set, or a maximum that is not finite (no finite logit, or a NaN: :func:`sample` says why).

    The same draw, batched: the probabilities of every row at once (the softmax a row at a
    time, below), then :func:`.draw.draw` (one uniform number from each row's generator).
    Each op computes row by row, so a row's token is the same alone or batched
    (``tests/test_sampling_batch.py``)."""
    top = logits.amax(dim=-1, keepdim=True)  # [B, 1], on logits' device
    finite = torch.isfinite(top).flatten().tolist()
    out: list[int | None] = [None] * len(cfgs)
    drawn = [
        (i, cfg)
        for i, cfg in enumerate(cfgs)
        if cfg is not None
        and finite[i]
        and not cfg.top_k
        and (cfg.top_p is None or cfg.top_p >= 1.0)
    ]
    if any(cfg.greedy for _, cfg in drawn):  # on the logits' device, as sample() (no copy)
        tokens = logits.argmax(dim=-1).tolist()
        for i, cfg in drawn:
            if cfg.greedy:
                out[i] = tokens[i]
    sampled = [i for i, cfg in drawn if not cfg.greedy]
    if not sampled:
        return out
    temps = [1.0] * len(cfgs)
    for i, cfg in drawn:
        if not cfg.greedy:
            temps[i] = cfg.temperature
    scores = logits.float().cpu()  # [B, V]
    scale = torch.tensor(temps, dtype=torch.float32).unsqueeze(1)
    tops, vocab = top.float().cpu(), scores.shape[1]
    # the shift and the temperature: over every row at once where rows are small (an op
    # costs 3-5 us here whatever its size), else a row at a time, in the cache from op to op
    # (8 rows of 151,936: 5.5 ms at once, 1.2 ms a row at a time); the same values either way
    shifted = (scores - tops) / scale if vocab <= _ROW_AT_A_TIME else None
    probs = torch.empty((len(sampled), vocab), dtype=torch.float32)
    for k, i in enumerate(sampled):
        # the softmax a row at a time: its CPU kernel splits rows between threads even at
        # 8 x 1,024 (grain 0) and then waits for a busy core (13 ms a call at load 11 on 2 cores)
        row = shifted[i] if shifted is not None else (scores[i] - tops[i]) / scale[i]
        torch.softmax(row, -1, out=probs[k])
    gens = [generators[i] for i in sampled]
    for i, token in zip(sampled, draw(probs, gens)):  # type: ignore[arg-type]
        out[i] = token
    return out


def sample_probs(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """What :func:`sample` draws from (a temperature > 0): [B, V] -> float32 CPU probabilities
    after temperature, top-k and top-p (speculative verification accepts by them)."""
    scores = logits.float().cpu()  # [B, V]
    scores = (scores - scores.max(dim=-1, keepdim=True).values) / cfg.temperature
    if cfg.top_k:
        k = min(cfg.top_k, scores.shape[-1])
        kth = scores.topk(k, dim=-1).values[:, -1:]  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_scores.softmax(dim=-1) >= cfg.top_p  # mass before this token >= p
        drop[:, 0] = False  # the most likely token always stays
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = scores.scatter(-1, order, sorted_scores)
    return scores.softmax(dim=-1)


def sample_rows(
    logits: Tensor, cfg: SamplingConfig, generators: Sequence[torch.Generator]
) -> Tensor:
    """Next token per row, row ``i`` drawing from ``generators[i]`` (each prompt its own, so a
    prompt samples the same tokens alone or in a batch). logits: [B, V] -> [B] int64."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    rows = [sample(logits[i : i + 1], cfg, g) for i, g in enumerate(generators)]
    return torch.cat(rows)
