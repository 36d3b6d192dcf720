"""Greedy tokens at TP 2 and 4 (gloo) equal TP 1 and transformers' own generate.

One spawn per world size runs every case (checkpoints with GQA, q/k/v bias, tied embeddings,
KV-head replication, a sliding window; both LM-head layouts; the ``eager`` engine through the
backend; sampling), and the tests below check its parts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.testing import run_on_ranks

from . import _llama_ckpt
from ._core_fns import one_thread

pytest.importorskip("transformers")

NAMES = ("llama_gqa", "qwen2_tied", "mistral_window")
PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]  # different lengths: left padding
MAX_NEW = 10
SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("llama")
    out: dict[str, Any] = {}
    for name in NAMES:
        path = root / name
        hf = _llama_ckpt.save_checkpoint(name, path, shard_kb=60 if name == "llama_gqa" else None)
        with one_thread():  # as the ranks run: two threads spin-wait on a busy 2-core machine
            greedy = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
        out[name] = {"path": str(path), "hf": greedy}
    return out


def _spec(ckpts: dict[str, Any], world: int) -> dict[str, Any]:
    gen = [
        {"path": ckpts[n]["path"], "batches": [PROMPTS], "max_new_tokens": MAX_NEW} for n in NAMES
    ]
    gen.append(
        {
            "path": ckpts["qwen2_tied"]["path"],
            "batches": [PROMPTS],
            "max_new_tokens": MAX_NEW,
            "lm_head": "replicated",
        }
    )
    gen.append(
        {
            "path": ckpts["llama_gqa"]["path"],
            "batches": [PROMPTS],
            "max_new_tokens": MAX_NEW,
            "sampling": SAMPLING,
        }
    )
    # the eager engine through the backend (at tp 2 only: compiling on 4 ranks sharing 2 CPU
    # cores is slow); a second batch with other lengths in the same bucket reuses both graphs
    if world == 2:
        gen.append(
            {
                "path": ckpts["llama_gqa"]["path"],
                "engine": "eager",
                "max_new_tokens": MAX_NEW,
                "batches": [PROMPTS, [PROMPTS[1][:7], PROMPTS[0][:2]]],
            }
        )
    # tied embeddings in every layout of the embedding and the head (vocab 130: the last
    # shard is padded at tp 4)
    modes = ("vocab_parallel", "replicated")
    logits = [(ckpts["qwen2_tied"]["path"], head, emb) for head in modes for emb in modes]
    return {"generate": gen, "logits": logits}


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def suite(request: pytest.FixtureRequest, ckpts: dict[str, Any]) -> tuple[int, list[Any]]:
    world = request.param
    return world, run_on_ranks(_llama_ckpt.rank_suite, world, _spec(ckpts, world), timeout=240)


def _tp1(path: str, prompts: list[list[int]], sampling: SamplingConfig | None = None) -> Any:
    model = load_llama(path, progress=False)
    gen = Generator(model, max_batch_size=len(prompts), cache_len=64)
    with one_thread():
        return gen.generate(prompts, max_new_tokens=MAX_NEW, sampling=sampling).tokens


def test_tp1_batch_equals_transformers_generate(ckpts: dict[str, Any]) -> None:
    for name in NAMES:
        assert _tp1(ckpts[name]["path"], PROMPTS) == ckpts[name]["hf"], name


def test_greedy_tokens_equal_tp1_and_transformers(
    suite: tuple[int, list[Any]], ckpts: dict[str, Any]
) -> None:
    world, results = suite
    for rank in range(world):
        jobs = results[rank]["generate"]
        for name, job in zip(NAMES, jobs):
            assert job["tokens"] == [ckpts[name]["hf"]], (world, rank, name)
        assert jobs[3]["tokens"] == [ckpts["qwen2_tied"]["hf"]]  # replicated LM head


def test_sampling_is_identical_on_every_rank(
    suite: tuple[int, list[Any]], ckpts: dict[str, Any]
) -> None:
    world, results = suite
    expected = _tp1(ckpts["llama_gqa"]["path"], PROMPTS, SamplingConfig(**SAMPLING))
    assert expected != ckpts["llama_gqa"]["hf"]  # it did sample
    for rank in range(world):
        assert results[rank]["generate"][4]["tokens"] == [expected]


def test_eager_engine_two_graphs_and_no_recompile(
    suite: tuple[int, list[Any]], ckpts: dict[str, Any]
) -> None:
    world, results = suite
    if world != 2:
        pytest.skip("the eager-engine job runs at tp 2 only")
    second = _tp1(ckpts["llama_gqa"]["path"], [PROMPTS[1][:7], PROMPTS[0][:2]])
    for rank in range(world):
        job = results[rank]["generate"][5]
        assert job["tokens"] == [ckpts["llama_gqa"]["hf"], second]
        assert job["graphs"] == 2  # one prefill graph (bucket 16), one decode graph


def test_sharded_logits_equal_unsharded(
    suite: tuple[int, list[Any]], ckpts: dict[str, Any]
) -> None:
    world, results = suite
    ref_prefill, ref_decode = _llama_ckpt._prefill_decode(
        load_llama(ckpts["qwen2_tied"]["path"], progress=False)
    )
    heads = (4 // world, 1)  # 2 KV heads: split at tp 2, replicated at tp 4
    shard = -(-130 // world)  # vocab 130: rows per rank, the last shard padded
    # (lm_head, embedding) -> (embedding rows, separate head rows or None when it reads the
    # embedding's matrix): tied and both vocab-parallel share one 1/tp matrix
    rows = [(shard, None), (130, shard), (shard, 130), (130, None)]
    for rank in range(world):
        for res, (emb_rows, head_rows) in zip(results[rank]["logits"], rows, strict=True):
            assert tuple(res["heads"]) == heads and res["wk"] == [16, 64]
            assert (res["embedding_rows"], res["head_rows"]) == (emb_rows, head_rows)
            torch.testing.assert_close(torch.tensor(res["prefill"]), ref_prefill, atol=1e-5, rtol=0)
            torch.testing.assert_close(torch.tensor(res["decode"]), ref_decode, atol=1e-5, rtol=0)


def test_inductor_engine_with_kv_cache_equals_transformers(ckpts: dict[str, Any]) -> None:
    """Inductor compiles prefill and decode (KV-cache writes are buffer mutations in the graph).

    One process: the Inductor engine with collectives at TP 2 is covered by
    test_multirank_numerics.py, and by ``torchtrt-dist bench --section decode`` for this model.
    """
    torch._dynamo.reset()
    model = load_llama(ckpts["qwen2_tied"]["path"], progress=False)
    gen = Generator(model, engine="inductor", max_batch_size=len(PROMPTS), cache_len=64)
    with recording() as graphs:
        tokens = gen.generate(PROMPTS, max_new_tokens=MAX_NEW).tokens
    assert tokens == ckpts["qwen2_tied"]["hf"]
    assert len(graphs) == 2  # one prefill graph, one decode graph for every step
