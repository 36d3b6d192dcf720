"""Per-request logits processing before sampling, and the logprobs of what was sampled.

What a request's :class:`~.sampling.SamplingConfig` asks of its logits, with vLLM's definitions
and in vLLM's order (``vllm/v1/sample/sampler.py``):

1. ``min_tokens``: end-of-text ids and ``stop_token_ids`` get -inf until that many tokens are out;
2. ``logit_bias``: added to the logits of its tokens;
3. ``repetition_penalty`` p over the prompt and the output: a seen token's logit x becomes x / p
   when x > 0, else x * p (HF ``RepetitionPenaltyLogitsProcessor``, bit for bit; vLLM multiplies
   by 1 / p, which can differ in the last bit);
4. ``frequency_penalty`` f and ``presence_penalty`` r over the output only (OpenAI): x becomes
   (x - f * count) - r for every token the output holds.

How the core calls it, per step (``x`` is a float32 copy of the step's logits, every rank alike)::

    rows[i] = RowLogits(cfg, prompt, vocab_size=V, eos_ids=tok.eos_ids)   # on join (n > 1: fork)
    logits = decode(...)                                # [B, V], the model's output dtype
    x = logits.float()                                  # float32 (a copy where already float32)
    grammar.apply_bitmask_(x, bitmask, grammar_rows)    # -inf outside each row's grammar
    lp = log_probs(x, asking)                           # rows with cfg.logprobs set: see below
    process_rows_(x, rows)                              # 1-4 above, in place, rows that need it
    token = sample(x[i : i + 1], cfg, gen)              # per row: temperature, top-k/p, argmax
    out = gather_logprobs(lp, tokens, ks)               # the chosen token's logprob, the top k
    rows[i].update(token)                               # O(1)

**Which logits the logprobs come from**: vLLM's default (``logprobs_mode="raw_logprobs"``), the
log-softmax of the model's logits promoted to float32, taken after the grammar mask (a token the
grammar forbids has no logprob, as in vLLM, which masks before its sampler) and before
everything this module does and before temperature, top-k and top-p. Without a grammar they are
HF transformers' ``log_softmax`` of the same logits: what the model thinks of the token, not what
the sampling settings made of it. OpenAI documents nothing more precise.

:func:`process` is the same definition in one call (a new tensor from the prompt and output
ids), for a one-off row and as the reference the incremental state is tested against.

**Cost**: a row's state is the ids its penalties touch (the prompt's and output's distinct ids,
the output's counts), kept incrementally: :meth:`RowLogits.update` is O(1) amortised and
:meth:`RowLogits.apply_` touches only those ids, so a step costs O(distinct ids) per row, never
O(length) or a pass over the vocabulary. Rows without such settings cost nothing.

**Determinism**: each function depends only on its arguments, in a fixed order of float32
operations: every rank computes the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.sampling import SamplingConfig

__all__ = [
    "RowLogits",
    "TokenLogprobs",
    "gather_logprobs",
    "log_probs",
    "process",
    "process_rows_",
]

_NEG_INF = float("-inf")


class _IdSet:
    """Distinct token ids in first-seen order, as a growing int64 tensor, with a count each."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self._pos: dict[int, int] = {}
        self._ids = torch.empty(max(capacity, 16), dtype=torch.long, device=device)
        self._counts = torch.zeros(self._ids.shape[0], dtype=torch.float32, device=device)

    def add(self, token: int) -> None:
        pos = self._pos.get(token)
        if pos is None:
            pos = self._pos[token] = len(self._pos)
            if pos == self._ids.shape[0]:  # full: double (amortised O(1) per token)
                self._ids = torch.cat([self._ids, torch.empty_like(self._ids)])
                self._counts = torch.cat([self._counts, torch.zeros_like(self._counts)])
            self._ids[pos] = token
        self._counts[pos] += 1.0

    @property
    def ids(self) -> Tensor:
        return self._ids[: len(self._pos)]

    @property
    def counts(self) -> Tensor:
        return self._counts[: len(self._pos)]

    def copy(self) -> _IdSet:
        new = _IdSet.__new__(_IdSet)
        new._pos, new._ids, new._counts = dict(self._pos), self._ids.clone(), self._counts.clone()
        return new


class RowLogits:
    """What one request's sampling settings do to its logits, with the state they need."""

    def __init__(
        self,
        cfg: SamplingConfig,
        prompt: Sequence[int],
        *,
        vocab_size: int,
        eos_ids: Sequence[int] = (),
        device: torch.device | str = "cpu",
    ) -> None:
        """``prompt``: the request's prompt ids (the repetition penalty counts them);
        ``eos_ids``: the model's end-of-text ids (``min_tokens`` holds them back)."""
        cfg.check_for(vocab_size=vocab_size)
        bad = [i for i in prompt if not 0 <= i < vocab_size]
        if bad:
            raise ConfigError(
                f"the prompt holds token ids {bad[:5]} outside the vocabulary of {vocab_size}"
            )
        dev = torch.device(device)
        self.cfg, self.vocab_size, self.n_out = cfg, vocab_size, 0
        #: prompt and output ids (repetition penalty); None when the penalty is off
        self._seen: _IdSet | None = None
        if cfg.repetition_penalty != 1.0:
            self._seen = _IdSet(len(prompt) + 64, dev)
            for t in prompt:
                self._seen.add(t)
        #: output ids and their counts (frequency and presence penalties)
        self._out: _IdSet | None = None
        if cfg.frequency_penalty or cfg.presence_penalty:
            self._out = _IdSet(64, dev)
        ids = [i for i, _ in cfg.logit_bias]
        self._bias_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        self._bias = torch.tensor([b for _, b in cfg.logit_bias], dtype=torch.float32, device=dev)
        held = [i for i in dict.fromkeys((*eos_ids, *cfg.stop_token_ids)) if 0 <= i < vocab_size]
        self._held = torch.tensor(held, dtype=torch.long, device=dev)

    @property
    def active(self) -> bool:
        """Whether :meth:`apply_` changes anything at this step."""
        cfg = self.cfg
        return bool(
            self._seen is not None or self._out is not None or cfg.logit_bias or self.holding
        )

    @property
    def holding(self) -> bool:
        """Whether ``min_tokens`` holds back the end ids at this step."""
        return bool(self.n_out < self.cfg.min_tokens and self._held.numel())

    @property
    def held(self) -> Tensor:
        """The ids ``min_tokens`` holds back (the request's end ids), int64 [H]."""
        return self._held

    def apply_(self, row: Tensor, *, hold: bool = True) -> None:
        """Apply the settings to one row of float32 logits [V], in place. ``hold=False``:
        ``min_tokens`` does not hold back the end ids at this step (a grammar that allows
        nothing else: its end wins, see :mod:`.sampler`)."""
        cfg = self.cfg
        if hold and self.holding:
            row.index_fill_(0, self._held, _NEG_INF)
        if cfg.logit_bias:
            row.index_add_(0, self._bias_ids, self._bias)  # ids are distinct: one add each
        if self._seen is not None:
            ids, p = self._seen.ids, cfg.repetition_penalty
            x = row.index_select(0, ids)
            row.index_copy_(0, ids, torch.where(x > 0, x / p, x * p))
        if self._out is not None:
            ids = self._out.ids
            x = row.index_select(0, ids)
            if cfg.frequency_penalty:
                x = x - cfg.frequency_penalty * self._out.counts
            if cfg.presence_penalty:
                x = x - cfg.presence_penalty
            row.index_copy_(0, ids, x)

    def update(self, token: int) -> None:
        """Count the token just sampled (call once per output token, in order)."""
        self.n_out += 1
        if self._seen is not None:
            self._seen.add(token)
        if self._out is not None:
            self._out.add(token)

    def fork(self) -> RowLogits:
        """An independent copy (another choice of the same request: ``n`` > 1)."""
        new = RowLogits.__new__(RowLogits)
        new.__dict__.update(self.__dict__)
        new._seen = self._seen.copy() if self._seen is not None else None
        new._out = self._out.copy() if self._out is not None else None
        return new


def process(
    logits: Tensor,
    cfg: SamplingConfig,
    *,
    prompt: Sequence[int],
    output: Sequence[int],
    eos_ids: Sequence[int] = (),
) -> Tensor:
    """The settings applied to one row of float32 ``logits`` [V] after ``output``, as a new
    tensor: the whole definition in one call, O(length) (the core keeps a :class:`RowLogits`
    instead, which gives the same bits at O(1) a token)."""
    row = RowLogits(cfg, prompt, vocab_size=logits.shape[-1], eos_ids=eos_ids, device=logits.device)
    for token in output:
        row.update(token)
    out = logits.float().clone()
    row.apply_(out)
    return out


def process_rows_(logits: Tensor, rows: Sequence[RowLogits | None]) -> None:
    """Apply each row's settings to its row of float32 ``logits`` [B, V], in place (row ``i``
    of ``logits`` belongs to ``rows[i]``; None: a request without such settings)."""
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.shape[0] != len(rows):
        raise ValueError(
            f"process_rows_ takes float32 logits [B, V] with one state per row, got "
            f"{logits.dtype} {tuple(logits.shape)} for {len(rows)} rows"
        )
    for i, row in enumerate(rows):
        if row is not None and row.active:
            row.apply_(logits[i])


@dataclass(frozen=True)
class TokenLogprobs:
    """The logprob of one sampled token and of the most likely tokens at its step."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    """Up to k (token id, logprob), most likely first; tokens the grammar forbids are left
    out (their logprob is -inf, which JSON cannot carry)."""


def log_probs(logits: Tensor, rows: Sequence[int]) -> Tensor:
    """Log-softmax over the vocabulary of ``logits[rows]`` (float32 [B, V]) -> [len(rows), V]."""
    idx = torch.tensor(list(rows), dtype=torch.long, device=logits.device)
    return logits.index_select(0, idx).float().log_softmax(dim=-1)  # no list indexing (sampler)


def gather_logprobs(
    logprobs: Tensor, tokens: Sequence[int], ks: Sequence[int]
) -> list[TokenLogprobs]:
    """Row ``i`` of ``logprobs`` [N, V]: the logprob of ``tokens[i]`` and the ``ks[i]`` most
    likely tokens. One top-k over the rows (the largest k), one transfer to Python."""
    n = logprobs.shape[0]
    if not len(tokens) == len(ks) == n:
        raise ValueError(f"{n} rows of logprobs, {len(tokens)} tokens, {len(ks)} counts")
    if n == 0:
        return []
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0]
    k = min(max(ks), logprobs.shape[1])
    values: list[list[float]] = [[] for _ in range(n)]
    ids: list[list[int]] = [[] for _ in range(n)]
    if k:
        top_values, top_ids = logprobs.topk(k, dim=-1, sorted=True)  # [N, k]
        values, ids = top_values.tolist(), top_ids.tolist()
    out = []
    for i, (token, logprob) in enumerate(zip(tokens, chosen.tolist())):
        top = zip(ids[i][: ks[i]], values[i][: ks[i]])
        out.append(
            TokenLogprobs(int(token), logprob, tuple((t, v) for t, v in top if v != _NEG_INF))
        )
    return out
