"""The generation core (slots, per-row decode): requests that join and leave at different steps
get exactly the tokens each prompt gets alone through ``generate``, at TP 1 and TP 2 (gloo), on
the demo model and Llama / Mistral checkpoints, and at EP 2 x TP 1 on a Mixtral checkpoint; a
compiled core never recompiles after warm-up."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.backend import recording
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.generation.slots import Request
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.parallel.moe_load import load_moe
from torch_tensorrt_dist.testing import run_on_ranks

from . import _llama_ckpt, _moe_ckpt
from ._slots_fns import CACHE_LEN, ROWS, Job, alone, one_thread, rank_schedules, run_schedule

SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 5}


def _demo_jobs() -> list[Job]:
    tok = load_tokenizer(demo_checkpoint_path(), vocab_size=1024)
    texts = [
        "The return statement",
        "A class definition defines a class object",
        "When an exception is raised, the interpreter looks for a handler in the try statements",
        "Python",
        "The for statement is used",
        "Exceptions",
    ]
    ids = [tok.encode(t) for t in texts]
    assert 16 < len(ids[2]) <= 32  # a second prefill bucket
    return [
        Job(0, ids[0], 20),
        Job(0, ids[1], 6),
        Job(1, ids[2], 12),
        Job(2, ids[3], 9),  # waits for a free slot, then reuses one
        Job(3, ids[4], 15, cancel_at=9),
        Job(4, ids[5], 10, sampling=SAMPLED),
    ]


def _gqa_jobs() -> list[Job]:
    return [
        Job(0, [3, 5, 7, 9, 11], 14),
        Job(1, [4, 8, 15, 16, 23, 42, 7, 1, 2], 5),
        Job(1, list(range(10, 30)), 8),  # bucket 32
        Job(2, [99], 11),
        Job(3, [7, 7, 7], 20, cancel_at=12),
        Job(5, [50, 60, 70, 80], 7, sampling=SAMPLED),
    ]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each checkpoint's schedule and every job's tokens alone (TP 1, generate)."""
    root = tmp_path_factory.mktemp("slots")
    out: dict[str, dict[str, Any]] = {}
    specs = {
        "demo": (demo_checkpoint_path(), _demo_jobs(), (1,)),
        "llama_gqa": (root / "llama_gqa", _gqa_jobs(), ()),
        "mistral_window": (root / "mistral_window", _gqa_jobs()[:4], ()),  # sliding window 6
        "mixtral": (root / "mixtral", _gqa_jobs()[:5], ()),  # 4 experts, top 2 (vocab 130)
    }
    for name, (path, jobs, stops) in specs.items():
        if name == "mixtral":
            _moe_ckpt.save_checkpoint(name, path)
        elif name != "demo":
            _llama_ckpt.save_checkpoint(name, path)
        single = Generator(_load(name, path), max_batch_size=1, cache_len=CACHE_LEN)
        with one_thread():
            refs = [alone(single, job, stops) for job in jobs]
        out[name] = {"path": str(path), "jobs": jobs, "stop_ids": stops, "alone": refs}
    return out


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _load(name: str, path: Any) -> Any:
    return load_moe(path, progress=False) if name == "mixtral" else load_llama(path, progress=False)


def _check(case: dict[str, Any], result: dict[str, Any]) -> None:
    for job, got, ref in zip(case["jobs"], result["tokens"], case["alone"], strict=True):
        if job.cancel_at is None:
            assert got == ref, job
        else:  # cut where the client went away
            assert 0 < len(got) < len(ref) and got == ref[: len(got)], job
    assert len(set(result["slots"].values())) < len(case["jobs"])  # slots were reused


@pytest.mark.parametrize("name", ["demo", "llama_gqa", "mistral_window", "mixtral"])
def test_schedule_equals_each_prompt_alone_tp1(cases: dict[str, Any], name: str) -> None:
    case = cases[name]
    gen = Generator(_load(name, case["path"]), max_batch_size=ROWS, cache_len=CACHE_LEN)
    _check(case, run_schedule(gen, case["jobs"], case["stop_ids"]))


def test_schedule_equals_each_prompt_alone_tp2_and_ep2(cases: dict[str, Any]) -> None:
    """TP 2 on the Llama checkpoints, EP 2 x TP 1 on the Mixtral one: one spawn of 2 ranks."""
    names = ("demo", "llama_gqa", "mixtral")
    spec = [
        {
            "path": cases[n]["path"],
            "jobs": [asdict(j) for j in cases[n]["jobs"]],
            "stop_ids": cases[n]["stop_ids"],
            "ep": 2 if n == "mixtral" else 0,
        }
        for n in names
    ]
    results = run_on_ranks(rank_schedules, 2, spec, timeout=240)
    for rank in range(2):
        for name, result in zip(names, results[rank], strict=True):
            _check(cases[name], result)


def test_sampled_request_is_batch_invariant(cases: dict[str, Any]) -> None:
    """The sampled job drew its own tokens (not greedy) and the same ones alone."""
    case = cases["llama_gqa"]
    job = case["jobs"][-1]
    greedy = Job(job.step, job.prompt, job.max_new)
    single = Generator(
        load_llama(case["path"], progress=False), max_batch_size=1, cache_len=CACHE_LEN
    )
    assert alone(single, greedy, ()) != case["alone"][-1]


def test_compiled_core_never_recompiles_after_warmup(cases: dict[str, Any]) -> None:
    torch._dynamo.reset()
    case = cases["llama_gqa"]
    gen = Generator(
        load_llama(case["path"], progress=False), engine="eager", max_batch_size=ROWS, cache_len=32
    )
    assert gen.buckets() == [16, 32]
    with recording() as warm:
        gen.warmup_all()
    assert len(warm) == 3  # a prefill per bucket and the decode graph
    for graph in warm:  # every KV-cache write in place, nothing copied back
        assert graph.input_writes and all(w.in_place for w in graph.input_writes)
    jobs = [
        Job(0, [3, 5, 7], 12),
        Job(1, list(range(10, 30)), 6),
        Job(2, [9] * 17, 9),
        Job(4, [1], 20, cancel_at=9),
    ]
    with recording() as later:
        result = run_schedule(gen, jobs, ())
    assert later == []  # no graph compiled for any mix of requests, lengths and positions
    plain = Generator(load_llama(case["path"], progress=False), max_batch_size=1, cache_len=32)
    for job, got in zip(jobs[:3], result["tokens"]):
        assert got == alone(plain, job, ())


def test_slots_refuse_what_does_not_fit(cases: dict[str, Any]) -> None:
    gen = Generator(
        load_llama(cases["llama_gqa"]["path"], progress=False), max_batch_size=2, cache_len=32
    )
    slots = gen.slots()
    with pytest.raises(ConfigError, match=r"prompt \(30 tokens\) \+ max_new_tokens \(3\) = 33"):
        slots.join(Request(0, tuple(range(30)), 3), slot=0)
    first = slots.join(Request(0, (1, 2), 4), slot=0)
    assert first.finish is None and slots.free_slots() == [1]
    with pytest.raises(ConfigError, match=r"slot 0 is not free \(free: \[1\]\)"):
        slots.join(Request(1, (1, 2), 4), slot=0)
    with pytest.raises(ConfigError, match="stop strings need the model's tokenizer"):
        slots.join(Request(2, (1,), 2, stop=("x",)), slot=1)
    assert slots.cancel(0) is not None and slots.cancel(0) is None
    assert slots.free_slots() == [0, 1] and slots.active == 0


def test_stop_ids_and_length_finish_reasons(cases: dict[str, Any]) -> None:
    case = cases["llama_gqa"]
    gen = Generator(load_llama(case["path"], progress=False), max_batch_size=2, cache_len=32)
    ref = gen.generate([[3, 5, 7]], max_new_tokens=6).tokens[0]
    stop = ref[2]  # the third token ends the request
    slots = gen.slots()
    emitted = [slots.join(Request(0, (3, 5, 7), 6, SamplingConfig(), (stop,)), slot=1)]
    while slots.active:
        emitted += slots.decode()
    assert [e.tokens[0] for e in emitted] == ref[: ref.index(stop) + 1]
    assert [e.finish for e in emitted][-1] == "stop"
    slots.join(Request(1, (3, 5, 7), 2), slot=0)
    assert [e.finish for e in slots.decode()] == ["length"]


def test_demo_jobs_fit_their_buckets() -> None:
    assert Path(demo_checkpoint_path()).is_dir()
    assert all(len(j.prompt) + j.max_new <= CACHE_LEN for j in _demo_jobs())
