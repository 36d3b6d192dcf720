"""The options the commands that start ranks share, and the one reading of them into a
:class:`~torch_tensorrt_dist.config.RunConfig`.

Each command adds the groups it takes (``add_model``, ``add_layout``, ``add_engine``,
``add_quantize``, ``add_kv_cache``, ``add_threads``) and fixes the rest with :func:`absent`,
so every parsed namespace has every field and :func:`run_config` reads them plainly.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from torch_tensorrt_dist.config.jobs import Job
from torch_tensorrt_dist.config.run import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_PREFILL_TOKENS,
    ENGINES,
    LAYOUTS,
    MODEL_IMPLS,
    CacheOptions,
    ModelOptions,
    Parallel,
    RunConfig,
    parse_split,
)
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.speculative.config import SpeculativeConfig
from torch_tensorrt_dist.models.dtypes import DTYPES
from torch_tensorrt_dist.quantization.scheme import quant_config
from torch_tensorrt_dist.validation import parse_size

__all__ = [
    "absent",
    "add_command",
    "add_engine",
    "add_kv_cache",
    "add_layout",
    "add_model",
    "add_quantize",
    "add_speculative",
    "add_threads",
    "run_config",
]

logger = logging.getLogger(__name__)

#: the value of each shared option a command does not take
_ABSENT: dict[str, Any] = {
    "artifacts": None,
    "pp": 1,
    "ep": 1,
    "split": None,
    "verify": None,
    "max_batch_size": None,
    "max_seq_len": None,
    "kv_cache_memory": None,
    "block_size": None,
    "max_prefill_tokens": None,
    "prefix_caching": True,
}


def add_command(subparsers: Any, name: str, help: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of command ``name`` (its module docstring ``doc`` as its description,
    printed as written)."""
    return subparsers.add_parser(
        name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def absent(p: argparse.ArgumentParser, *names: str) -> None:
    """The command takes none of these options: they keep the value a run without them has."""
    p.set_defaults(**{name: _ABSENT[name] for name in names})


def add_model(p: argparse.ArgumentParser, *, artifacts: str | None = None) -> None:
    """``--model``, ``--dtype``, ``--lm-head``, ``--embedding`` (and ``--artifacts``, with its
    help, where the command runs them)."""
    p.add_argument(
        "--model",
        default=None,
        help="HF checkpoint directory or preset name (default: the demo checkpoint)",
    )
    if artifacts is not None:
        p.add_argument("--artifacts", default=None, metavar="DIR", help=artifacts)
    else:
        absent(p, "artifacts")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    p.add_argument(
        "--model-impl",
        choices=MODEL_IMPLS,
        default="auto",
        help="native: our model code (llama, mistral, qwen2, MoE); transformers: transformers' "
        "model class over our paged KV cache (any causal LM it ships); auto: native where "
        "a native family runs the model_type, else transformers",
    )
    p.add_argument(
        "--lm-head",
        choices=LAYOUTS,
        default="vocab_parallel",
        help="vocab_parallel: each TP rank holds 1/tp of the LM head, logits all-gathered",
    )
    p.add_argument(
        "--embedding",
        choices=LAYOUTS,
        default="vocab_parallel",
        help="vocab_parallel: each TP rank holds 1/tp of the embedding, rows all-reduced; "
        "replicated: no collective, the whole matrix on every rank",
    )


def add_layout(
    p: argparse.ArgumentParser, *, pp: str | None, ep: bool, pipeline: bool = False
) -> None:
    """``--tp``; ``--pp`` (with its help) and ``--ep`` where the command takes them, and
    ``--split`` (``pipeline``)."""
    p.add_argument(
        "--tp",
        type=int,
        default=None,
        help="tensor-parallel ranks (default: the launcher's ranks / (pp x ep) under a "
        "launcher, else 1)",
    )
    if pp is not None:
        p.add_argument("--pp", type=int, default=1, help=pp)
    else:
        absent(p, "pp")
    if ep:
        p.add_argument(
            "--ep",
            type=int,
            default=1,
            help="expert-parallel ranks for a MoE checkpoint (default 1); ep x tp ranks, TP inner",
        )
    else:
        absent(p, "ep")
    if not pipeline:
        absent(p, "split")
        return
    p.add_argument(
        "--split",
        default=None,
        help="layers per pipeline stage, comma-separated (default: even), e.g. 3,5",
    )


def add_engine(
    p: argparse.ArgumentParser,
    *,
    choices: tuple[str, ...] = ENGINES,
    default: str = "eager",
    verify: bool = True,
) -> None:
    """``--engine`` (and ``--verify``); ``default="auto"``: the fastest engine that runs here
    (:func:`fastest_engine`), resolved by :func:`run_config`."""
    told = (
        "auto: tensorrt where TensorRT and Torch-TensorRT load, else inductor"
        if default == "auto"
        else default
    )
    p.add_argument(
        "--engine",
        choices=(*choices, "auto") if default == "auto" else choices,
        default=default,
        help="tensorrt | inductor | eager (compiled FX, the reference) | none (plain PyTorch, "
        f"no torch.compile); default {told}",
    )
    if not verify:
        absent(p, "verify")
        return
    p.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check each compiled graph's first call against the eager run of the same "
        "graph (collectives through c10d) and stop on every rank on a mismatch (default: on "
        "for --engine tensorrt, off otherwise)",
    )


def add_quantize(p: argparse.ArgumentParser) -> None:
    """``--quantize``, ``--group-size``, ``--quantize-embeddings``."""
    p.add_argument(
        "--quantize",
        default=None,
        metavar="{int8,int4}",
        help="weight-only quantization of the decoder's linears, applied on each rank to the "
        "slices it holds: int8 (one scale per output channel) or int4 (groups along the input)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="int4: weights per scale along the input dimension, 32, 64 or 128 (default 128; "
        "--engine tensorrt takes 64 or 128); must divide each rank's slice of a row-parallel "
        "weight",
    )
    p.add_argument(
        "--quantize-embeddings",
        action="store_true",
        help="also quantize the embedding and LM head (int8, one scale per vocabulary row); "
        "by default they stay in the model dtype",
    )


def add_kv_cache(
    p: argparse.ArgumentParser,
    *,
    max_seq_len: str | None,
    max_batch_size: str | None = None,
    prefix_caching: bool = True,
) -> None:
    """The KV cache's memory, blocks, prefill budget (and prefix reuse, where the command runs
    requests); ``--max-seq-len`` and ``--max-batch-size`` (with their help) where the command
    takes them."""
    for flag, help_ in (("--max-batch-size", max_batch_size), ("--max-seq-len", max_seq_len)):
        if help_ is not None:
            p.add_argument(flag, type=int, default=None, help=help_)
        else:
            absent(p, flag[2:].replace("-", "_"))
    p.add_argument(
        "--kv-cache-memory",
        default=None,
        metavar="SIZE",
        help="KV-cache memory per rank: bytes (1073741824) or a number with a unit, KiB MiB GiB "
        "TiB (powers of 1024) or KB MB GB TB (powers of 1000), any case, e.g. 4GiB (default: "
        "enough blocks for every row at the longest request)",
    )
    p.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="tokens per KV-cache block, a power of two in [1, 256] (default "
        f"{DEFAULT_BLOCK_SIZE}; --artifacts: the compiled one)",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=None,
        help="a step's prefill budget: this many prompt tokens at a prompt's start, fewer "
        "further into a long prompt (their attention counts); longer prompts are prefilled in "
        "chunks while the running rows keep decoding (default "
        f"{DEFAULT_MAX_PREFILL_TOKENS}; at least --block-size)",
    )
    if not prefix_caching:
        return
    p.add_argument(
        "--prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep full KV-cache blocks after their request ends and reuse them for requests "
        "that start with the same tokens (default on)",
    )


def add_speculative(p: argparse.ArgumentParser) -> None:
    """``--speculative``, ``--draft-model`` and ``--num-speculative-tokens`` (generate,
    serve)."""
    p.add_argument(
        "--speculative",
        default=None,
        metavar="METHOD",
        help="speculative decoding: ngram (prompt lookup: a row's last tokens matched in its "
        "prompt and output propose the tokens that followed) or draft (a smaller model's "
        "greedy tokens, --draft-model); the model verifies them in one step, exactly; "
        "default off",
    )
    p.add_argument(
        "--draft-model",
        default=None,
        metavar="PATH",
        help="--speculative draft: the draft model's checkpoint (the target's tokenizer, "
        "smaller; loaded and split as the target)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        metavar="K",
        help="most tokens proposed per row and step, in [1, 16] (default 4; lower where a "
        "row's proposals are refused)",
    )


def speculative_config(ns: argparse.Namespace) -> SpeculativeConfig | None:
    """The ``--speculative`` options of a command line (None: off; ConfigError naming the
    option)."""
    method, k = getattr(ns, "speculative", None), getattr(ns, "num_speculative_tokens", None)
    path = getattr(ns, "draft_model", None)
    if method is None:
        if k is not None:
            raise ConfigError("--num-speculative-tokens needs --speculative ngram or draft")
        if path is not None:
            raise ConfigError("--draft-model needs --speculative draft")
        return None
    if method == "draft" and path is None:
        raise ConfigError("--speculative draft needs --draft-model PATH")
    return SpeculativeConfig(method=method, num_tokens=4 if k is None else k, draft_model=path)


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads of each rank (default: $OMP_NUM_THREADS, else the cores this "
        "process may run on / the ranks on this node)",
    )


def _tp(ns: argparse.Namespace) -> int | None:
    """``--tp``, else the launcher's ranks / (pp x ep), else 1 (``--artifacts``: the
    manifest's, read later)."""
    from torch_tensorrt_dist.cli._failures import world_size
    from torch_tensorrt_dist.runtime import is_launched

    if ns.tp is not None or ns.artifacts is not None:
        return int(ns.tp) if ns.tp is not None else None
    if not is_launched(os.environ):
        return 1
    return max(1, world_size() // max(1, ns.pp * ns.ep))


def fastest_engine() -> str:
    """``--engine auto``: ``tensorrt`` where TensorRT and Torch-TensorRT load (tried in a child
    process: the launcher stays free of CUDA state), else ``inductor``; the eager engine stays
    the reference that ``--verify`` and the tests use."""
    from torch_tensorrt_dist.conversion.availability import tensorrt_engine_missing

    missing = tensorrt_engine_missing(isolated=True)
    logger.info("--engine auto: %s", "tensorrt" if missing is None else f"inductor ({missing})")
    return "tensorrt" if missing is None else "inductor"


def run_config(ns: argparse.Namespace, job: Job) -> RunConfig:
    """The run configuration of a parsed command line (every value checked)."""
    model = ModelOptions(
        ns.model, ns.artifacts, ns.dtype, ns.lm_head, ns.embedding, model_impl=ns.model_impl
    )
    parallel = Parallel(_tp(ns), ns.pp, ns.ep, parse_split(ns.split))
    memory = ns.kv_cache_memory
    cache = CacheOptions(
        max_batch_size=ns.max_batch_size,
        max_seq_len=ns.max_seq_len,
        kv_cache_memory=None if memory is None else parse_size(memory, name="--kv-cache-memory"),
        block_size=ns.block_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        prefix_caching=ns.prefix_caching,
    )
    return RunConfig(
        ns.command,
        model,
        parallel,
        job,
        engine=fastest_engine() if ns.engine == "auto" else ns.engine,
        verify=ns.verify,
        quantize=quant_config(ns.quantize, ns.group_size, ns.quantize_embeddings),
        speculative=speculative_config(ns),
        cache=cache,
        threads=ns.threads,
    )
