"""The run configuration: what a command (``generate``, ``serve``, ``eval``, ``compile``) asks
of its ranks, typed, validated once, and picklable (the launcher sends it to each rank).

    config = RunConfig(
        "generate",
        ModelOptions(model="PATH", dtype="bf16"),
        Parallel(tp=2),
        GenerateJob(prompts=("Hello",), max_new_tokens=32),
        engine="inductor",
    )

Each part checks its own values in ``__post_init__`` and names the command-line flag in its
message; what needs the model (layout, lengths, quantization) is checked by the model's family
(``families/``), before any rank starts and again in each rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from torch_tensorrt_dist.config.jobs import CompileJob, EvalJob, GenerateJob, Job, ServeJob
from torch_tensorrt_dist.engines import ENGINES
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.speculative.config import SpeculativeConfig
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.quantization.scheme import QuantConfig
from torch_tensorrt_dist.validation import check_int

__all__ = [
    "BLOCK_SIZES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_PREFILL_TOKENS",
    "ENGINES",
    "LAYOUTS",
    "MODEL_IMPLS",
    "CacheOptions",
    "Layout",
    "ModelOptions",
    "Parallel",
    "RunConfig",
    "parse_split",
]

#: how the embedding and the LM head are split over the TP ranks
Layout = Literal["vocab_parallel", "replicated"]
LAYOUTS: tuple[Layout, ...] = ("vocab_parallel", "replicated")
#: ``--model-impl``: which model code runs a checkpoint (``families/__init__.py``)
MODEL_IMPLS = ("auto", "native", "transformers")
DEFAULT_BLOCK_SIZE = 16
#: the block sizes a KV cache takes: powers of two (block arithmetic is a shift, and TensorRT's
#: paged KV cache takes powers of two) from 1 (a block per token: exact prefix reuse, large
#: block tables) to 256 (beyond, a request wastes up to a block of cache and a prefix is reused
#: only in large steps)
BLOCK_SIZES = tuple(2**i for i in range(9))
#: the tokens of prompt a step prefills at most: bounds what one step adds to the time between
#: two tokens of the running streams (vLLM's chunked prefill takes 2048 on GPUs)
DEFAULT_MAX_PREFILL_TOKENS = 512


@dataclass(frozen=True)
class ModelOptions:
    """Which weights, in which dtype, and how the vocabulary is split."""

    model: str | None = None
    """``--model``: a checkpoint directory or a preset name; None: the demo checkpoint (or the
    ``tiny`` preset where it is not installed)."""
    artifacts: str | None = None
    """``--artifacts``: a directory of compiled per-rank artifacts (replaces ``model``)."""
    dtype: str = "fp32"
    """``--dtype``: fp32, bf16 or fp16."""
    lm_head: Layout = "vocab_parallel"
    embedding: Layout = "vocab_parallel"
    model_impl: str = "auto"
    """``--model-impl``: ``native`` (our model code), ``transformers`` (transformers' model
    class over our paged cache) or ``auto`` (native where a native family runs the model)."""

    def __post_init__(self) -> None:
        if self.model_impl not in MODEL_IMPLS:
            raise ConfigError(
                f"--model-impl {self.model_impl!r} is not one of {', '.join(MODEL_IMPLS)}"
            )
        if self.artifacts is not None and self.model is not None:
            raise ConfigError("--artifacts replaces --model (the artifacts hold the weights)")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        for flag, value in (("--lm-head", self.lm_head), ("--embedding", self.embedding)):
            if value not in LAYOUTS:
                raise ConfigError(f"{flag} {value!r} is not one of {', '.join(LAYOUTS)}")


@dataclass(frozen=True)
class Parallel:
    """How the ranks split the model: ``pp x ep x tp`` ranks, TP inner (``ep`` > 1: a MoE
    model)."""

    tp: int | None = None
    """Tensor-parallel ranks; None until known (the launcher's world, or the artifacts')."""
    pp: int = 1
    ep: int = 1
    split: tuple[int, ...] | None = None
    """Layers per pipeline stage (None: even)."""

    def __post_init__(self) -> None:
        if (self.tp is not None and self.tp < 1) or self.pp < 1 or self.ep < 1:
            raise ConfigError(
                f"--tp, --pp and --ep must be >= 1, got tp={self.tp} pp={self.pp} ep={self.ep}"
            )

    @property
    def world(self) -> int:
        """The ranks this layout runs on (``tp`` must be known)."""
        if self.tp is None:
            raise ConfigError("the tensor-parallel size is not known yet; give --tp")
        return self.tp * self.pp * self.ep

    def sizes(self) -> dict[str, int]:
        """The flags whose product is the world (``{"pp": 1, "tp": 2}``), for messages."""
        tp = self.world // (self.pp * self.ep)
        if self.ep == 1:
            return {"pp": self.pp, "tp": tp}
        sizes = {"pp": self.pp} if self.pp > 1 else {}
        return sizes | {"ep": self.ep, "tp": tp}


def parse_split(text: str | None) -> tuple[int, ...] | None:
    """``--split 3,5``: layers per pipeline stage (None or empty: even)."""
    if not text:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"--split {text!r} is not a comma-separated list of integers") from None


@dataclass(frozen=True)
class CacheOptions:
    """The KV cache: how many rows, how long, how much memory, in which blocks."""

    max_batch_size: int | None = None
    """Rows decoded together (``serve``; ``generate``: its prompts; None: the command's
    default)."""
    max_seq_len: int | None = None
    """The longest request: prompt + generated tokens (None: the command's default, at most the
    model's positions; more than the model's positions is refused)."""
    kv_cache_memory: int | None = None
    """Bytes of KV cache per rank (None: enough for ``max_batch_size`` rows of
    ``max_seq_len``)."""
    block_size: int | None = None
    """Tokens per KV-cache block (a power of two in [1, 256]; None: the default, or what
    artifacts were compiled with)."""
    max_prefill_tokens: int | None = None
    """Prompt tokens a step prefills at most (chunks of longer prompts); at least a block
    (None: the default, or what artifacts were compiled with)."""
    prefix_caching: bool = True
    """Keep full blocks after their request ends and reuse them for the same prefix."""

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ConfigError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.max_seq_len is not None:  # 0 is refused, not read as "the default"
            check_int(self.max_seq_len, name="--max-seq-len", low=1)
        if self.kv_cache_memory is not None:
            check_int(self.kv_cache_memory, name="--kv-cache-memory", low=1)
        if self.block_size is not None and self.block_size not in BLOCK_SIZES:
            raise ConfigError(
                f"--block-size {self.block_size} is not a power of two in [1, 256]: give one of "
                f"{', '.join(map(str, BLOCK_SIZES))} (default {DEFAULT_BLOCK_SIZE})"
            )
        if self.max_prefill_tokens is not None:
            check_int(self.max_prefill_tokens, name="--max-prefill-tokens", low=1)
        block, budget = self.block, self.prefill_budget
        if budget < block:
            raise ConfigError(
                f"--max-prefill-tokens {budget} is below --block-size {block}: a step must be "
                f"able to prefill a whole block; give at least {block}"
            )

    @property
    def block(self) -> int:
        """``block_size``, or the default where it is not given."""
        return DEFAULT_BLOCK_SIZE if self.block_size is None else self.block_size

    @property
    def prefill_budget(self) -> int:
        """``max_prefill_tokens``, or the default where it is not given."""
        return (
            DEFAULT_MAX_PREFILL_TOKENS
            if self.max_prefill_tokens is None
            else self.max_prefill_tokens
        )


@dataclass(frozen=True)
class RunConfig:
    """Everything a command's ranks need, from the command line (or a program)."""

    command: str
    """``generate``, ``serve``, ``eval`` or ``compile``: names the command in messages."""
    model: ModelOptions
    parallel: Parallel
    job: Job
    """What the ranks do with the model (the command's own options)."""
    engine: str = "eager"
    verify: bool | None = None
    """Check each compiled graph's first call against eager (None: on for tensorrt only)."""
    quantize: QuantConfig | None = None
    cache: CacheOptions = field(default_factory=CacheOptions)
    speculative: SpeculativeConfig | None = None
    """``--speculative`` / ``--num-speculative-tokens`` (generate, serve; None: off)."""
    threads: int | None = None
    """``--threads``: each rank's intra-op threads (None: ``OMP_NUM_THREADS``, else the cores
    given / the ranks on the node; ``runtime/threads.py``)."""

    def __post_init__(self) -> None:
        kinds = {"generate": GenerateJob, "serve": ServeJob, "eval": EvalJob, "compile": CompileJob}
        if not isinstance(self.job, kinds.get(self.command, ())):
            raise ConfigError(f"command {self.command!r} does not run a {type(self.job).__name__}")
        if self.engine not in ENGINES:
            raise ConfigError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.verify and self.engine == "none":
            raise ConfigError("--verify checks a compiled engine; --engine none compiles nothing")
        if self.threads is not None:
            check_int(self.threads, name="--threads", low=1)
        if self.speculative is not None:
            if self.command not in ("generate", "serve"):
                raise ConfigError(f"--speculative is for generate and serve, not {self.command}")
            if self.parallel.pp > 1 or self.model.artifacts is not None:
                raise ConfigError(
                    "--speculative runs a second step graph (the verify call); pipeline stages "
                    "(--pp) and --artifacts do not have it: leave --speculative out there"
                )

    def with_(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)
