"""A step's sampling: the next token of every row that reached the end of its tokens, from the
step's logits, its request's settings, its grammar and its own seeded generator.

    state = RowSampling(request, grammars)          # on join, on every rank (survives preemption)
    masks = StepMasks.start(grammars, states, dev)  # before the step's graph is launched
    logits = step_fn(...)                           # [N, V], the rows that sample
    picks = sample_step(logits, states, *masks.wait(), masks.forbid)  # Pick or Failure
    finished = state.accept(pick.token)             # grammar and penalty state; True: complete

Two paths, chosen per row:

- **plain** rows (no grammar, no logits processing, no logprobs) sample from the logits as
  they are, all at once (``sampling.sample_each``: one argmax for the greedy rows, one
  batched draw for the sampled ones, each from its own generator, the token ``sample()``
  gives the row alone; top-k and top-p rows ``sample()`` one by one);
- **processed** rows take a float32 copy of their logits (the model's output dtype promoted)
  and, in vLLM's order: the grammar's mask (-inf outside it, applied here, outside the
  compiled graph, so every engine gets it), the logprobs (``logits_process.log_probs``: the
  raw model logprobs after the mask), the settings of ``logits_process`` (``min_tokens``,
  ``logit_bias``, repetition, frequency and presence penalties), then temperature, top-k,
  top-p and the draw (``sample_each`` as for plain rows).

A step with processed rows copies every row to float32 (float32, bfloat16 and float16
logits: exact) and draws them all in one ``sample_each``, plain rows included (their copy
holds their logits unchanged, so they draw what they draw alone); CPU logits take the masks
in the op that copies them: the C++ op ``ops/cpu_bitmask.masked_float`` over the grammar rows
of a bitmask reused step after step (``grammar_masks.step_bitmask``), or, until that op is
loaded (or where it cannot be built), one add of :attr:`StepMasks.forbid`; the same values.

Every value here is a function of the row's logits and its own state, never of other rows: a
request samples the same tokens alone or batched, and on every rank (same logits, same state
created from the same request, same generator). A row's exception is returned as a
:class:`Failure` naming the stage (``sampling``, ``processing``, ``grammar``, ``masked``: no
token left to draw, :class:`NoTokenLeft`): the core fails that request alone.

The grammar masks depend only on the tokens so far, so on an accelerator they are computed
while the graph runs (:class:`StepMasks`: llguidance, without the interpreter lock, after the
graph's launch has returned).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.grammar import (
    GrammarError,
    Grammars,
    Matcher,
    allows_other,
    apply_bitmask_,
    id_bits,
    new_bitmask,
)
from torch_tensorrt_dist.generation.grammar_masks import forbidden, step_bitmask
from torch_tensorrt_dist.generation.logits_process import (
    RowLogits,
    TokenLogprobs,
    gather_logprobs,
    log_probs,
)
from torch_tensorrt_dist.generation.plan import Request
from torch_tensorrt_dist.generation.sampling import (
    SamplingConfig,
    make_generator,
    sample,
    sample_each,
)
from torch_tensorrt_dist.ops import cpu_bitmask

__all__ = ["Failure", "NoTokenLeft", "Pick", "RowSampling", "StepMasks", "sample_step"]

#: logits dtypes whose float32 copy is exact (plain rows then draw from the copy alike)
_EXACT = (torch.float32, torch.bfloat16, torch.float16)
#: the logprob JSON shows for a token the model gives no chance (-inf is not JSON): vLLM's
LOGPROB_FLOOR = -9999.0


class RowSampling:
    """One request's sampling state on one rank: its generator, its logits settings' state and
    its grammar matcher, created alike on every rank when it joins, advanced by each token."""

    def __init__(self, req: Request, grammars: Grammars | None) -> None:
        """GrammarError (a ConfigError) when the request's grammar does not compile."""
        self.cfg, self.prompt, self.end_ids = req.sampling, req.prompt, req.stop_ids
        self.gen = make_generator(req.sampling)
        self.matcher: Matcher | None = None
        if req.grammar is not None:
            if grammars is None:
                raise ConfigError(
                    "structured output is not available here: the grammar engine was not "
                    "built for this model's tokenizer"
                )
            self.matcher = grammars.compile(req.grammar)
        #: the settings' state (penalty counts), built at the first sampling (the logits give
        #: the vocabulary); None where no setting changes the logits
        self.logits: RowLogits | None = None
        self._held_bits: Tensor | None = None  # the held ids as a bitmask row (``holds``)
        cfg = self.cfg
        self.shaping = cfg.shapes_logits  # a property of the config: computed once here
        self.processed = bool(self.matcher is not None or self.shaping or cfg.logprobs is not None)
        """Whether the row takes the processed path (see the module docstring)."""

    def holds(self, mask_row: Tensor | None) -> bool:
        """Whether ``min_tokens`` holds back the end ids at this step: only while the grammar
        (its bitmask row ``mask_row``, None: no grammar) allows some other token. A grammar
        that allows only its end (or only ``stop_token_ids``) ends the request, as one that
        is complete does: the grammar's end wins over ``min_tokens``."""
        if self.logits is None or not self.logits.holding or mask_row is None:
            return True
        if self._held_bits is None:
            self._held_bits = id_bits(self.logits.held.tolist(), self.logits.vocab_size)
        return allows_other(mask_row, self._held_bits)

    def processing(self, vocab_size: int) -> RowLogits | None:
        if self.logits is None and self.shaping:
            # the request's end ids are what ``min_tokens`` holds back (ignore_eos: not eos)
            self.logits = RowLogits(
                self.cfg, self.prompt, vocab_size=vocab_size, eos_ids=self.end_ids
            )
        return self.logits

    def accept(self, token: int) -> bool:
        """Advance by the token sampled; True when the grammar is complete (GrammarError when
        it refuses the token or has failed)."""
        if self.logits is not None:
            self.logits.update(token)
        if self.matcher is None:
            return False
        self.matcher.accept(token)
        return self.matcher.is_finished


@dataclass(frozen=True)
class Pick:
    """A row's next token, and its logprobs when the request asked for them."""

    token: int
    logprobs: TokenLogprobs | None = None


@dataclass(frozen=True)
class Failure:
    """Why a row has no token: the stage (``sampling``, ``processing``, ``grammar``,
    ``masked``) and the exception (the same on every rank)."""

    stage: str
    error: Exception


class StepMasks:
    """The grammar masks of a step's sampling rows: :meth:`start` notes the rows before the
    step's graph is launched, :meth:`wait` computes them once the launch has returned, on
    the stepping thread. On an accelerator the graph runs meanwhile (its launch does not
    wait for it); on the CPU the graph has finished and the masks take none of its cores
    (a thread computing them while it runs only took a core from it: 2 cores, issue 56)."""

    def __init__(
        self,
        grammars: Grammars | None = None,
        rows: Sequence[tuple[Matcher, int]] = (),
        count: int = 0,
        device: torch.device | None = None,
    ) -> None:
        self._grammars, self.rows, self._count = grammars, list(rows), count
        self._cpu = device is not None and device.type == "cpu"
        self.bitmask: Tensor | None = None
        """After :meth:`wait`: the masks, int32 [N, W] (None: no grammar row); with the C++
        op on the CPU, the thread's reused bitmask (valid until its next step's wait)."""
        self.forbid: Tensor | None = None
        """After :meth:`wait`, with ``device`` CPU and the C++ op not loaded
        (``ops/cpu_bitmask``): the masks as what they add to the logits, float32 [N, V]
        (``grammar_masks.forbidden``; the step then masks with one add)."""

    @classmethod
    def start(
        cls,
        grammars: Grammars | None,
        states: Sequence[RowSampling],
        device: torch.device | None = None,
    ) -> StepMasks:
        """The masks of each row of ``states`` (the rows that sample this step, in the order
        their logits will come) that has a grammar. ``device``: the logits'."""
        rows = [(s.matcher, i) for i, s in enumerate(states) if s.matcher is not None]
        if not rows or grammars is None:
            return cls()
        return cls(grammars, rows, len(states), None if device is None else torch.device(device))

    def wait(self) -> tuple[Tensor | None, dict[int, Exception]]:
        """Compute the masks: the bitmask [N, W] (None: no grammar row), and the rows whose
        mask failed. On the CPU the rows go one by one on this thread (no thread to wake, no
        core taken from the graph's threads); else the engine's threads take them together
        and a failed batch is computed again row by row, so that only the rows that raise
        fail."""
        failed: dict[int, Exception] = {}
        grammars = self._grammars
        if grammars is None or self.bitmask is not None:
            return self.bitmask, failed
        # CPU logits: one op masks them (cpu_bitmask) over a reused bitmask, else expanded
        op = self._cpu and cpu_bitmask.ready()
        if op:
            at = [i for _, i in self.rows]
            bitmask = step_bitmask(self._count, grammars.vocab_size, at)
        else:
            bitmask = new_bitmask(self._count, grammars.vocab_size)
        self.bitmask = bitmask
        try:  # no checks of the bitmask made here (each torch attribute read is dear: cold)
            ptr, size, parallel = bitmask.data_ptr(), bitmask.shape[1] * 4, not self._cpu
            grammars.fill_rows(self.rows, ptr, self._count, size, parallel=parallel)
        except MemoryError:
            raise
        except Exception:  # which rows: each alone
            for matcher, i in self.rows:
                try:
                    grammars.fill_bitmask([(matcher, i)], bitmask)
                except MemoryError:
                    raise
                except Exception as exc:
                    failed[i] = exc
        for matcher, i in self.rows:  # the engine fails a row by its state, not by raising
            if matcher._m.is_error() and i not in failed:  # one call a row: cold after the graph
                reason = str(matcher.error)
                failed[i] = GrammarError(f"the grammar engine failed: {reason}", reason=reason)
        if self._cpu and not op:
            self.forbid = forbidden(bitmask, grammars.vocab_size)
        return bitmask, failed


def sample_step(
    logits: Tensor,
    states: Sequence[RowSampling],
    bitmask: Tensor | None = None,
    mask_failures: dict[int, Exception] | None = None,
    forbid: Tensor | None = None,
) -> list[Pick | Failure]:
    """Row ``i`` of ``logits`` [N, V] (the model's output dtype) is the next-token logits of
    ``states[i]``; row ``i`` of ``bitmask`` [N, W] its grammar's mask (rows without a grammar
    are ignored), ``forbid`` the same masks expanded (:attr:`StepMasks.forbid`; None: the
    bitmask is applied here). See the module docstring for the two paths."""
    n = logits.shape[0]
    out: list[Pick | Failure | None] = [None] * n
    special = [i for i, state in enumerate(states) if state.processed]
    if not special:  # plain rows only: greedy and sampled at once (one device sync)
        _pick(logits, states, [s.cfg for s in states], out)
        return [p for p in out if p is not None]
    rows = special
    if len(special) < n:
        if logits.dtype in _EXACT:  # every row drawn from the float32 copy, in one draw
            rows = list(range(n))
        else:  # the plain rows from the logits as they are
            _pick(logits, states, [None if s.processed else s.cfg for s in states], out)
    _sample_processed(logits, states, rows, (bitmask, forbid), mask_failures or {}, out)
    return [p for p in out if p is not None]


def _pick(
    x: Tensor,
    states: Sequence[RowSampling],
    cfgs: Sequence[SamplingConfig | None],
    out: list[Pick | Failure | None],
    rows: Sequence[int] | None = None,
) -> None:
    """Row ``k`` of ``x`` holds the logits of ``states[rows[k]]`` (``rows`` None: of
    ``states[k]``); each row with a config ``cfgs[k]`` gets its token in ``out``: the rows
    together (``sample_each``), those it leaves out one by one. A processed row without a
    finite logit fails with ``masked``."""
    tokens = sample_each(
        x, cfgs, [states[k if rows is None else rows[k]].gen for k in range(len(cfgs))]
    )
    for k, cfg in enumerate(cfgs):
        if cfg is None:
            continue
        i, token = (k if rows is None else rows[k]), tokens[k]
        if token is not None:
            out[i] = Pick(token)
        elif states[i].processed and not bool(torch.isfinite(x[k]).any()):
            # nothing to draw (argmax would give id 0, the softmax NaN)
            out[i] = Failure("masked", NoTokenLeft(_no_token(states[i])))
        else:  # top-k, top-p, or logits sample() refuses (NaN, +inf)
            out[i] = _draw(x[k : k + 1], states[i])


class NoTokenLeft(ConfigError):
    """Every token of a row was masked (-inf) or its logits were not finite."""


def _no_token(state: RowSampling) -> str:
    cfg, what = state.cfg, []
    if state.matcher is not None:
        what.append("the grammar")
    if state.logits is not None and state.logits.holding:
        what.append(f"min_tokens ({cfg.min_tokens}) holding back the end ids")
    if not what:
        return "the model's logits hold no finite value"
    return f"no token is left to sample: {' and '.join(what)} masked every token"


def _draw(logits: Tensor, state: RowSampling) -> Pick | Failure:
    """Temperature, top-k, top-p and the draw from the row's generator (greedy: argmax)."""
    try:
        return Pick(int(sample(logits, state.cfg, state.gen)[0]))
    except MemoryError:
        raise  # not the request's doing: the rank fails
    except Exception as exc:  # the same inputs raise the same on every rank
        return Failure("sampling", exc)


def _sample_processed(
    logits: Tensor,
    states: Sequence[RowSampling],
    special: list[int],
    masks: tuple[Tensor | None, Tensor | None],
    mask_failures: dict[int, Exception],
    out: list[Pick | Failure | None],
) -> None:
    """The rows ``special`` (the processed ones, or every row: plain rows are drawn as they
    are) from a float32 copy of their logits, the masks applied."""
    bitmask, forbid = masks
    vocab = logits.shape[1]
    # no list indexing on this path: its CPU kernel goes parallel even for 8 rows and waits
    # on a busy core for milliseconds (``apply_bitmask_``); every row is a slice, else one
    # index_select
    every = len(special) == logits.shape[0]
    idx = None if every else torch.tensor(special, dtype=torch.long)
    rows_of = (lambda t: t) if idx is None else (lambda t: t.index_select(0, idx.to(t.device)))
    # [M, V]: float32, a copy (never the graph's own output), the masks applied (rows without
    # a grammar allow every token): one op (CPU logits), or one add where they came expanded
    at = [k for k, i in enumerate(special) if states[i].matcher is not None]
    masked = bitmask is not None and bool(at)
    cpu_exact = logits.dtype in _EXACT and logits.device.type == "cpu"
    if masked and forbid is not None and cpu_exact:
        x = torch.add(rows_of(logits), rows_of(forbid))  # bf16 + float32: float32, exact
    elif bitmask is not None and at and every and cpu_exact and cpu_bitmask.ready():
        x = cpu_bitmask.masked_float(logits, bitmask, at)  # the same values, one op
    else:
        x = rows_of(logits).to(torch.float32, copy=True)
        if masked and bitmask is not None:
            apply_bitmask_(x, rows_of(bitmask))
    asking = [k for k, i in enumerate(special) if states[i].cfg.logprobs is not None]
    lp = log_probs(x, asking) if asking else None  # raw logprobs: after the mask, before the rest
    drawing: list[int] = []
    for k, i in enumerate(special):
        state = states[i]
        if not state.processed:
            drawing.append(k)
            continue
        if i in mask_failures:
            out[i] = Failure("grammar", mask_failures[i])
            continue
        try:
            rows = state.processing(vocab) if state.shaping else None
            if rows is not None and rows.active:
                mask_row = bitmask[i] if state.matcher is not None and bitmask is not None else None
                rows.apply_(x[k], hold=state.holds(mask_row))
        except MemoryError:
            raise
        except Exception as exc:
            out[i] = Failure("processing", exc)
            continue
        drawing.append(k)
    cfgs: list[SamplingConfig | None] = [None] * len(special)
    for k in drawing:
        cfgs[k] = states[special[k]].cfg
    _pick(x, states, cfgs, out, special)
    tokens = {k: p.token for k in drawing if isinstance(p := out[special[k]], Pick)}
    if lp is None:
        return
    ok = [(j, k) for j, k in enumerate(asking) if k in tokens]
    if not ok:
        return
    gathered = gather_logprobs(
        lp[[j for j, _ in ok]],
        [tokens[k] for _, k in ok],
        [states[special[k]].cfg.logprobs or 0 for _, k in ok],
    )
    for (_, k), got in zip(ok, gathered):
        i = special[k]
        floor = max(got.logprob, LOGPROB_FLOOR)  # a -inf logprob (not JSON) as vLLM shows it
        out[i] = Pick(got.token, TokenLogprobs(got.token, floor, got.top))
