"""The core's sampling beyond temperature and top-p, on the demo model: requests with penalties,
``logit_bias``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, logprobs or a grammar,
batched with plain requests that arrive and leave at other steps, get exactly their tokens (and
logprobs) alone, also when a small pool forces preemptions and on 2 gloo ranks (which agree on
every token); the other choices of a prompt take its blocks from the prefix cache; a grammar
that fails fails its request only."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.generation.core import GenerationCore
from torch_tensorrt_dist.generation.grammar import GrammarError, Grammars, GrammarSpec, Matcher
from torch_tensorrt_dist.generation.logits_process import process
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.testing import run_on_ranks

from ._core_fns import CACHE_LEN, Job, make_generator, one_thread, rank_schedules, run_schedule

pytest.importorskip("llguidance", reason="structured output needs llguidance (the serve extra)")
jsonschema = pytest.importorskip("jsonschema")

DEMO = demo_checkpoint_path()
EOS = (1,)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
PENALTIES = {"repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.3}


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(DEMO, vocab_size=1024)


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    return Grammars.from_file(DEMO / "tokenizer.json", vocab_size=1024, eos_ids=EOS)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _jobs(tok: Any) -> list[Job]:
    ids = [
        tok.encode(t)
        for t in (
            "The return statement",
            "A class definition defines a class object",
            "When an exception is raised, the interpreter looks for a handler",
            "Python",
            "The for statement is used",
        )
    ]
    schema = GrammarSpec.json_schema(SCHEMA).to_json()
    return [
        Job(0, ids[0], 20),  # plain greedy: the one-argmax path
        Job(0, ids[1], 14, sampling={**PENALTIES, "logprobs": 3}),
        Job(1, ids[2], 40, sampling={"temperature": 0.9, "seed": 7}, grammar=schema),
        Job(1, ids[3], 12, sampling={"temperature": 0.8, "top_p": 0.9, "seed": 3}),  # plain
        Job(
            2,
            ids[4],
            16,
            sampling={"logit_bias": {"29": 3.0}, "min_tokens": 10, "temperature": 0.7, "seed": 1},
        ),
        Job(3, ids[0], 10, sampling={"logprobs": 2, "stop_token_ids": [698]}),
        Job(4, ids[3], 30, grammar=GrammarSpec.regex("[0-9]{3}-[a-z]{2,5}").to_json()),
        Job(5, ids[1], 9, sampling={"ignore_eos": True, "temperature": 1.0, "seed": 2}),
    ]


def _alone(model: Any, job: Job, grammars: Grammars) -> dict[str, Any]:
    single = Generator(model, max_batch_size=1, cache_len=CACHE_LEN)
    one = Job(0, job.prompt, job.max_new, sampling=job.sampling, grammar=job.grammar)
    return run_schedule(single, [one], EOS, grammars)


@pytest.fixture(scope="module")
def refs(tok: Any, grammars: Grammars) -> list[dict[str, Any]]:
    model = load_llama(DEMO, progress=False)
    with one_thread():
        return [_alone(model, job, grammars) for job in _jobs(tok)]


def _check(jobs: list[Job], result: dict[str, Any], refs: list[dict[str, Any]]) -> None:
    for i, (job, ref) in enumerate(zip(jobs, refs, strict=True)):
        assert result["tokens"][i] == ref["tokens"][0], job
        assert result["finish"][i] == ref["finish"][0], job
        # the same tokens; the logits of a row batched and chunked differ from its logits
        # alone in the last bits (the model's sums), so do their logprobs
        got, want = result["logprobs"][i], ref["logprobs"][0]
        assert [(g.token, [t for t, _ in g.top]) for g in got] == [
            (w.token, [t for t, _ in w.top]) for w in want
        ], job
        for g, w in zip(got, want):
            assert g.logprob == pytest.approx(w.logprob, abs=1e-5)
            assert [v for _, v in g.top] == pytest.approx([v for _, v in w.top], abs=1e-5)


def test_processed_rows_batched_with_plain_rows_equal_each_alone(
    tok: Any, grammars: Grammars, refs: list[dict[str, Any]]
) -> None:
    jobs = _jobs(tok)
    gen = make_generator(load_llama(DEMO, progress=False))
    result = run_schedule(gen, jobs, EOS, grammars)
    _check(jobs, result, refs)
    assert result["most_running"] == 3 and result["pool"].used == 0
    # the grammars held: valid JSON of the schema, and the regex, each ended by the grammar
    text = tok.decode(result["tokens"][2])
    jsonschema.validate(json.loads(text), SCHEMA)
    assert re.fullmatch("[0-9]{3}-[a-z]{2,5}", tok.decode(result["tokens"][6]))
    assert result["finish"][2] == result["finish"][6] == "stop"
    # min_tokens held the end of text back; ignore_eos ran to the length; logprobs per token
    assert len(result["tokens"][4]) >= 10 and result["finish"][7] == "length"
    assert len(result["logprobs"][1]) == len(result["tokens"][1])
    assert all(len(lp.top) == 3 for lp in result["logprobs"][1])


@pytest.mark.transformers
def test_stop_token_ids_end_the_request_and_penalties_follow_their_definition(
    tok: Any, refs: list[dict[str, Any]]
) -> None:
    """Job 5 stops at id 698 (a token of its greedy text); job 1 picks, at every step, the
    argmax of HF transformers' logits of the demo model penalised by
    ``logits_process.process`` (vLLM's definitions, tested against HF's processors)."""
    from transformers import AutoModelForCausalLM

    greedy = refs[0]["tokens"][0]
    assert 698 in greedy
    stopped = refs[5]["tokens"][0]
    assert stopped == greedy[: greedy.index(698) + 1] and refs[5]["finish"][0] == "stop"
    hf = AutoModelForCausalLM.from_pretrained(DEMO, dtype=torch.float32).eval()
    job = _jobs(tok)[1]
    cfg = SamplingConfig(**job.sampling)
    ids, out = list(job.prompt), []
    with torch.no_grad():
        for _ in range(job.max_new):
            logits = hf(torch.tensor([ids])).logits[0, -1].float()
            x = process(logits, cfg, prompt=job.prompt, output=out, eos_ids=EOS)
            out.append(int(x.argmax()))
            ids.append(out[-1])
            if out[-1] in EOS:
                break
    assert refs[1]["tokens"][0] == out


def test_forced_preemption_keeps_the_penalty_and_grammar_state(
    tok: Any, grammars: Grammars, refs: list[dict[str, Any]]
) -> None:
    jobs = _jobs(tok)
    gen = make_generator(load_llama(DEMO, progress=False), kv_blocks=16)
    result = run_schedule(gen, jobs, EOS, grammars)
    assert result["preemptions"] > 0
    _check(jobs, result, refs)


@pytest.mark.slow
def test_two_ranks_agree_on_every_token_and_logprob(tok: Any, refs: list[dict[str, Any]]) -> None:
    jobs = _jobs(tok)
    spec = [
        {
            "path": str(DEMO),
            "jobs": [asdict(j) for j in jobs],
            "stop_ids": EOS,
            "tokenizer": str(DEMO / "tokenizer.json"),
        }
    ]
    results = run_on_ranks(rank_schedules, 2, spec, timeout=240)
    assert results[0] == results[1]  # the same plans, blocks, tokens and logprobs
    tokens = results[0][0]["tokens"]
    # TP 2 sums in another order: the sampled rows may part from TP 1 where two tokens are
    # near-tied, but the grammars hold on every rank
    jsonschema.validate(json.loads(tok.decode(tokens[2])), SCHEMA)
    assert re.fullmatch("[0-9]{3}-[a-z]{2,5}", tok.decode(tokens[6]))


def test_other_choices_take_the_prompt_from_the_prefix_cache(tok: Any, grammars: Grammars) -> None:
    """n = 3: choices 1 and 2 (seeds + 1, + 2) wait until choice 0 has computed its prompt,
    then take its full blocks from the prefix cache; each equals its seed alone."""
    prompt = tok.encode("When an exception is raised, the interpreter looks for a handler")
    assert len(prompt) > 9  # at least two full blocks of 4 besides the last token
    base = {"temperature": 1.0, "seed": 11}
    jobs = [
        Job(0, prompt, 8, sampling={**base, "seed": 11 + j}, follows=None if j == 0 else 0)
        for j in range(3)
    ]
    jobs.append(Job(0, tok.encode("Python"), 6))  # behind them: not held with them
    model = load_llama(DEMO, progress=False)
    result = run_schedule(make_generator(model), jobs, EOS, grammars)
    usable = (len(prompt) - 1) // 4 * 4
    assert result["cached"] == {1: usable, 2: usable}
    joined = result["joined"]  # 3 rows: choice 2 also waits for one
    assert joined[0] < joined[1] <= joined[2] and joined[3] < joined[1]
    for j, job in enumerate(jobs):
        assert result["tokens"][j] == _alone(model, job, grammars)["tokens"][0], j
    assert result["tokens"][0] != result["tokens"][1]  # seeds 11 and 12 drew differently


def _core(gen: Generator, grammars: Grammars | None) -> GenerationCore:
    core = gen.core()
    core.grammars, core.isolate = grammars, True
    return core


def test_a_failing_grammar_fails_its_request_only(
    tok: Any, grammars: Grammars, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = make_generator(load_llama(DEMO, progress=False))
    prompt = tok.encode("Python")
    spec = GrammarSpec.regex("[a-z]+").to_json()
    jobs = [Job(0, prompt, 6, grammar=spec), Job(0, prompt, 6)]
    # no grammar engine on this rank: the request with a grammar fails on join
    core = _core(gen, None)
    sched = gen.scheduler(core)
    for i, job in enumerate(jobs):
        sched.add(job.request(i, EOS))
    first = {e.rid: e for e in core.step(sched.plan())}
    assert first[0].finish == "error" and first[0].error is not None
    assert first[0].error.stage == "join" and "structured output is not available" in (
        first[0].error.message
    )
    assert first[1].finish is None and list(core.sequences) == [1]
    while not sched.idle():
        core.step(sched.plan())
    assert core.pool.stats().used == 0
    # the engine fails mid-way (a limit hit): that request ends in error, the other goes on
    calls = {"n": 0}
    accept = Matcher.accept

    def failing(self: Matcher, token: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise GrammarError("the grammar engine hit a limit", reason="limit")
        accept(self, token)

    monkeypatch.setattr(Matcher, "accept", failing)
    core = _core(gen, grammars)
    sched = gen.scheduler(core)
    for i, job in enumerate(jobs):
        sched.add(job.request(i, EOS))
    out: dict[int, list[Any]] = {0: [], 1: []}
    while not sched.idle():
        for e in core.step(sched.plan()):
            out[e.rid].append(e)
    assert out[0][-1].finish == "error" and out[0][-1].error.stage == "grammar"
    assert len(out[0]) == 3 and "hit a limit" in out[0][-1].error.message
    assert sum(len(e.tokens) for e in out[1]) == 6 and out[1][-1].finish == "length"
