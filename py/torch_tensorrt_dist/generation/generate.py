"""``Generator``: the offline loop, every prompt at once through the generation core.

    gen = Generator(model, engine="inductor", max_batch_size=8, cache_len=2048)
    result = gen.generate([[1, 5, 7], [1, 9]], max_new_tokens=32, stop_ids=(2,))

A generator runs a runner's step (``runner.py``: the model, its paged pools, its limits and
its compiled step) through the generation core (``core.py``) with every prompt queued at once
in its scheduler; the server (``serving/``) feeds the same core and scheduler from HTTP, built
by :meth:`Generator.core` and :meth:`Generator.scheduler`. Every rank runs the same plans on
the same logits with the same seeded generators: the ranks agree on every token without a
broadcast.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import torch
import torch.distributed as dist
from tqdm import tqdm
from typing_extensions import Unpack

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.core import GenerationCore, Request
from torch_tensorrt_dist.generation.kv_blocks import BlockPool, blocks_for
from torch_tensorrt_dist.generation.runner import ModelRunner, StepRunner
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.generation.scheduler import Scheduler, attention_span
from torch_tensorrt_dist.generation.speculative import SpeculativeConfig
from torch_tensorrt_dist.generation.speculative.draft import DraftProposer, check_draft
from torch_tensorrt_dist.generation.step_inputs import past_split, step_inputs, warmup_prompts
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.paged import NULL_BLOCK
from torch_tensorrt_dist.models.tokenizer import Tokenizer

__all__ = ["GenerationResult", "Generator", "RunnerOptions", "model_attention_span"]


def _params(model: Transformer | StepRunner) -> int | None:
    """A model's parameters on this rank (None: a runner of loaded graphs, no model)."""
    module = getattr(model, "model", model)
    if not isinstance(module, torch.nn.Module):
        return None
    return sum(p.numel() for p in module.parameters())


class RunnerOptions(TypedDict, total=False):
    """:class:`~torch_tensorrt_dist.generation.runner.ModelRunner`'s keyword options."""

    engine: str
    max_batch_size: int
    cache_len: int | None
    verify: bool | None
    kv_cache_memory: int | None
    block_size: int
    max_prefill_tokens: int
    cpu_gemm: str


def model_attention_span(a: ModelArgs, moe: MoEArgs | None = None) -> float:
    """The scheduler's ``attention_span`` of a model: from its shapes, a mixture of experts'
    MLP (``moe``) counted as the experts a token runs plus its shared expert (its dense
    layers, where some are, as if sparse: an estimate, which only shapes the prefill chunks)."""
    ffn = a.intermediate_size
    if moe is not None:
        ffn = moe.top_k * moe.expert_size + moe.shared_expert_size
    return attention_span(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, ffn)


@dataclass
class GenerationResult:
    """Generated ids per prompt (a stop token, when hit, is the last id) and timings."""

    tokens: list[list[int]]
    ttft_s: float
    """Prompts in to the last prompt's first token out."""
    decode_s: float
    decode_steps: int
    prefill_len: int
    """The longest prompt."""
    stopped: list[bool] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)
    """Prompt tokens each prompt took from the prefix cache."""

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second per sequence (steps / decode time)."""
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


class Generator:
    """Generates through a runner's step: ``Generator(model, **options)`` builds a
    :class:`ModelRunner` of the model with the options (:class:`RunnerOptions`);
    ``Generator(runner)`` takes a runner built already (a pipeline stage's, loaded artifacts').
    ``prefix_caching``: reuse the full blocks of earlier prompts; ``salt``: the model's
    identity in prefix-cache keys; ``speculative``: speculative decoding (``speculative/``:
    the runner compiles a second step, the verify call, which returns every token's logits);
    ``draft``: the draft model of ``SpeculativeConfig(method="draft")``, run by a runner of
    its own with this runner's engine, rows, sequence length and blocks
    (``speculative/draft.py``)."""

    def __init__(
        self,
        model: Transformer | StepRunner,
        *,
        prefix_caching: bool = True,
        salt: bytes = b"",
        speculative: SpeculativeConfig | None = None,
        draft: Transformer | None = None,
        **options: Unpack[RunnerOptions],
    ) -> None:
        if isinstance(model, StepRunner):
            if options:
                raise ConfigError(
                    f"the options {sorted(options)} are a model's: a runner built already has "
                    "its own; give them to its constructor"
                )
            if speculative is not None and model.verify is None:
                raise ConfigError(
                    "speculative decoding needs the runner's verify call: build the runner "
                    "with verify_call=True"
                )
            self.runner = model
        else:
            self.runner = ModelRunner(model, verify_call=speculative is not None, **options)
        self.prefix_caching, self.salt = prefix_caching, salt
        self.speculative = speculative
        if speculative is not None and speculative.method == "draft" and draft is None:
            raise ConfigError("--speculative draft needs a draft model (--draft-model)")
        self.draft = None if draft is None else self._draft(draft, speculative, options)

    def _draft(
        self, draft: Transformer, spec: SpeculativeConfig | None, options: RunnerOptions
    ) -> DraftProposer:
        """The draft model's proposer over a runner like the target's (checked: the same
        vocabulary, no larger)."""
        if spec is None or spec.method != "draft":
            raise ConfigError("a draft model (--draft-model) needs --speculative draft")
        if draft is getattr(self.runner, "model", None):
            raise ConfigError(
                "the draft model is the target's own module: a runner sets up its model's KV "
                "pools, so the draft needs a copy of its own (load it again)"
            )
        check_draft(self.runner.args, draft.args, _params(self.runner), _params(draft))
        run = self.runner
        keep = ("engine", "verify", "cpu_gemm")
        same = {key: options[key] for key in keep if key in options}  # type: ignore[literal-required]
        runner = ModelRunner(
            draft,
            max_batch_size=run.max_batch_size,
            cache_len=run.cache_len,
            block_size=run.block_size,
            max_prefill_tokens=run.max_prefill_tokens,
            **same,
        )
        return DraftProposer(runner)

    def core(self, *, tokenizer: Tokenizer | None = None, text: bool = False) -> GenerationCore:
        """The generation core over the runner's step and a fresh block pool (the cache
        memory is the model's; one core at a time)."""
        run = self.runner
        return GenerationCore(
            run.step,
            pool=BlockPool(run.num_blocks, run.block_size, prefix_caching=self.prefix_caching),
            max_seq_len=run.cache_len,
            limits=run.limits,
            device=run.device,
            tokenizer=tokenizer,
            text=text,
            salt=self.salt,
            mark_dynamic=run.mark_dynamic,
            pack=run.pack,
            speculative=self.speculative,
            verify_fn=run.verify if self.speculative is not None else None,
            draft=self.draft,
        )

    def scheduler(self, core: GenerationCore) -> Scheduler:
        run = self.runner
        return Scheduler(
            core,
            max_rows=run.max_batch_size,
            max_prefill_tokens=run.max_prefill_tokens,
            attention_span=model_attention_span(run.args, run.moe),
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_ids: Sequence[int] = (),
        on_step: Callable[[list[list[int]]], None] | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` per prompt; ``on_step`` gets each step's new ids
        per prompt (empty for a prompt that produced none in that step).

        Each prompt samples from its own generator seeded with ``sampling.seed``: a prompt
        gets the same tokens alone or with others.
        """
        longest = self.runner.check(prompts, max_new_tokens)
        sampling = sampling or SamplingConfig()
        core = self.core()
        sched = self.scheduler(core)
        ends = sampling.end_ids(stop_ids)  # stop_token_ids, ignore_eos
        for i, ids in enumerate(prompts):
            sched.add(Request(i, tuple(ids), max_new_tokens, sampling, ends))
        out: list[list[int]] = [[] for _ in prompts]
        cached = [0] * len(prompts)
        started = 0
        start = time.perf_counter()
        ttft, steps, decode_start = 0.0, 0, start
        while not sched.idle():
            new: list[list[int]] = [[] for _ in prompts]
            for e in core.step(sched.plan()):
                if not out[e.rid]:
                    started += 1
                    cached[e.rid] = e.cached
                out[e.rid] += e.tokens
                new[e.rid] += e.tokens
            if started == len(prompts):  # every prompt has its first token: decoding
                if ttft:
                    steps += 1
                else:
                    ttft = time.perf_counter() - start
                    decode_start = time.perf_counter()
            if on_step is not None:
                on_step(new)
        stops = set(ends)
        return GenerationResult(
            tokens=out,
            ttft_s=ttft,
            decode_s=time.perf_counter() - decode_start,
            decode_steps=steps,
            prefill_len=longest,
            stopped=[bool(row and row[-1] in stops) for row in out],
            cached_tokens=cached,
        )

    def warmup(
        self, prompt_len: int, max_new_tokens: int, batch_size: int = 1, *, progress: bool = False
    ) -> float:
        """Run the graphs ``batch_size`` prompts of ``prompt_len`` tokens need; return s.
        ``progress``: a progress bar on stderr (rank 0)."""
        start, cache_len = time.perf_counter(), self.runner.cache_len
        n = min(prompt_len, cache_len - 1)
        with self._bar(1, progress) as bar:
            self.generate(
                [[0] * n] * batch_size, max_new_tokens=min(2, max_new_tokens, cache_len - n)
            )
            bar.update()
        return time.perf_counter() - start

    def warmup_all(
        self, *, stop: Callable[[], bool] | None = None, progress: bool = False
    ) -> float:
        """Compile every graph a server may run (one row or several, decode or prefill, a
        short prompt and the longest chunk, each side of the runner's ``reduce_rows``);
        return s. Nothing compiles after it. ``stop()`` is asked before each run: True ends
        the warm-up there (a server stopped while warming up; every rank must get the same
        answer: each graph's collectives need every rank). ``progress``: a progress bar on
        stderr (rank 0), a run a tick."""
        start, run = time.perf_counter(), self.runner
        limits, split = run.limits, run.reduce_rows
        batches = warmup_prompts(run.max_batch_size, min(limits.tokens, run.cache_len - 2), split)
        past = past_split(run.max_batch_size, min(limits.tokens, run.cache_len - 1), split)
        with self._bar(len(batches) + len(past), progress) as bar:
            for prompts in batches:
                if stop is not None and stop():
                    break
                self.generate(prompts, max_new_tokens=2)
                bar.update()
            for r, s in past:  # the reductions' other side: the null block only
                if stop is not None and stop():
                    break
                null = [([0] * s, 0, [NULL_BLOCK] * blocks_for(s, run.block_size))] * r
                with torch.no_grad():  # as the core's steps
                    run.step(
                        *step_inputs(
                            null, limits, run.device, mark_dynamic=run.mark_dynamic, pack=run.pack
                        )
                    )
                bar.update()
        self._warm_verify(stop)
        if self.draft is not None:  # the draft's graphs, then a clean cache for its rows
            Generator(self.draft.runner).warmup_all(stop=stop)
            self.draft = DraftProposer(self.draft.runner)
        return time.perf_counter() - start

    def _warm_verify(self, stop: Callable[[], bool] | None) -> None:
        """Speculative decoding's verify call: one row, two, and the most, of k + 1 tokens
        (its shape classes, on each side of the products' split), on the null block."""
        run, spec = self.runner, self.speculative
        if run.verify is None or spec is None:
            return
        s = min(spec.num_tokens + 1, run.limits.tokens)
        for r in sorted({1, min(2, run.max_batch_size), run.max_batch_size}):
            if stop is not None and stop():
                return
            null = [([0] * s, 0, [NULL_BLOCK] * blocks_for(s, run.block_size))] * r
            with torch.no_grad():
                run.verify(
                    *step_inputs(
                        null, run.limits, run.device, mark_dynamic=run.mark_dynamic, pack=run.pack
                    )
                )

    def _bar(self, total: int, progress: bool) -> tqdm[None]:
        """A warm-up's progress bar (shown where ``progress`` is asked, on rank 0 only)."""
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        engine = self.runner.engine
        return tqdm(total=total, desc=f"warm-up ({engine})", disable=not (progress and rank0))
