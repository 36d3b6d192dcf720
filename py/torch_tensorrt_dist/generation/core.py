"""The generation core: sequences over a paged KV cache, one step at a time (``generate`` and
``serve`` both run it).

    core = GenerationCore(step_fn, pool=BlockPool(257, 16), max_seq_len=2048)
    sched = Scheduler(core, max_rows=8, max_prefill_tokens=512)
    sched.add(Request(rid=0, prompt=(1, 5, 7), max_new_tokens=32))
    while not sched.idle():
        for e in core.step(sched.plan()):      # Emitted: new ids (and text), finish
            ...

A sequence holds its prompt and the tokens it produced, a block table, and how many of its
tokens have their K/V in those blocks (``computed``). A step (a :class:`StepPlan`) gives each
running sequence some tokens to compute: one for a sequence that is decoding (its last token),
a chunk of its prompt for one being prefilled. Rows of one token run in one call of the step
graph, rows of more in a second call (both ``step_fn(tokens [R, S], start [R], last [R],
past [R, NBp], dest [R, S]) -> logits [R, V]``, ``Transformer.paged_step``: R, S and NBp are
the step's own, so a step costs what is live; the second call, with ``pack``, also takes
``live [N]``, its real tokens, so that padding costs no products). A row that reaches the end
of its tokens samples the next one.

Speculative decoding (``speculative/speculator.py``): a decode row the plan gives a draft of k
tokens (``StepPlan.drafts``) runs as k + 1 tokens in the step's verify call (``verify_fn``: the
logits of every token), with every other one-token row; the accepted tokens are emitted.

Everything here is a function of the plans and the logits, with a generator per request seeded
from its :class:`SamplingConfig`: ranks that apply the same plans hold the same sequences and
blocks and sample the same tokens, without communicating.

Sampling (``sampler.py``): a request's settings beyond temperature and top-p (penalties,
``logit_bias``, ``min_tokens``, logprobs) and its grammar (structured output, ``grammars``: the
engine for the model's tokenizer, built on every rank) are state of its :class:`Sequence`,
created alike on every rank on join and advanced by each token, so they survive preemption.
The grammar masks of a step's sampling rows are computed once the step's graph is launched
(on an accelerator, while it runs: ``sampler.StepMasks``). A request whose grammar is
complete ends with ``stop``.

Per-request isolation (``core.isolate = True``, a server): an exception while joining a request
(its grammar), sampling its token (its settings, its grammar) or producing the text that
decides its finish (stop strings) fails that request only: its blocks are released and it
emits ``finish="error"`` with a :class:`RowError`; the same inputs give the same exception on
every rank, so every rank drops the same request. Text that only shows (``render``, rank 0
alone) marks its request failed without dropping it: the caller must cancel it on every rank
(the server's leader does, at the next step).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.grammar import Grammars
from torch_tensorrt_dist.generation.kv_blocks import (
    BlockPool,
    blocks_for,
    check_fits,
    prefix_keys,
)
from torch_tensorrt_dist.generation.logits_process import TokenLogprobs
from torch_tensorrt_dist.generation.plan import Request, StepPlan
from torch_tensorrt_dist.generation.sampler import (
    Failure,
    Pick,
    StepMasks,
    sample_step,
)
from torch_tensorrt_dist.generation.sequence import (
    CoreError,
    Emitted,
    RowError,
    Sequence,
    render_text,
    row_error,
)
from torch_tensorrt_dist.generation.speculative import SpeculativeConfig
from torch_tensorrt_dist.generation.speculative.draft import DraftProposer
from torch_tensorrt_dist.generation.speculative.speculator import Speculator
from torch_tensorrt_dist.generation.step_inputs import StepFn, StepLimits, step_inputs
from torch_tensorrt_dist.generation.stops import StopText
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["CoreError", "Emitted", "GenerationCore", "Request", "RowError", "Sequence", "StepFn"]


class GenerationCore:
    """Running and preempted sequences over one paged KV cache and its step graph."""

    def __init__(
        self,
        step_fn: StepFn,
        *,
        pool: BlockPool,
        max_seq_len: int,
        limits: StepLimits,
        device: torch.device | str = "cpu",
        tokenizer: Tokenizer | None = None,
        text: bool = False,
        salt: bytes = b"",
        mark_dynamic: bool = True,
        pack: bool = False,
        speculative: SpeculativeConfig | None = None,
        verify_fn: StepFn | None = None,
        draft: DraftProposer | None = None,
    ) -> None:
        """``limits``: the largest rows / tokens / blocks a call may have (the step graph's
        dynamic dimensions); ``text``: produce each request's text (rank 0 of a server);
        ``salt``: the model's identity, part of every prefix-cache key; ``mark_dynamic``:
        mark the step's dynamic dimensions for Dynamo (``step_inputs``; off where the step
        is not traced by Dynamo); ``pack``: the step takes packed prefill steps (``live``,
        ``step_inputs``); ``speculative``: speculative decoding, its verify calls through
        ``verify_fn`` (the step with the logits of every token: ``paged_step(..., every=True)``),
        its proposals a ``draft`` model's where one is given (``speculative/draft.py``)."""
        if text and tokenizer is None:
            raise ConfigError("GenerationCore(text=True) needs a tokenizer")
        if speculative is not None and verify_fn is None:
            raise ConfigError("speculative decoding needs the verify step (verify_fn)")
        self.speculative = speculative
        #: proposals, the verify call and its acceptance (``speculative/speculator.py``)
        self.spec = Speculator(speculative, verify_fn, draft) if speculative and verify_fn else None
        self._step, self.pool, self.limits = step_fn, pool, limits
        self.block_size, self.max_seq_len = pool.block_size, max_seq_len
        self.device, self.tokenizer = torch.device(device), tokenizer
        self.text, self.salt = text, salt
        #: leave the text of requests without stop strings (which only shows it, and decides
        #: nothing) to :meth:`render`, so a server can announce its next step first
        self.defer_text = False
        #: called once a step, its inputs built, just before its first graph call (the
        #: server's rank 0 hands the previous step's text to HTTP there: the HTTP thread then
        #: runs while the kernels do, which release the GIL, rather than beside the host work)
        self.before_graph: Callable[[], None] | None = None
        #: per-request isolation (see the module docstring): a server sets it on every rank
        self.isolate = False
        #: the grammar engine of structured output (the same on every rank); None: requests
        #: with a grammar fail on join
        self.grammars: Grammars | None = None
        self.mark_dynamic, self.pack = mark_dynamic, pack
        self._unrendered: list[tuple[Emitted, StopText, int | None]] = []
        self.sequences: dict[int, Sequence] = {}
        self.running: list[Sequence] = []
        """Admitted sequences, in admission order."""
        self.preempted: dict[int, Sequence] = {}
        """Sequences whose blocks were taken back; they wait to be prefilled again."""

    @property
    def spec_proposed(self) -> int:
        """Speculative decoding's counts: tokens proposed, tokens accepted, rows verified."""
        return self.spec.proposed if self.spec is not None else 0

    @property
    def spec_accepted(self) -> int:
        return self.spec.accepted if self.spec is not None else 0

    @property
    def spec_rows(self) -> int:
        return self.spec.rows if self.spec is not None else 0

    @property
    def active(self) -> int:
        """Running sequences."""
        return len(self.running)

    def check(self, req: Request) -> None:
        """Validate a request against the cache (ConfigError naming the limit)."""
        n = len(req.prompt)
        if n < 1:
            raise ConfigError("a prompt is empty; give at least one token of text")
        if req.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {req.max_new_tokens}")
        if n + req.max_new_tokens > self.max_seq_len:
            raise ConfigError(
                f"prompt ({n} tokens) + max_new_tokens ({req.max_new_tokens}) = "
                f"{n + req.max_new_tokens} exceeds the longest sequence served, "
                f"{self.max_seq_len} tokens; use max_new_tokens <= {max(self.max_seq_len - n, 0)}"
            )
        check_fits(n, req.max_new_tokens, self.block_size, self.pool.num_blocks)
        if req.stop and self.tokenizer is None:
            raise ConfigError("stop strings need the model's tokenizer; none was given")

    @torch.no_grad()
    def step(self, plan: StepPlan) -> list[Emitted]:
        """Apply one plan (cancels, preemptions, admissions), compute its rows, sample."""
        emitted = [self._cancel(rid) for rid in plan.cancels]
        for rid in plan.preempts:
            self._preempt(rid)
        chunks = dict(plan.chunks)
        for req in plan.joins:
            failed = self._join(req, plan.cached.get(req.rid, 0))
            if failed is not None:  # its grammar: every rank refuses it alike
                emitted.append(failed)
                chunks.pop(req.rid, None)
        for rid in plan.resumes:
            self._admit(self.preempted.pop(rid), plan.cached.get(rid, 0))
        rows = self._rows(chunks)
        spec = self.spec
        if plan.drafts and spec is None:
            raise CoreError(f"drafts {plan.drafts} planned for a core that does not speculate")
        drafts = spec.drafts(self, plan.drafts) if spec is not None else {}
        for seq, n in rows:  # every rank allocates in this order: the same ids everywhere
            self._grow(seq, seq.computed + n + len(drafts.get(seq.rid, ())))
        ones = [(s, n) for s, n in rows if n == 1]
        many = [(s, n) for s, n in rows if n > 1]
        verifying: list[tuple[Sequence, int]] = []
        if drafts:  # the one-token rows verify: one call, the rows without a draft in it too
            verifying, ones = ones, []
        for seq, _ in verifying + ones:
            if seq.spec is not None and seq.rid not in drafts:
                seq.spec.tick()
        # the rows that sample this step, in the order _run returns them: their grammar
        # masks are computed once the graph is launched (on an accelerator, while it runs)
        sampling = [s for s, n in ones + many if s.computed + n == len(s.tokens)]
        masks = self._start_masks(sampling)
        done: list[tuple[Sequence, Tensor]] = []
        hook = self.before_graph
        for group in (ones, many):
            if group:
                done += self._run(group, hook)
                hook = None
        verified = spec.verify(self, verifying, drafts, hook) if spec and verifying else []
        emitted += self._sample(done, masks)
        for seq, draft, logits in verified:
            emitted += spec.accept(self, seq, draft, logits)  # type: ignore[union-attr]
        return emitted

    def draft_size(self, seq: Sequence) -> int:
        """The tokens the proposer offers ``seq`` at this step (0: it decodes one token;
        ``Speculator.draft_size``). The scheduler sizes the row's blocks by it."""
        return 0 if self.spec is None else self.spec.draft_size(seq, self.limits.tokens)

    def _join(self, req: Request, cached: int) -> Emitted | None:
        self.check(req)
        if req.rid in self.sequences:
            raise CoreError(f"request {req.rid} joined twice")
        needs_text = self.text or bool(req.stop)
        text = StopText(self.tokenizer, req.stop) if needs_text else None  # type: ignore[arg-type]
        try:
            seq = Sequence(req, text, self.grammars, self.speculative)
        except MemoryError:
            raise
        except Exception as exc:  # a grammar that does not compile: the same on every rank
            if not self.isolate:
                raise
            return Emitted(req.rid, [], "", "error", error=row_error("join", exc))
        self.sequences[req.rid] = seq
        self._admit(seq, cached)
        return None

    def _start_masks(self, sampling: list[Sequence]) -> StepMasks:
        if self.grammars is None or all(s.sampling.matcher is None for s in sampling):
            return StepMasks()
        return StepMasks.start(self.grammars, [s.sampling for s in sampling], self.device)

    def _rows(self, chunks: dict[int, int]) -> list[tuple[Sequence, int]]:
        rows = []
        for seq in self.running:
            n = chunks.pop(seq.rid, 1 if seq.decoding else 0)
            if not 0 <= n <= seq.to_compute:
                raise CoreError(f"request {seq.rid}: a chunk of {n} tokens, {seq.to_compute} left")
            if n:
                rows.append((seq, n))
        if chunks:
            raise CoreError(f"chunks for requests that are not running: {sorted(chunks)}")
        return rows

    def _admit(self, seq: Sequence, cached: int) -> None:
        if cached:
            bs = self.block_size
            keys = prefix_keys(seq.tokens[: cached * bs], bs, salt=self.salt)
            blocks = self.pool.lookup(keys)
            if len(blocks) != cached:
                self.pool.release(blocks)
                raise CoreError(
                    f"request {seq.rid}: rank 0 found {cached} cached blocks, this rank "
                    f"{len(blocks)}: the ranks' prefix caches differ"
                )
            seq.blocks, seq.keys, seq.computed = blocks, keys, cached * bs
            if not seq.out:
                seq.cached = cached * bs
        self.running.append(seq)

    def _grow(self, seq: Sequence, tokens: int) -> None:
        need = blocks_for(tokens, self.block_size) - len(seq.blocks)
        if need > 0:
            seq.blocks += self.pool.allocate(need)

    def _run(
        self, rows: list[tuple[Sequence, int]], before: Callable[[], None] | None = None
    ) -> list[tuple[Sequence, Tensor]]:
        """One call of the step graph over ``rows`` (``before()`` just before it); the rows
        that reached their last token, with their logits [V]."""
        spans = [
            (seq.tokens[seq.computed : seq.computed + n], seq.computed, seq.blocks)
            for seq, n in rows
        ]
        inputs = step_inputs(
            spans, self.limits, self.device, mark_dynamic=self.mark_dynamic, pack=self.pack
        )
        if before is not None:
            before()
        logits = self._step(*inputs)  # [R, V]
        out = []
        for i, (seq, n) in enumerate(rows):
            seq.computed += n
            self.commit_blocks(seq)
            if seq.computed == len(seq.tokens):
                out.append((seq, logits[i]))
        return out

    def commit_blocks(self, seq: Sequence) -> None:
        """Offer the sequence's newly full blocks to the prefix cache (after a step computed
        them; the speculator too, after it accepted a draft's tokens)."""
        if self.pool.prefix_caching:
            for block, key in seq.new_keys(self.block_size, self.salt):
                self.pool.commit(block, key)

    def _sample(self, done: list[tuple[Sequence, Tensor]], masks: StepMasks) -> list[Emitted]:
        bitmask, mask_failures = masks.wait()
        if not done:
            return []
        logits = torch.stack([row for _, row in done])  # [N, V]
        states = [s.sampling for s, _ in done]
        picks = sample_step(logits, states, bitmask, mask_failures, masks.forbid)
        return [self.apply_pick(seq, pick) for (seq, _), pick in zip(done, picks)]

    def apply_pick(self, seq: Sequence, pick: Pick | Failure) -> Emitted:
        """Advance the request by its picked token (its grammar, its penalty state, its text):
        what the step emits for it. With ``isolate``, an exception (or a failed pick) fails
        this request only. The speculator passes each accepted token of a draft through it,
        as plain decoding would."""
        stage = "grammar"
        try:
            if isinstance(pick, Failure):
                stage = pick.stage
                raise pick.error
            complete = seq.sampling.accept(pick.token)
            stage = "text"
            return self._advance(seq, pick.token, complete, pick.logprobs)
        except MemoryError:
            raise  # not the request's doing: the rank fails
        except Exception as exc:  # the same inputs raise the same on every rank
            if not self.isolate:
                raise
            if self.sequences.get(seq.rid) is seq:
                self._finish(seq)
            return Emitted(seq.rid, [], "", "error", error=row_error(stage, exc))

    def _advance(
        self, seq: Sequence, token: int, complete: bool, logprobs: TokenLogprobs | None
    ) -> Emitted:
        """``complete``: the request's grammar admits nothing more (it ends with ``stop``)."""
        first, req = not seq.out, seq.req
        finish, piece = seq.advance(token, complete)
        shown = token not in req.stop_ids
        emitted = Emitted(req.rid, [token], "", finish, seq.cached if first else 0)
        emitted.logprobs = logprobs
        if seq.text is not None and req.stop:
            emitted.text = piece if self.text else ""
        elif seq.text is not None:  # text only to show it: now, or at render()
            job = (emitted, seq.text, token if shown else None)
            if self.defer_text:
                self._unrendered.append(job)
            else:
                render_text(*job, self.isolate)
        if finish is not None:
            self._finish(seq)
        return emitted

    def render(self) -> None:
        """Fill in the text of what was emitted since the last call (``defer_text``)."""
        for job in self._unrendered:
            render_text(*job, self.isolate)
        self._unrendered.clear()

    def _cancel(self, rid: int) -> Emitted:
        seq = self.sequences.get(rid)
        if seq is None:
            raise CoreError(f"cancel of request {rid}, which is not running")
        self._finish(seq)
        return Emitted(rid, [], "", "cancelled")

    def _preempt(self, rid: int) -> None:
        seq = self.sequences.get(rid)
        if seq is None or seq not in self.running:
            raise CoreError(f"preemption of request {rid}, which is not running")
        self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks, seq.keys, seq.computed = [], [], 0
        self.preempted[rid] = seq

    def _finish(self, seq: Sequence) -> None:
        if seq.rid in self.preempted:
            del self.preempted[seq.rid]
        else:
            self.running.remove(seq)
        self.pool.release(seq.blocks)
        seq.blocks = []
        del self.sequences[seq.rid]
