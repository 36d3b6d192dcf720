"""Pipeline x tensor parallel generation on 4 gloo ranks equals the single-process model.

One spawn of 4 ranks runs every job: pp 2 x tp 2 through the ``eager`` engine with 2
microbatches of one row (one prefill and one decode graph per rank for both, TP collectives on
the stage's TP group), pp 2 x tp 2 sampling, a tied LM head on the last stage, pp 4 x tp 1 with
a stop token (middle stages learn of the stop from the headers), 4 microbatches finishing at
different steps, and wrong meshes.
"""

from __future__ import annotations

from typing import Any

import pytest

from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.testing import run_on_ranks

from . import _llama_ckpt, _pipeline_fns

pytest.importorskip("transformers")

PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]  # two lengths: left padding
FOUR = [*PROMPTS, [1, 2, 3], [9, 9, 8, 7, 6, 5]]
MAX_NEW = 8
SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 20, "seed": 3}
LAYERS = 4


def _tp1(path: str, prompts: list[list[int]], **kw: Any) -> list[list[int]]:
    gen = Generator(load_llama(path, progress=False), max_batch_size=len(prompts), cache_len=64)
    return gen.generate(prompts, max_new_tokens=MAX_NEW, **kw).tokens


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pp")
    gqa, tied = str(root / "gqa"), str(root / "tied")
    hf = _llama_ckpt.save_checkpoint("llama_gqa", root / "gqa", num_hidden_layers=LAYERS)
    _llama_ckpt.save_checkpoint("qwen2_tied", root / "tied", num_hidden_layers=LAYERS)
    greedy = _tp1(gqa, PROMPTS)
    stop = greedy[0][3]  # row 0 stops at its 4th token
    four = _tp1(gqa, FOUR, stop_ids=[stop])
    common = {"max_new_tokens": MAX_NEW, "cache_len": 64}
    jobs = [
        {"path": gqa, "prompts": PROMPTS, "pp": 2, "tp": 2, "engine": "eager", **common},
        {
            "path": gqa,
            "prompts": PROMPTS,
            "pp": 2,
            "tp": 2,
            "engine": "none",
            "sampling": SAMPLING,
            "microbatches": 1,
            **common,
        },
        {"path": tied, "prompts": PROMPTS, "pp": 2, "tp": 2, "engine": "none", **common},
        {
            "path": gqa,
            "prompts": PROMPTS[:1],
            "pp": 4,
            "tp": 1,
            "engine": "none",
            "stop_ids": [stop],
            **common,
        },
        {"path": gqa, "prompts": PROMPTS, "pp": 3, "tp": 2, "expect_error": True, **common},
        {
            "path": gqa,
            "prompts": FOUR,
            "pp": 4,
            "tp": 1,
            "engine": "none",
            "stop_ids": [stop],
            **common,
        },
        {
            "path": gqa,
            "prompts": PROMPTS,
            "pp": 2,
            "tp": 2,
            "split": [1, 2],
            "expect_error": True,
            **common,
        },
    ]
    results = run_on_ranks(_pipeline_fns.pipeline_suite, 4, jobs, timeout=240)
    return {
        "results": results,
        "greedy": greedy,
        "hf": [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS],
        "sampled": _tp1(gqa, PROMPTS, sampling=SamplingConfig(**SAMPLING)),
        "tied": _tp1(tied, PROMPTS),
        "stop": stop,
        "four": four,
    }


def test_pp2_tp2_greedy_equals_tp1_and_transformers(run: dict[str, Any]) -> None:
    assert run["greedy"] == run["hf"]
    for rank in range(4):
        job = run["results"][rank][0]
        assert job["tokens"] == run["greedy"], rank
        assert job["steps"] == MAX_NEW - 1


def test_pp2_tp2_one_prefill_and_one_decode_graph_on_the_stage_tp_group(
    run: dict[str, Any],
) -> None:
    for rank in range(4):
        job = run["results"][rank][0]
        assert job["graphs"] == 2, rank  # prefill (bucket 16) + decode, no graph break
        tp_group = (0, 1) if rank < 2 else (2, 3)
        assert job["collective_groups"] == [tp_group], rank


def test_pp2_tp2_sampling_equals_tp1(run: dict[str, Any]) -> None:
    assert run["sampled"] != run["greedy"]  # it did sample
    for rank in range(4):
        assert run["results"][rank][1]["tokens"] == run["sampled"], rank


def test_tied_head_on_last_stage(run: dict[str, Any]) -> None:
    for rank in range(4):
        assert run["results"][rank][2]["tokens"] == run["tied"], rank


def test_pp4_stop_token_reaches_every_stage(run: dict[str, Any]) -> None:
    expected = run["greedy"][0][:4]
    assert expected[-1] == run["stop"]
    for rank in (0, 3):  # first and last stage hold the tokens
        assert run["results"][rank][3]["tokens"] == [expected], rank
    for rank in (1, 2):  # middle stages never see tokens, but stopped in step
        assert run["results"][rank][3]["tokens"] == [[]], rank
    for rank in range(4):
        assert run["results"][rank][3]["steps"] == 3, rank


def test_wrong_mesh_and_split_errors(run: dict[str, Any]) -> None:
    for rank in range(4):
        mesh_err, split_err = run["results"][rank][4], run["results"][rank][6]
        assert mesh_err["error"] == "ConfigError"
        assert "pp=3 x tp=2 needs 6 ranks, but the world size is 4" in mesh_err["message"]
        assert "pp=2 tp=2" in mesh_err["message"]
        assert split_err["error"] == "ConfigError"
        assert "covers 3 layers, but the model has 4" in split_err["message"]


def test_pp4_four_microbatches_stopping_at_different_steps(run: dict[str, Any]) -> None:
    lengths = {len(row) for row in run["four"]}
    assert len(lengths) > 1  # the rows do stop at different steps
    for rank in (0, 3):
        assert run["results"][rank][5]["tokens"] == run["four"], rank
    steps = {run["results"][rank][5]["steps"] for rank in range(4)}
    assert steps == {max(lengths) - 1}
