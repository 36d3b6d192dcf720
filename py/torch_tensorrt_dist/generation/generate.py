"""``Generator``: a model's compiled step graph over a paged KV cache, and ``generate``.

    gen = Generator(model, engine="inductor", max_batch_size=8, cache_len=2048)
    result = gen.generate([[1, 5, 7], [1, 9]], max_new_tokens=32, stop_ids=(2,))

One step function per rank, ``Transformer.paged_step(tokens [R, S], start [R], last [R],
past [R, NBp], dest [R, S], [live [N]])``, compiled with R, S, NBp and N dynamic
(``step_inputs.py``): at most four graphs (decode or prefill, one row or several), whatever the
rows, prompt lengths and cache size; each call costs the tokens it holds. ``generate`` is the
generation core (``core.py``) with every prompt queued at once in its scheduler; the server
(``serving/``) feeds the same scheduler from HTTP. Every rank runs the same plans on the same
logits with the same seeded generators: the ranks agree on every token without a broadcast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.core import GenerationCore, Request, StepFn
from torch_tensorrt_dist.generation.kv_blocks import BlockPool, blocks_for
from torch_tensorrt_dist.generation.kv_memory import kv_layout
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.generation.scheduler import Scheduler, attention_span
from torch_tensorrt_dist.generation.speculative import SpeculativeConfig
from torch_tensorrt_dist.generation.step_dispatch import StepDispatch, shape_class
from torch_tensorrt_dist.generation.step_inputs import (
    DEFAULT_BLOCK_SIZE,
    StepLimits,
    decode_example,
    past_split,
    prefill_example,
    setup_example,
    step_inputs,
    warmup_prompts,
)
from torch_tensorrt_dist.models.huge_pages import huge_page_weights
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.paged import NULL_BLOCK
from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.models.weight_layout import has_float32_linears, lay_out_linears
from torch_tensorrt_dist.ops import cpu_attention

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_PREFILL_TOKENS",
    "ENGINES",
    "GenerationResult",
    "Generator",
    "StepFn",
    "compile_paged_step",
    "compile_step",
    "decode_example",
    "model_attention_span",
    "paged_step",
    "prefill_example",
    "setup_example",
]

logger = logging.getLogger(__name__)

#: ``none`` runs the model as plain PyTorch (no torch.compile); the others go through the
#: ``torch_tensorrt_dist`` Dynamo backend with that engine.
ENGINES = ("tensorrt", "inductor", "eager", "none")
DEFAULT_MAX_PREFILL_TOKENS = 512
#: ``cpu_gemm="reduce"``: the steps of at most this many token rows (rows x tokens: a decode
#: step's rows, a short prefill's tokens) compute their products as reductions over the
#: row-major weights, the rest with ATen's GEMM on the same weights: past 16, MKL's
#: register-blocked GEMM wins (docs/generation.md and docs/performance.md have the timings).
REDUCE_ROWS = 16

F = TypeVar("F", bound=Callable[..., Tensor])


def model_attention_span(a: ModelArgs, moe: MoEArgs | None = None) -> float:
    """The scheduler's ``attention_span`` of a model: from its shapes, a mixture of experts'
    MLP (``moe``) counted as the experts a token runs plus its shared expert (its dense
    layers, where some are, as if sparse: an estimate, which only shapes the prefill chunks)."""
    ffn = a.intermediate_size
    if moe is not None:
        ffn = moe.top_k * moe.expert_size + moe.shared_expert_size
    return attention_span(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, ffn)


def paged_step(model: Transformer) -> StepFn:
    """``(tokens [R, S], start [R], last [R], past [R, NBp], dest [R, S]) -> logits [R, V]``:
    rows of a step over the paged cache (``Transformer.paged_step``); a packed step's
    ``live`` [N] after them (``step_inputs``)."""

    def step(*inputs: Tensor) -> Tensor:
        return model.paged_step(*inputs)

    return step


def verify_step(
    model: Transformer, engine: str, verify: bool | None, cpu_gemm: str, device: torch.device
) -> StepFn:
    """The verify call of speculative decoding (``Transformer.paged_verify``: the logits of
    every token), compiled as the step is (:func:`compile_paged_step`)."""

    def step(*inputs: Tensor) -> Tensor:
        return model.paged_verify(*inputs)

    return compile_paged_step(
        step,
        engine,
        verify=verify,
        cpu_gemm=cpu_gemm,
        device=device,
        version=lambda: model.paged_version,
    )


def compile_step(fn: F, engine: str, *, verify: bool | None = None, cpu_gemm: str = "aten") -> F:
    """``fn`` compiled by the given engine: one graph per rank and input shape class, with
    the dimensions its inputs mark dynamic (``step_inputs.mark_step_dims``) left symbolic.

    ``verify``: check the first call of each graph against its eager reference (the
    backend's ``verify`` option; ``None``: on for ``tensorrt`` only). ``cpu_gemm``: the
    backend's option of that name (``reduce``: Inductor only, ``backend/row_products.py``).
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    if engine == "none":
        return fn
    import torch_tensorrt_dist.backend  # noqa: F401  (registers the backend)

    options: dict[str, str | int | bool | Callable[..., Any]] = {"engine": engine}
    if verify is not None:
        options["verify"] = verify
    if cpu_gemm != "aten":
        options["cpu_gemm"] = cpu_gemm
    compiled = torch.compile(
        fn,
        backend="torch_tensorrt_dist",
        options=options,
        fullgraph=True,
        dynamic=None,  # only the dimensions marked dynamic are symbolic
    )
    return cast(F, _module_tag_guards(compiled))


def compile_paged_step(
    fn: F,
    engine: str,
    *,
    verify: bool | None,
    cpu_gemm: str,
    device: torch.device,
    version: Callable[[], Hashable] = lambda: 0,
) -> F:
    """:func:`compile_step` of a step over ``(tokens or hidden [R, S, ...], ...)``. With
    ``cpu_gemm="reduce"`` (the Inductor engine on CPU) two compiles of ``fn`` split the shapes
    by token rows (rows x tokens, a packed step's real tokens): up to :data:`REDUCE_ROWS` with
    the products as reductions (``backend/row_products.py``), the rest with ATen's. Elsewhere
    it is ``aten``. Each form runs through a :class:`StepDispatch` (``step_dispatch.py``):
    each shape class's compiled code is called directly once confirmed, without Dynamo's
    guards."""
    split = cpu_gemm == "reduce"
    if not split or engine != "inductor" or device.type != "cpu":
        one = compile_step(fn, engine, verify=verify, cpu_gemm="aten" if split else cpu_gemm)
        if one is fn:  # engine none: nothing compiled
            return fn
        return cast(F, StepDispatch(fn, lambda i: (shape_class(i), one), version=version))
    few = compile_step(fn, engine, verify=verify, cpu_gemm=cpu_gemm)
    rest = compile_step(fn, engine, verify=verify)

    def route(inputs: tuple[Tensor, ...]) -> tuple[Hashable, Callable[..., Tensor]]:
        r, s = inputs[0].shape[:2]  # by token rows (a packed step's real ones)
        small = (inputs[5].shape[0] if len(inputs) > 5 else r * s) <= REDUCE_ROWS
        return (small, *shape_class(inputs)), few if small else rest

    return cast(F, StepDispatch(fn, route, version=version))


def _module_tag_guards(compiled: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``compiled`` with its guards built to skip a module subtree whose dicts are unchanged
    (Dynamo's ``use_recursive_dict_tags_for_guards``, off by default, set for each call only).

    Dynamo guards every parameter and KV pool one by one (about 950 guards a graph): 0.33-0.46
    ms of a 1-row step of the bench checkpoint, 0.18-0.19 with the flag. It assumes what Dynamo
    already assumes of a tensor in an unchanged dict: its shape, dtype and strides change only
    by rebinding it; a step's model rebinds nothing, and rebinding a parameter still fails the
    guard (tests/test_step_guards.py)."""
    from torch._dynamo import config as dynamo_config

    def call(*inputs: Tensor) -> Tensor:
        before = dynamo_config.use_recursive_dict_tags_for_guards
        dynamo_config.use_recursive_dict_tags_for_guards = True
        try:
            return compiled(*inputs)
        finally:
            dynamo_config.use_recursive_dict_tags_for_guards = before

    return call


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
    """Compiles a model's step graph over a paged KV cache it sets up, and generates.

    What the methods use (a subclass over other graphs sets the same, see
    ``artifacts/load.ArtifactGenerator``): ``args``, ``engine``, ``max_batch_size``,
    ``cache_len``, ``max_prefill_tokens``, ``block_size``, ``num_blocks``, ``prefix_caching``,
    ``salt``, ``device``, ``limits``, the step function ``_step`` and ``mark_dynamic`` (whether
    Dynamo traces ``_step``: its inputs' dynamic dimensions are marked), and ``pack``."""

    #: ``_step`` takes packed prefill steps (``step_inputs``); not with TensorRT's engines
    pack = False

    def __init__(
        self,
        model: Transformer,
        *,
        engine: str = "none",
        max_batch_size: int = 1,
        cache_len: int | None = None,
        verify: bool | None = None,
        kv_cache_memory: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_prefill_tokens: int = DEFAULT_MAX_PREFILL_TOKENS,
        prefix_caching: bool = True,
        salt: bytes = b"",
        cpu_gemm: str = "reduce",
        speculative: SpeculativeConfig | None = None,
    ) -> None:
        """``max_batch_size``: rows run together; ``cache_len``: the longest sequence (prompt
        and generated tokens; default the model's); ``kv_cache_memory``: KV bytes on this rank
        (default: ``max_batch_size`` sequences of ``cache_len`` tokens); ``max_prefill_tokens``:
        prompt tokens per step; ``salt``: the model's identity in prefix-cache keys;
        ``cpu_gemm``: the Inductor engine's products with CPU weights (``compile_paged_step``:
        ``reduce``, the default, or ``aten``, the reference the tests compare it with);
        ``speculative``: speculative decoding (``speculative/``; a second compiled step, the
        verify call, which returns the logits of every token)."""
        self.model, self.args, self.engine = model, model.args, engine
        #: a mixture of experts' MLP (``models/moe.py``), None for a dense model
        self.moe: MoEArgs | None = getattr(model, "moe", None)
        self.max_batch_size = max_batch_size
        self.cache_len = cache_len or model.args.max_seq_len
        if max_batch_size < 1 or self.cache_len < 2:
            raise ConfigError(
                f"max_batch_size ({max_batch_size}) must be >= 1 and the sequence length "
                f"({self.cache_len}) >= 2"
            )
        self.max_prefill_tokens = max_prefill_tokens
        self.block_size, self.layout = block_size, kv_layout(model, block_size)
        self.num_blocks = self.layout.blocks_for_memory(
            kv_cache_memory, rows=max_batch_size, max_seq_len=self.cache_len
        )
        self.prefix_caching, self.salt = prefix_caching, salt
        self.mark_dynamic = engine != "none"  # plain PyTorch: nothing traces the step
        self.pack = engine != "tensorrt"
        self.device = next(model.parameters()).device
        #: decode steps attend through the CPU op over the pools in place (Inductor on the CPU
        #: only: ``ops/cpu_attention.py``); TensorRT and the reference keep their form
        self.cpu_decode = (
            engine == "inductor" and self.device.type == "cpu" and cpu_attention.available()
        )
        model.setup_paged(self.num_blocks, block_size, self.cache_len, cpu_decode=self.cpu_decode)
        self.limits = StepLimits(
            rows=max_batch_size,
            tokens=max(2, min(max_prefill_tokens, self.cache_len)),
            blocks=max(2, blocks_for(self.cache_len, block_size)),  # tables have >= 2 blocks
            block_size=block_size,
        )
        if cpu_gemm == "reduce" and not has_float32_linears(model):
            cpu_gemm = "aten"  # nothing to rewrite (bf16, fp16, quantized): no second compile
        if engine == "inductor":  # ATen's products of few rows read column-major weights
            # faster; the reductions read float32 weight rows
            lay_out_linears(model, row_major={torch.float32} if cpu_gemm == "reduce" else ())
        if self.device.type == "cpu":  # each step streams the weights (models/huge_pages.py)
            huge_page_weights(model)
        if engine != "none":  # a handful of graphs (shape classes): let Dynamo keep them all
            limit = torch._dynamo.config.recompile_limit
            torch._dynamo.config.recompile_limit = max(limit, 16)
        self._step: StepFn = compile_paged_step(
            paged_step(model),
            engine,
            verify=verify,
            cpu_gemm=cpu_gemm,
            device=self.device,
            version=lambda: model.paged_version,  # setup_paged again: other pools, other keys
        )
        self.speculative = speculative
        self._verify: StepFn | None = None
        if speculative is not None:
            self._verify = verify_step(model, engine, verify, cpu_gemm, self.device)

    def core(self, *, tokenizer: Tokenizer | None = None, text: bool = False) -> GenerationCore:
        """The generation core over this generator's graph and a fresh block pool (the cache
        memory is the model's; one core at a time)."""
        pool = BlockPool(self.num_blocks, self.block_size, prefix_caching=self.prefix_caching)
        return GenerationCore(
            self._step,
            pool=pool,
            max_seq_len=self.cache_len,
            limits=self.limits,
            device=self.device,
            tokenizer=tokenizer,
            text=text,
            salt=self.salt,
            mark_dynamic=self.mark_dynamic,
            pack=self.pack,
            speculative=getattr(self, "speculative", None),
            verify_fn=getattr(self, "_verify", None),
        )

    def scheduler(self, core: GenerationCore) -> Scheduler:
        return Scheduler(
            core,
            max_rows=self.max_batch_size,
            max_prefill_tokens=self.max_prefill_tokens,
            attention_span=model_attention_span(self.args, self.moe),
        )

    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> int:
        """Validate a request; return its longest prompt (the same on every rank)."""
        if not prompts:
            raise ConfigError("no prompt given")
        vocab = self.args.vocab_size
        if any(not 0 <= i < vocab for ids in prompts for i in ids):
            raise ConfigError(f"a prompt holds token ids outside [0, {vocab})")
        longest = max(len(p) for p in prompts)
        if min(len(p) for p in prompts) < 1:
            raise ConfigError("a prompt is empty; give at least one token of text")
        if max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if longest + max_new_tokens > self.cache_len:
            raise ConfigError(
                f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = "
                f"{longest + max_new_tokens} exceeds the longest sequence served, "
                f"{self.cache_len} tokens; use max_new_tokens <= {max(self.cache_len - longest, 0)}"
            )
        return longest

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
        longest = self.check(prompts, max_new_tokens)
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

    def warmup(self, prompt_len: int, max_new_tokens: int, batch_size: int = 1) -> float:
        """Run the graphs ``batch_size`` prompts of ``prompt_len`` tokens need; return s."""
        start = time.perf_counter()
        n = min(prompt_len, self.cache_len - 1)
        prompts = [[0] * n] * batch_size
        self.generate(prompts, max_new_tokens=min(2, max_new_tokens, self.cache_len - n))
        return time.perf_counter() - start

    def warmup_all(self, *, stop: Callable[[], bool] | None = None) -> float:
        """Compile every graph a server may run (one row or several, decode or prefill, a
        short prompt and the longest chunk); return s. Nothing compiles after it. ``stop()``
        is asked before each run: True ends the warm-up there (a server stopped while warming
        up; every rank must get the same answer: each graph's collectives need every rank)."""
        start = time.perf_counter()
        longest = min(self.limits.tokens, self.cache_len - 2)
        for prompts in warmup_prompts(self.max_batch_size, longest, REDUCE_ROWS):
            if stop is not None and stop():
                break
            self.generate(prompts, max_new_tokens=2)
        most, pack, mark = min(self.limits.tokens, self.cache_len - 1), self.pack, self.mark_dynamic
        for r, s in past_split(self.max_batch_size, most, REDUCE_ROWS):  # reduce's other side
            if stop is not None and stop():
                break
            null = [([0] * s, 0, [NULL_BLOCK] * blocks_for(s, self.block_size))] * r
            with torch.no_grad():  # as the core's steps; reads and writes the null block only
                inputs = step_inputs(null, self.limits, self.device, mark_dynamic=mark, pack=pack)
                self._step(*inputs)
        self._warm_verify(stop)
        return time.perf_counter() - start

    def _warm_verify(self, stop: Callable[[], bool] | None) -> None:
        """Speculative decoding's verify call: one row, two, and the most, of k + 1 tokens
        (its shape classes, on each side of the products' split), on the null block."""
        verify, spec = getattr(self, "_verify", None), getattr(self, "speculative", None)
        if verify is None or spec is None:
            return
        s = min(spec.num_tokens + 1, self.limits.tokens)
        for r in sorted({1, min(2, self.max_batch_size), self.max_batch_size}):
            if stop is not None and stop():
                return
            null = [([0] * s, 0, [NULL_BLOCK] * blocks_for(s, self.block_size))] * r
            with torch.no_grad():
                inputs = step_inputs(
                    null, self.limits, self.device, mark_dynamic=self.mark_dynamic, pack=self.pack
                )
                verify(*inputs)
