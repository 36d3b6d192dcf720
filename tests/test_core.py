"""The generation core (paged KV cache, scheduler, chunked prefill, prefix cache): requests that
arrive and leave at different steps get exactly the tokens each prompt gets alone through
``generate``, at TP 1 and TP 2 (gloo), on the demo model and Llama / Mistral checkpoints, and at
EP 2 x TP 1 on a Mixtral checkpoint, also when a small pool forces preemptions and when
prompts share cached blocks; a compiled core never recompiles after warm-up."""

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
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.generation.generate import model_attention_span
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.parallel.moe_load import load_moe
from torch_tensorrt_dist.testing import run_on_ranks

from . import _llama_ckpt, _moe_ckpt
from ._core_fns import (
    CACHE_LEN,
    ROWS,
    Job,
    alone,
    make_generator,
    one_thread,
    rank_schedules,
    run_schedule,
)

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
    assert len(ids[2]) > 16  # prefilled over several steps (chunks of 8)
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
        Job(1, list(range(10, 30)), 8),  # 3 chunks
        Job(2, [99], 11),
        Job(3, [7, 7, 7], 20, cancel_at=22),
        Job(5, [50, 60, 70, 80], 7, sampling=SAMPLED),
    ]


def _long_jobs() -> list[Job]:
    """Three requests of 50 tokens (13 blocks of 4) at once: a pool of 16 cannot hold two."""
    return [Job(i, [20 + i, 3, 9, 11, 4, 6, 8, 2, 5, 7], 40) for i in range(3)]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each checkpoint's schedule and every job's tokens alone (TP 1, generate)."""
    root = tmp_path_factory.mktemp("core")
    out: dict[str, dict[str, Any]] = {}
    specs = {
        "demo": (demo_checkpoint_path(), _demo_jobs(), (1,)),
        "llama_gqa": (root / "llama_gqa", _gqa_jobs(), ()),
        "mistral_window": (root / "mistral_window", _gqa_jobs()[:4], ()),  # sliding window 6
        "mixtral": (root / "mixtral", _gqa_jobs()[:5], ()),  # 4 experts, top 2 (vocab 130)
        "llama_gqa_long": (root / "llama_gqa", _long_jobs(), ()),
        "mixtral_long": (root / "mixtral", _long_jobs(), ()),
    }
    for name, (path, jobs, stops) in specs.items():
        if name.endswith("_long"):
            pass  # the same checkpoint as above
        elif name == "mixtral":
            _moe_ckpt.save_checkpoint(name, path)
        elif name != "demo":
            _llama_ckpt.save_checkpoint(name, path)
        # alone: one row, no chunking (the prompt in one call), its own pool
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
    if name.startswith("mixtral"):
        return load_moe(path, progress=False)
    return load_llama(path, progress=False)


def _check(case: dict[str, Any], result: dict[str, Any]) -> None:
    for job, got, ref in zip(case["jobs"], result["tokens"], case["alone"], strict=True):
        if job.cancel_at is None:
            assert got == ref, job
        else:  # cut where the client went away
            assert 0 < len(got) < len(ref) and got == ref[: len(got)], job
    assert result["most_running"] == ROWS  # the rows were full at some step
    assert result["pool"].used == 0  # every block came back


@pytest.mark.parametrize("name", ["demo", "llama_gqa", "mistral_window", "mixtral"])
def test_schedule_equals_each_prompt_alone_tp1(cases: dict[str, Any], name: str) -> None:
    case = cases[name]
    result = run_schedule(make_generator(_load(name, case["path"])), case["jobs"], case["stop_ids"])
    _check(case, result)


@pytest.mark.parametrize("name", ["llama_gqa_long", "mixtral_long"])
def test_forced_preemption_keeps_every_token(cases: dict[str, Any], name: str) -> None:
    """A pool of 16 blocks of 4 tokens (one request of the longest length) for 3 rows: the
    newest running request is preempted, recomputed later, and ends with its tokens alone."""
    case = cases[name]
    gen = make_generator(_load(name, case["path"]), kv_blocks=16)
    result = run_schedule(gen, case["jobs"], case["stop_ids"])
    assert result["preemptions"] > 0
    _check(case, result)


def test_schedule_equals_each_prompt_alone_tp2_and_ep2(cases: dict[str, Any]) -> None:
    """TP 2 on the Llama checkpoints (the GQA one also with a pool that forces preemptions),
    EP 2 x TP 1 on the Mixtral one: one spawn of 2 ranks."""
    names = ("demo", "llama_gqa", "llama_gqa_long", "mixtral")
    spec = [
        {
            "path": cases[n]["path"],
            "jobs": [asdict(j) for j in cases[n]["jobs"]],
            "stop_ids": cases[n]["stop_ids"],
            "ep": 2 if n == "mixtral" else 0,
            "kv_blocks": 16 if n.endswith("_long") else None,
        }
        for n in names
    ]
    results = run_on_ranks(rank_schedules, 2, spec, timeout=240)
    for rank in range(2):
        for name, result in zip(names, results[rank], strict=True):
            _check(cases[name], result)
        assert results[rank][2]["preemptions"] > 0
    assert results[0] == results[1]  # the same plans, blocks and tokens on both ranks


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
    """At most four graphs (decode or prefill, one row or several), compiled at warm-up; then
    no mix of rows, chunk lengths, positions or block counts compiles another."""
    torch._dynamo.reset()
    case = cases["llama_gqa"]
    gen = make_generator(load_llama(case["path"], progress=False), engine="eager")
    # chunks shaped by the model's attention: more chunk lengths below
    assert gen.scheduler(gen.core()).span == model_attention_span(gen.runner.args)
    with recording() as warm:
        gen.warmup_all()
    assert len(warm) == 4
    for graph in warm:  # every KV-cache write in place, nothing copied back
        assert graph.input_writes and all(w.in_place for w in graph.input_writes)
    jobs = [
        Job(0, [3, 5, 7], 12),
        Job(1, list(range(10, 30)), 6),
        Job(2, [9] * 17, 9),
        Job(4, [1], 20, cancel_at=9),
        Job(5, list(range(40)), 20),
    ]
    with recording() as later:
        result = run_schedule(gen, jobs, ())
    assert later == []  # no graph compiled for any mix of requests, lengths and positions
    plain = Generator(load_llama(case["path"], progress=False), max_batch_size=1, cache_len=64)
    for job, got in zip(jobs[:3] + jobs[4:], result["tokens"][:3] + result["tokens"][4:]):
        assert got == alone(plain, job, ())


def test_core_refuses_what_does_not_fit(cases: dict[str, Any]) -> None:
    gen = make_generator(load_llama(cases["llama_gqa"]["path"], progress=False))
    core = gen.core()
    sched = gen.scheduler(core)
    with pytest.raises(ConfigError, match=r"prompt \(62 tokens\) \+ max_new_tokens \(3\) = 65"):
        sched.add(Request(0, tuple(range(62)), 3))
    with pytest.raises(ConfigError, match="stop strings need the model's tokenizer"):
        sched.add(Request(2, (1,), 2, stop=("x",)))
    with pytest.raises(ConfigError, match="a prompt is empty"):
        sched.add(Request(3, (), 2))
    assert sched.idle() and core.pool.stats().used == 0


def test_a_pool_too_small_for_one_request_is_refused_naming_the_size(
    cases: dict[str, Any],
) -> None:
    model = load_llama(cases["llama_gqa"]["path"], progress=False)
    with pytest.raises(ConfigError, match=r"needs 16: give at least \d+ \(.* KiB\)"):
        make_generator(model, kv_blocks=15)


def test_stop_ids_and_length_finish_reasons(cases: dict[str, Any]) -> None:
    case = cases["llama_gqa"]
    gen = make_generator(load_llama(case["path"], progress=False))
    ref = gen.generate([[3, 5, 7]], max_new_tokens=6).tokens[0]
    stop = ref[2]  # the third token ends the request
    core = gen.core()
    sched = gen.scheduler(core)
    sched.add(Request(0, (3, 5, 7), 6, SamplingConfig(), (stop,)))
    sched.add(Request(1, (3, 5, 7), 2))
    emitted: dict[int, list[Any]] = {0: [], 1: []}
    while not sched.idle():
        for e in core.step(sched.plan()):
            emitted[e.rid].append(e)
    assert [e.tokens[0] for e in emitted[0]] == ref[: ref.index(stop) + 1]
    assert [e.finish for e in emitted[0]][-1] == "stop"
    assert [e.finish for e in emitted[1]] == [None, "length"]


def test_demo_jobs_fit_the_cache() -> None:
    assert Path(demo_checkpoint_path()).is_dir()
    assert all(len(j.prompt) + j.max_new <= CACHE_LEN for j in _demo_jobs())


def test_prefix_cache_hits_are_exact_reported_and_never_read_across_requests(
    cases: dict[str, Any],
) -> None:
    """B and C share A's 30-token prefix (7 full blocks of 4): admitted after A, they take them
    from the cache (28 tokens reported). A finishes while B and C run; D, a long unrelated
    request, then takes A's freed blocks and the least recently used cached ones in a pool too
    small to keep everything, and writes its own tokens there. Every request still gets the
    tokens it gets alone: no request read another's blocks."""
    case = cases["llama_gqa"]
    model = load_llama(case["path"], progress=False)
    shared = [(7 * i + 3) % 90 + 5 for i in range(30)]
    jobs = [
        Job(0, [*shared, 1, 2], 3),  # A: finishes early
        Job(6, [*shared, 3, 4, 5], 12),  # B: after A's prefill (A's blocks are committed)
        Job(7, [*shared, 6], 14),  # C
        Job(12, [(5 * i) % 97 + 2 for i in range(24)], 30),  # D: unrelated, long
    ]
    result = run_schedule(make_generator(model, kv_blocks=30), jobs, ())
    plain = Generator(load_llama(case["path"], progress=False), max_batch_size=1, cache_len=64)
    for job, got in zip(jobs, result["tokens"], strict=True):
        assert got == alone(plain, job, ())
    assert result["cached"] == {1: 28, 2: 28}
    assert result["pool"].used == 0


def test_prefix_caching_off_computes_everything(cases: dict[str, Any]) -> None:
    case = cases["llama_gqa"]
    shared = list(range(5, 35))
    jobs = [Job(0, [*shared, 1], 3), Job(8, [*shared, 2], 3)]
    model = load_llama(case["path"], progress=False)
    on = run_schedule(make_generator(model), jobs, ())
    off = run_schedule(make_generator(model, prefix_caching=False), jobs, ())
    assert on["cached"] == {1: 28} and off["cached"] == {}
    assert on["tokens"] == off["tokens"]


def test_a_generator_over_a_runner_built_already_takes_no_model_options() -> None:
    """``Generator(runner)`` runs that runner's step (the same tokens as ``Generator(model)``);
    a model's options given beside a runner are refused, naming them."""
    from torch_tensorrt_dist.generation.runner import ModelRunner
    from torch_tensorrt_dist.models.llama_args import ModelArgs
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    args = ModelArgs.from_name("tiny")
    runner = ModelRunner(random_llama(args, seed=0), max_batch_size=2, cache_len=32)
    gen = Generator(runner)
    assert gen.runner is runner
    want = Generator(random_llama(args, seed=0), max_batch_size=2, cache_len=32)
    prompts = [[5, 6, 7], [9]]
    assert (
        gen.generate(prompts, max_new_tokens=4).tokens
        == want.generate(prompts, max_new_tokens=4).tokens
    )
    with pytest.raises(ConfigError, match=r"the options \['cache_len', 'engine'\] are a model's"):
        Generator(runner, engine="inductor", cache_len=16)
