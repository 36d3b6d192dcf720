"""The Inductor engine's CPU products (``CompileSettings.cpu_gemm``): which inputs are weights
of products, the settings' values, and ``reduce`` at TP 2 against transformers (one rank:
tests/test_row_products.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import torch_tensorrt_dist  # noqa: F401  (registers the backend)
from torch_tensorrt_dist.backend import CompileSettings
from torch_tensorrt_dist.backend.row_products import gemm_weights
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.parallel.llama_load import load_llama

from . import _llama_ckpt

PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]
MAX_NEW = 10


def test_only_float_matrices_that_are_parameters_are_taken():
    w = torch.nn.Parameter(torch.randn(4, 4))
    inputs = [
        w,
        torch.randn(4, 4),  # an activation or a buffer: stays an input
        torch.nn.Parameter(torch.randn(4)),  # a bias
        torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False),
        torch.nn.Parameter(torch.randn(4, 4, dtype=torch.bfloat16)),
    ]
    assert gemm_weights(inputs) == [0, 4]


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="cpu_gemm='fast' is not one of aten, reduce"):
        CompileSettings(engine="inductor", cpu_gemm="fast")
    with pytest.raises(ConfigError, match="applies to engine='inductor' only"):
        CompileSettings(engine="eager", cpu_gemm="reduce")


def _tp_rank(rank: int, world: int, path: str, cpu_gemm: str) -> dict[str, Any]:
    import torch.distributed as dist

    torch._dynamo.reset()
    counters.clear()
    model = load_llama(path, group=dist.group.WORLD, progress=False)
    gen = Generator(
        model, engine="inductor", max_batch_size=len(PROMPTS), cache_len=64, cpu_gemm=cpu_gemm
    )
    tokens = gen.generate(PROMPTS, max_new_tokens=MAX_NEW).tokens
    return {"tokens": tokens, "used": counters["torch_tensorrt_dist"]["reduced_products"]}


def test_tp2_tokens_equal_transformers(tmp_path):
    """Two gloo ranks, each with its shard's weights (row-major for the reductions,
    ``backend/row_products.py``), the collectives in the same graph: the same greedy tokens
    as the unsharded model in HF transformers."""
    pytest.importorskip("transformers")
    from torch_tensorrt_dist.testing import run_on_ranks

    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path / "ckpt")
    want = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
    results = run_on_ranks(_tp_rank, 2, str(tmp_path / "ckpt"), "reduce", timeout=300)
    for rank, res in enumerate(results):
        assert res["tokens"] == want, rank
        assert res["used"] > 0, rank
