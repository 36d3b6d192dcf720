"""The model runner: a model made ready to step over a paged KV cache, and its compiled step.

    runner = ModelRunner(model, engine="inductor", max_batch_size=8, cache_len=2048)
    logits = runner.step(*step_inputs(spans, runner.limits, runner.device))   # [R, V]

:class:`ModelRunner` owns the model, its block pools (``setup_paged``), the limits its step is
compiled for and the compiled step: ``Transformer.paged_step(tokens [R, S], start [R], last
[R], past [R, NBp], dest [R, S], [live [N]])`` with R, S, NBp and N dynamic
(``step_inputs.py``), at most four graphs (decode or prefill, one row or several) per form.
What depends on the device lives in one :class:`Backend`, picked by :func:`backend_for`: the
weights' layout and place, the decode attention op and the form of the products. Nothing
global changes: Dynamo's settings the step needs are set around each call of it only.
:class:`StepRunner` is what a generation loop (``generate.Generator``, the server) reads of
a runner; ``artifacts/load.py`` builds one over loaded graphs instead of a model.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from torch_tensorrt_dist.engines import CPU_GEMMS, ENGINES
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.kv_blocks import blocks_for
from torch_tensorrt_dist.generation.kv_memory import KVLayout, kv_layout
from torch_tensorrt_dist.generation.step_dispatch import StepDispatch, shape_class
from torch_tensorrt_dist.generation.step_inputs import (
    DEFAULT_BLOCK_SIZE,
    StepFn,
    StepLimits,
    decode_example,
    prefill_example,
    setup_example,
)
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs
from torch_tensorrt_dist.models.moe_args import MoEArgs
from torch_tensorrt_dist.models.paged import PagedKVCache
from torch_tensorrt_dist.models.weight_layout import has_float32_linears, lay_out_linears
from torch_tensorrt_dist.ops import cpu_attention
from torch_tensorrt_dist.runtime.huge_pages import huge_page_weights

__all__ = [
    "CPU_GEMMS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_PREFILL_TOKENS",
    "ENGINES",
    "REDUCE_ROWS",
    "Backend",
    "CpuBackend",
    "ModelRunner",
    "StepFn",
    "StepRunner",
    "backend_for",
    "compile_paged_step",
    "compile_step",
    "decode_example",
    "paged_step",
    "paged_verify",
    "prefill_example",
    "setup_example",
]

DEFAULT_MAX_PREFILL_TOKENS = 512
#: ``cpu_gemm="reduce"``: the steps of at most this many token rows (rows x tokens: a decode
#: step's rows, a short prefill's tokens) compute their products as reductions over the
#: row-major weights, the rest with ATen's GEMM on the same weights: past 16, MKL's
#: register-blocked GEMM wins (docs/generation.md and docs/performance.md have the timings).
REDUCE_ROWS = 16
#: graphs Dynamo keeps per step function (its default, 8, is below two forms' shape classes)
RECOMPILE_LIMIT = 16

F = TypeVar("F", bound=Callable[..., Tensor])


def paged_step(model: Transformer) -> StepFn:
    """``(tokens [R, S], start [R], last [R], past [R, NBp], dest [R, S]) -> logits [R, V]``:
    rows of a step over the paged cache (``Transformer.paged_step``); a packed step's
    ``live`` [N] after them (``step_inputs``)."""

    def step(*inputs: Tensor) -> Tensor:
        return model.paged_step(*inputs)

    return step


def paged_verify(model: Transformer) -> StepFn:
    """Speculative decoding's verify call over the paged cache: the step's inputs, the
    logits of every token ``[R, S, V]`` (``Transformer.paged_step(..., every=True)``)."""

    def step(*inputs: Tensor) -> Tensor:
        return model.paged_step(*inputs, every=True)

    return step


def compile_step(fn: F, engine: str, *, verify: bool | None = None, cpu_gemm: str = "aten") -> F:
    """``fn`` compiled by the given engine: one graph per rank and input shape class, with
    the dimensions its inputs mark dynamic (``step_inputs.mark_step_dims``) left symbolic.

    ``verify``: check the first call of each graph against its eager reference (the
    backend's ``verify`` option; ``None``: on for ``tensorrt`` only). ``cpu_gemm``: the
    backend's option of that name (``reduce``: Inductor only, ``backend/row_products.py``).
    """
    if _nothing_to_compile(engine):
        return fn
    return _compiled(_own_code(fn), engine, verify, cpu_gemm)


def _nothing_to_compile(engine: str) -> bool:
    if engine not in ENGINES:
        raise ConfigError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    return engine == "none"


def _compiled(fn: F, engine: str, verify: bool | None, cpu_gemm: str) -> F:
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
    return cast(F, _scoped_dynamo_config(compiled))


def compile_paged_step(
    fn: F,
    engine: str,
    *,
    verify: bool | None,
    cpu_gemm: str,
    version: Callable[[], Hashable] = lambda: 0,
    reduce_rows: int = REDUCE_ROWS,
) -> F:
    """:func:`compile_step` of a step over ``(tokens or hidden [R, S, ...], ...)``. With
    ``cpu_gemm="reduce"`` and the Inductor engine (CPU weights: :class:`CpuBackend`) two
    compiles of ``fn`` split the shapes by token rows (rows x tokens, a packed step's real
    tokens): up to ``reduce_rows`` with the products as reductions
    (``backend/row_products.py``), the rest with ATen's. Each form runs through a
    :class:`StepDispatch` (``step_dispatch.py``): each shape class's compiled code is called
    directly once confirmed, without Dynamo's guards."""
    if _nothing_to_compile(engine):
        return fn
    fn = _own_code(fn)  # both forms and the dispatch over one code object, the step's own
    if cpu_gemm != "reduce" or engine != "inductor":
        one = _compiled(fn, engine, verify, "aten")
        return cast(F, StepDispatch(fn, lambda i: (shape_class(i), one), version=version))
    few = _compiled(fn, engine, verify, cpu_gemm)
    rest = _compiled(fn, engine, verify, "aten")

    def route(inputs: tuple[Tensor, ...]) -> tuple[Hashable, Callable[..., Tensor]]:
        r, s = inputs[0].shape[:2]  # by token rows (a packed step's real ones)
        small = (inputs[5].shape[0] if len(inputs) > 5 else r * s) <= reduce_rows
        return (small, *shape_class(inputs)), few if small else rest

    return cast(F, StepDispatch(fn, route, version=version))


def _own_code(fn: F) -> F:
    """``fn`` over a code object of its own. Dynamo keeps its compiled graphs and their
    recompile count on the code object: every step function (``paged_step``'s inner ``step``)
    shares one, so the graphs of all the generators a process ever built, and their models,
    stayed in one cache until the limit refused the next (a test process running many
    models: "Dynamo recompile limit exceeded"). With a copy, a compiled step's cache counts
    its own shapes only and goes with it."""
    if not isinstance(fn, types.FunctionType):
        return fn
    own = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    own.__kwdefaults__, own.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    own.__dict__.update(fn.__dict__)
    return cast(F, own)


def _scoped_dynamo_config(compiled: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``compiled`` with two Dynamo settings set for each call only, as they were after it:

    - ``recompile_limit`` at least :data:`RECOMPILE_LIMIT`: the step's shape classes (two
      forms of up to four, over one function) all compile instead of falling back to eager;
    - ``use_recursive_dict_tags_for_guards`` (off by default): guards skip a module subtree
      whose dicts are unchanged. Dynamo guards every parameter and KV pool one by one (about
      950 guards a graph): 0.33-0.46 ms of a 1-row step of the bench checkpoint, 0.18-0.19
      with the flag. It assumes what Dynamo already assumes of a tensor in an unchanged dict:
      its shape, dtype and strides change only by rebinding it; a step's model rebinds
      nothing, and rebinding a parameter still fails the guard (tests/test_step_guards.py).
    """
    from torch._dynamo import config as dynamo_config

    def call(*inputs: Tensor) -> Tensor:
        tags, limit = (
            dynamo_config.use_recursive_dict_tags_for_guards,
            dynamo_config.recompile_limit,
        )
        dynamo_config.use_recursive_dict_tags_for_guards = True
        dynamo_config.recompile_limit = max(limit, RECOMPILE_LIMIT)
        try:
            return compiled(*inputs)
        finally:
            dynamo_config.use_recursive_dict_tags_for_guards = tags
            dynamo_config.recompile_limit = limit

    return call


@dataclass(frozen=True)
class Backend:
    """How a runner readies a model for a device and compiles its step: off the CPU, the
    model as built and one compiled form of the step. ``cpu_decode``: decode steps and verify
    calls attend through the CPU op over the pools in place (``ops/cpu_attention.py``)."""

    engine: str
    cpu_decode: bool = False
    reduce_rows: int = REDUCE_ROWS

    def prepare(self, model: Transformer) -> None:
        """Re-lay or move the model's weights before its step compiles (nothing here)."""

    def compile(
        self, fn: StepFn, *, verify: bool | None, version: Callable[[], Hashable]
    ) -> StepFn:
        return compile_paged_step(fn, self.engine, verify=verify, cpu_gemm="aten", version=version)


@dataclass(frozen=True)
class CpuBackend(Backend):
    """The CPU, where a step streams every weight: the weights move into huge pages
    (``runtime/huge_pages.py``); with the Inductor engine, linear weights are column-major for
    ATen's products of few rows, and with ``gemm="reduce"`` (float32 weights) row-major, the
    steps of at most ``reduce_rows`` token rows computing their products as reductions
    (:func:`compile_paged_step`); decode attention through the CPU op where it loads."""

    gemm: str = "aten"

    def prepare(self, model: Transformer) -> None:
        if self.engine == "inductor":  # the reductions read float32 weight rows
            lay_out_linears(model, row_major={torch.float32} if self.gemm == "reduce" else ())
        huge_page_weights(model, skip=(PagedKVCache,))  # the pools are written every step

    def compile(
        self, fn: StepFn, *, verify: bool | None, version: Callable[[], Hashable]
    ) -> StepFn:
        return compile_paged_step(
            fn,
            self.engine,
            verify=verify,
            cpu_gemm=self.gemm,
            version=version,
            reduce_rows=self.reduce_rows,
        )


def backend_for(model: Transformer, engine: str, *, cpu_gemm: str = "reduce") -> Backend:
    """The one place a runner's device choices are made, from the model's device and the
    engine: :class:`CpuBackend` on the CPU, else :class:`Backend`. ``cpu_gemm``: the Inductor
    engine's products with CPU weights, ``reduce`` (the measured default) or ``aten`` (the
    reference the tests compare it with); a model without float32 linear weights (bf16, fp16,
    quantized) has nothing to rewrite and gets ``aten`` (one compile of the step, not two)."""
    if cpu_gemm not in CPU_GEMMS:
        raise ConfigError(f"cpu_gemm={cpu_gemm!r} is not one of {', '.join(CPU_GEMMS)}")
    if next(model.parameters()).device.type != "cpu":
        return Backend(engine)
    inductor = engine == "inductor"
    return CpuBackend(
        engine,
        cpu_decode=inductor and cpu_attention.available(),
        reduce_rows=REDUCE_ROWS,
        gemm="reduce"
        if inductor and cpu_gemm == "reduce" and has_float32_linears(model)
        else "aten",
    )


class StepRunner:
    """What a generation loop reads of a runner: the step function over the paged KV cache,
    the pool's size and the limits of the shapes the step takes. ``mark_dynamic``: Dynamo
    traces ``step`` (its inputs' dynamic dimensions are marked); ``pack``: it takes packed
    prefill steps (``step_inputs``)."""

    step: StepFn
    #: speculative decoding's verify call (the logits of every token), where it was built
    verify: StepFn | None = None
    args: ModelArgs
    #: a mixture of experts' MLP (``models/moe.py``), None for a dense model
    moe: MoEArgs | None
    engine: str
    max_batch_size: int
    cache_len: int
    max_prefill_tokens: int
    block_size: int
    num_blocks: int
    layout: KVLayout
    device: torch.device
    limits: StepLimits
    mark_dynamic: bool
    pack: bool
    #: the token rows at which the step's compiled forms split (:func:`compile_paged_step`)
    reduce_rows: int = REDUCE_ROWS
    #: seconds the runner took to load its compiled step (artifacts; 0 where it compiles)
    load_s: float = 0.0

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


class ModelRunner(StepRunner):
    """A model's step compiled over the paged KV cache it sets up on the model."""

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
        cpu_gemm: str = "reduce",
        verify_call: bool = False,
    ) -> None:
        """``max_batch_size``: rows run together; ``cache_len``: the longest sequence (prompt
        and generated tokens; default the model's); ``kv_cache_memory``: KV bytes on this rank
        (default: ``max_batch_size`` sequences of ``cache_len`` tokens); ``max_prefill_tokens``:
        prompt tokens per step; ``cpu_gemm``: :func:`backend_for`'s; ``verify_call``: compile
        speculative decoding's verify call too (``paged_step(..., every=True)``, as the step)."""
        self.model, self.args, self.engine = model, model.args, engine
        self.moe = getattr(model, "moe", None)
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
        self.mark_dynamic = engine != "none"  # plain PyTorch: nothing traces the step
        self.pack = engine != "tensorrt"
        self.device = next(model.parameters()).device
        self.backend = backend_for(model, engine, cpu_gemm=cpu_gemm)
        self.reduce_rows = self.backend.reduce_rows
        model.setup_paged(
            self.num_blocks, block_size, self.cache_len, cpu_decode=self.backend.cpu_decode
        )
        self.limits = StepLimits(
            rows=max_batch_size,
            tokens=max(2, min(max_prefill_tokens, self.cache_len)),
            blocks=max(2, blocks_for(self.cache_len, block_size)),  # tables have >= 2 blocks
            block_size=block_size,
        )
        self.backend.prepare(model)
        self.step = self.backend.compile(
            paged_step(model),
            verify=verify,
            version=lambda: model.paged_version,  # setup_paged again: other pools, other keys
        )
        if verify_call:
            self.verify = self.backend.compile(
                paged_verify(model), verify=verify, version=lambda: model.paged_version
            )
