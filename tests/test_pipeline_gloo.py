"""Pipeline stages on the generation core, on 4 gloo ranks, equal the single-process model.

One spawn of 4 ranks runs every job: pp 2 x tp 2 through the ``eager`` engine (one graph per
shape class on each rank, TP collectives on the stage's TP group only, KV writes in place),
pp 2 x tp 2 sampling, a tied LM head on the last stage, pp 4 x tp 1 with a stop token and with
rows that finish at different steps (every rank holds every token), a serving schedule at
pp 2 x tp 2 with chunked prefill, a cancel, a sampled request and a pool so small that
requests are preempted, a Mixtral schedule at pp 2 x ep 2 (compiled: each MoE all-reduce on
its stage's EP group), int8 weight-only stages, and wrong meshes and splits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.parallel.moe_load import load_moe
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model
from torch_tensorrt_dist.testing import run_on_ranks

from . import _llama_ckpt, _moe_ckpt, _pipeline_fns
from ._core_fns import CACHE_LEN, CORE, ROWS, Job, alone, one_thread

pytest.importorskip("transformers")

PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]  # two lengths
FOUR = [*PROMPTS, [1, 2, 3], [9, 9, 8, 7, 6, 5]]
MAX_NEW = 8
SAMPLING: dict[str, Any] = {"temperature": 0.9, "top_k": 20, "seed": 3}
LAYERS = 4
SCHEDULE = [
    Job(0, [3, 5, 7, 9, 11], 14),
    Job(1, [4, 8, 15, 16, 23, 42, 7, 1, 2], 5),
    Job(1, list(range(10, 30)), 8),  # 3 chunks of 8
    Job(2, [99], 11),
    Job(3, [7, 7, 7], 20, cancel_at=22),
    Job(5, [50, 60, 70, 80], 7, sampling={"temperature": 0.8, "top_p": 0.9, "seed": 5}),
]
LONG = [Job(i, [20 + i, 3, 9, 11, 4, 6, 8, 2, 5, 7], 40) for i in range(3)]  # 13 blocks each
#: the schedules' generator: 3 rows, blocks of 4 tokens, 8 prefill tokens per step
SCHEDULE_GEN = {"max_batch_size": ROWS, "cache_len": CACHE_LEN, **CORE}


def _tp1(model: Any, prompts: list[list[int]], **kw: Any) -> list[list[int]]:
    gen = Generator(model, max_batch_size=len(prompts), cache_len=64)
    with one_thread():
        return gen.generate(prompts, max_new_tokens=MAX_NEW, **kw).tokens


def _alone(model: Any, jobs: list[Job]) -> list[list[int]]:
    single = Generator(model, max_batch_size=1, cache_len=CACHE_LEN)
    with one_thread():
        return [alone(single, job, ()) for job in jobs]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The references in this process (transformers, the int8 quantization) on one torch thread
    too, as each launched rank runs: on a busy 2-core machine two threads spin-wait (up to 20x
    slower); the same values."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pp")
    gqa, tied, moe = str(root / "gqa"), str(root / "tied"), str(root / "mixtral")
    hf = _llama_ckpt.save_checkpoint("llama_gqa", root / "gqa", num_hidden_layers=LAYERS)
    _llama_ckpt.save_checkpoint("qwen2_tied", root / "tied", num_hidden_layers=LAYERS)
    _moe_ckpt.save_checkpoint("mixtral", root / "mixtral")
    whole = load_llama(gqa, progress=False)
    greedy = _tp1(whole, PROMPTS)
    stop = greedy[0][3]  # row 0 stops at its 4th token
    quantized = load_llama(gqa, progress=False)
    quantize_model(quantized, QuantConfig("int8"), engine="none")
    common = {"max_new_tokens": MAX_NEW, "gen": {"max_batch_size": 4, "cache_len": 64}}
    long_gen = {"gen": {**SCHEDULE_GEN, "kv_blocks": 16}}
    jobs: list[dict[str, Any]] = [
        {"path": gqa, "prompts": PROMPTS, "pp": 2, "engine": "eager", **common},
        {"path": gqa, "prompts": PROMPTS, "pp": 2, "sampling": SAMPLING, **common},
        {"path": tied, "prompts": PROMPTS, "pp": 2, **common},
        {"path": gqa, "prompts": PROMPTS[:1], "pp": 4, "stop_ids": [stop], **common},
        {"path": gqa, "prompts": FOUR, "pp": 4, "stop_ids": [stop], **common},
        {"path": gqa, "schedule": [asdict(j) for j in SCHEDULE], "pp": 2, "gen": SCHEDULE_GEN},
        {"path": gqa, "schedule": [asdict(j) for j in LONG], "pp": 2, **long_gen},
        {
            "path": moe,
            "schedule": [asdict(j) for j in SCHEDULE[:5]],
            "pp": 2,
            "ep": 2,
            "engine": "eager",
            "gen": SCHEDULE_GEN,
        },
        {"path": gqa, "prompts": PROMPTS, "pp": 4, "quantize": "int8", **common},
        {"path": gqa, "prompts": PROMPTS, "pp": 3, "tp": 2, "expect_error": True, **common},
        {"path": gqa, "prompts": PROMPTS, "pp": 2, "split": [1, 2], "expect_error": True, **common},
    ]
    results = run_on_ranks(_pipeline_fns.pipeline_suite, 4, jobs, timeout=300)
    mixtral = load_moe(moe, progress=False)
    return {
        "results": results,
        "greedy": greedy,
        "hf": [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS],
        "sampled": _tp1(whole, PROMPTS, sampling=SamplingConfig(**SAMPLING)),
        "tied": _tp1(load_llama(tied, progress=False), PROMPTS),
        "stop": stop,
        "four": _tp1(whole, FOUR, stop_ids=[stop]),
        "schedule": _alone(whole, SCHEDULE),
        "long": _alone(whole, LONG),
        "moe": _alone(mixtral, SCHEDULE[:5]),
        "int8": _tp1(quantized, PROMPTS),
    }


def _job(run: dict[str, Any], index: int) -> list[Any]:
    """Job ``index``'s result on every rank."""
    return [run["results"][rank][index] for rank in range(4)]


def test_pp2_tp2_greedy_equals_tp1_and_transformers(run: dict[str, Any]) -> None:
    assert run["greedy"] == run["hf"]
    for job in _job(run, 0):
        assert job["tokens"] == run["greedy"]
        assert job["steps"] == MAX_NEW - 1


def test_pp2_tp2_one_graph_per_shape_class_on_the_stage_tp_group(run: dict[str, Any]) -> None:
    for rank, job in enumerate(_job(run, 0)):
        assert job["graphs"] == 2, rank  # prefill and decode of 2 rows, no graph break
        tp_group = (0, 1) if rank < 2 else (2, 3)
        assert job["collective_groups"] == [tp_group], rank  # nothing across stages inside
        assert job["in_place"], rank  # every KV block write in place


def test_pp2_tp2_sampling_equals_tp1(run: dict[str, Any]) -> None:
    assert run["sampled"] != run["greedy"]  # it did sample
    for job in _job(run, 1):
        assert job["tokens"] == run["sampled"]


def test_tied_head_on_last_stage(run: dict[str, Any]) -> None:
    for job in _job(run, 2):
        assert job["tokens"] == run["tied"]


def test_pp4_stop_token_and_rows_finishing_apart_on_every_rank(run: dict[str, Any]) -> None:
    expected = run["greedy"][0][:4]
    assert expected[-1] == run["stop"]
    for job in _job(run, 3):  # every rank samples from the broadcast logits: all hold tokens
        assert job["tokens"] == [expected] and job["steps"] == 3
    lengths = {len(row) for row in run["four"]}
    assert len(lengths) > 1  # the rows do stop at different steps
    for job in _job(run, 4):
        assert job["tokens"] == run["four"]


def _check_schedule(jobs: list[Job], refs: list[list[int]], result: dict[str, Any]) -> None:
    for job, got, ref in zip(jobs, result["tokens"], refs, strict=True):
        if job.cancel_at is None:
            assert got == ref, job
        else:  # cut where the client went away
            assert 0 < len(got) < len(ref) and got == ref[: len(got)], job
    assert result["most_running"] == ROWS
    assert result["pool"]["used"] == 0  # every block came back


def test_pp2_tp2_schedule_equals_each_prompt_alone(run: dict[str, Any]) -> None:
    """Chunked prefill, a cancel, a sampled request and a row waiting for a slot."""
    results = _job(run, 5)
    for result in results:
        _check_schedule(SCHEDULE, run["schedule"], result)
    assert all(r == results[0] for r in results)  # the same plans and blocks on every rank


def test_pp2_tp2_preemption_keeps_every_token(run: dict[str, Any]) -> None:
    for result in _job(run, 6):
        assert result["preemptions"] > 0
        _check_schedule(LONG, run["long"], result)


def test_mixtral_pp2_ep2_schedule_equals_each_prompt_alone(run: dict[str, Any]) -> None:
    for rank, result in enumerate(_job(run, 7)):
        _check_schedule(SCHEDULE[:5], run["moe"], result)
        moe_group = (0, 1) if rank < 2 else (2, 3)  # each stage's EP x TP group
        assert result["collective_groups"] == [moe_group], rank


def test_int8_stages_equal_the_int8_whole_model(run: dict[str, Any]) -> None:
    """Each stage quantizes its own layers: the same int8 rows and scales as the whole model."""
    for job in _job(run, 8):
        assert job["tokens"] == run["int8"]


def test_wrong_mesh_and_split_errors(run: dict[str, Any]) -> None:
    for mesh_err, split_err in zip(_job(run, 9), _job(run, 10), strict=True):
        assert mesh_err["error"] == "ConfigError"
        assert "pp=3 x tp=2 needs 6 ranks, but the world size is 4" in mesh_err["message"]
        assert "pp=2 tp=2" in mesh_err["message"]
        assert split_err["error"] == "ConfigError"
        assert "covers 3 layers, but the model has 4" in split_err["message"]
