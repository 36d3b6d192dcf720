"""The transformers family at TP 2 (one spawn of two gloo ranks for every model): each model
sharded by its own ``base_model_tp_plan`` gives HF's greedy tokens on both ranks, a rank
reads half the checkpoint plus what the plan replicates, the KV-cache estimate checked
before the ranks start (``check_kv_cache``) is what a rank's pools hold, and llama quantized
(int8, int4) gives the native family's tokens quantized alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import safetensors

from tests import _hf_ckpt
from torch_tensorrt_dist.testing.checkpoints import hf_greedy
from torch_tensorrt_dist.testing.multiprocess import run_on_ranks

pytestmark = pytest.mark.transformers

NEW = 8
#: (model_type, engine). llama / qwen3: colwise-rowwise pairs; gemma2: a tied head,
#: soft-capping, windows; phi3: fused qkv and gate_up gathered; deepseek_v3: MLA's split
#: projections, its routed experts (replicated by its plan) fused at load; llama again compiled
#: through our backend (the plan's collectives in the graph, the head's logits gathered)
JOBS = (
    ("llama", "none"),
    ("qwen3", "none"),
    ("gemma2", "none"),
    ("phi3", "none"),
    ("deepseek_v3", "none"),
    ("llama", "eager"),
)
#: weight-only quantization at TP 2: the transformers family's tokens equal the native
#: family's, quantized alike, on the same llama checkpoint (job options, scheme and group)
QUANTIZED = (("int8",), ("int4", 32))


def _replicated_bytes(path: Path) -> int:
    """The bytes of the checkpoint's 1-D tensors (norms: every rank reads them whole)."""
    total = 0
    with safetensors.safe_open(path / "model.safetensors", "pt") as f:
        for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
            t = f.get_slice(name)
            if len(t.get_shape()) == 1:
                total += t.get_shape()[0] * 4
    return total


@pytest.mark.timeout(600)  # six models on two ranks: 375 s measured at load 10
def test_tp2_exact_and_half_the_bytes(tmp_path: Path) -> None:
    jobs, refs, made = [], [], {}
    for kind, engine in JOBS:
        if kind not in made:
            path, model = _hf_ckpt.save(kind, tmp_path)
            made[kind] = path, hf_greedy(model, _hf_ckpt.PROMPTS, NEW)
        path, ref = made[kind]
        refs.append(ref)
        jobs.append(dict(path=str(path), engine=engine, prompts=_hf_ckpt.PROMPTS, new=NEW))
    for quantize in QUANTIZED:  # the transformers family's job, then the native family's
        jobs += [dict(jobs[0], impl=impl, quantize=quantize) for impl in ("transformers", "native")]
    results: Any = run_on_ranks(_hf_ckpt.tp_rank_generate, 2, jobs, timeout=600)
    n = 2 * len(QUANTIZED)
    for r0, r1 in zip(results[0][-n::2], results[0][-n + 1 :: 2], strict=True):
        assert r0["tokens"] == r1["tokens"], "quantized: transformers' tokens != native's"
    assert [r["tokens"] for r in results[0][-n:]] == [r["tokens"] for r in results[1][-n:]]
    results, jobs = [r[:-n] for r in results], jobs[:-n]
    kinds = [kind for kind, _ in JOBS]
    for kind, ref, job, r0, r1 in zip(kinds, refs, jobs, results[0], results[1], strict=True):
        assert r0["tokens"] == ref == r1["tokens"], kind
        path = Path(job["path"])
        size = (path / "model.safetensors").stat().st_size
        assert r0["bytes_read"] == r1["bytes_read"] < size, kind
        pools, estimate = r0["kv_bytes"]  # phi3: every KV head on every rank (gathered qkv)
        assert pools == estimate == r1["kv_bytes"][0], kind
        if kind in ("llama", "qwen3"):  # every 2-D weight split in two, the norms whole
            assert r0["bytes_read"] <= size / 2 + _replicated_bytes(path), kind
