"""Speculative decoding (prompt lookup) in the paged core: the proposer, the acceptance rule
(its distribution is the target's: a chi-square test), and the core with it on the demo model:
greedy requests get exactly their tokens without speculation (alone, batched with others, with
stops, ``max_tokens``, logprobs, penalties, grammars, preemption and prefix caching, and on 2
gloo ranks, which agree), and every block a refused token took comes back."""

from __future__ import annotations

import json
import math
import pydoc_data.topics as pydoc_topics
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.speculative import (
    NgramProposer,
    RowSpeculation,
    SpeculativeConfig,
    accept_point_mass,
)
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.testing import run_on_ranks

from ._core_fns import Job, make_generator, one_thread, rank_schedules, run_schedule

DEMO = demo_checkpoint_path()
EOS = (1,)
SPEC = SpeculativeConfig(num_tokens=4)
#: a passage the demo model was trained on (pydoc's topics), then its first words again: its
#: greedy text repeats itself ("is a "except" clause, or ...") and the lookup finds it
_FOR = pydoc_topics.topics["for"].strip()
QUOTE = _FOR[:160] + "\n\n" + _FOR[:30]
STOP = 355  # " or": the 9th and the 20th token of the quote's greedy text
CACHE = 128
REGEX = GrammarSpec.regex("[0-9]{3}-[a-z]{2,5}")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(DEMO, vocab_size=1024)


@pytest.fixture(scope="module")
def model() -> Any:
    return load_llama(DEMO, progress=False)


# -- the proposer, the rule, the config: pure ------------------------------------------------


def test_ngram_takes_the_longest_suffix_and_its_most_recent_match() -> None:
    lookup = NgramProposer(min_n=1, max_n=3)
    #          0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    # "1 2 3" last seen at 5..7 (not 0..2): what followed it there
    assert lookup.propose(tokens, 4) == [7, 8, 1, 2]
    assert lookup.propose(tokens, 1) == [7]  # a shorter k: a prefix
    assert lookup.propose(tokens, 0) == []
    # no 3-gram or 2-gram match; the 1-gram "5" matches at 1
    assert lookup.propose([4, 5, 6, 7, 5], 2) == [6, 7]
    assert NgramProposer(min_n=2, max_n=3).propose([4, 5, 6, 7, 5], 2) == []
    # a match at the end proposes what there is
    assert lookup.propose([1, 2, 1, 2], 5) == [1, 2]
    assert lookup.propose([3], 2) == []


def test_acceptance_rule_keeps_the_target_distribution() -> None:
    """2,000 draws of accept-or-replace with a point-mass draft: chi-square at 1 % against p
    (and the draft accepted as often as p gives it)."""
    p = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.15, 0.05])
    gen = torch.Generator().manual_seed(11)
    n, draft = 2000, 3
    counts = torch.zeros(6)
    accepted = 0
    for _ in range(n):
        ok, token = accept_point_mass(p, draft, gen)
        accepted += ok
        assert ok == (token == draft) or not ok
        counts[token] += 1
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 15.09  # chi-square 1 % critical value, 5 degrees of freedom
    assert abs(accepted / n - 0.25) < 0.04
    # a draft the target gives no chance is never accepted
    q = torch.tensor([0.5, 0.5, 0.0])
    assert all(not accept_point_mass(q, 2, gen)[0] for _ in range(50))


def test_adaptive_k_pauses_a_row_that_is_refused() -> None:
    row = RowSpeculation(4)
    assert row.k() == 4
    for _ in range(10):  # one token a verify step pays for it (1 of 4 proposed): no pause
        row.update(4, 1)
        assert row.k() == 4
    row.update(4, 4)
    for _ in range(6):
        row.update(4, 0)
        if row.k() == 0:
            break
    assert row.k() == 0 and row.paused >= 2
    while row.paused:
        row.tick()
    assert row.k() == 4  # it tries again
    assert (row.proposed, row.accepted) == (4 * row.steps, 14)


@pytest.mark.parametrize("k", [0, 17, -1, 2.0, True])
def test_num_speculative_tokens_out_of_range_is_refused(k: Any) -> None:
    with pytest.raises(ConfigError, match="--num-speculative-tokens"):
        SpeculativeConfig(num_tokens=k)
    with pytest.raises(ConfigError, match="--speculative"):
        SpeculativeConfig(method="eagle")


# -- the core -------------------------------------------------------------------------------


def _prompts(tok: Any) -> list[list[int]]:
    quote = tok.encode(QUOTE)
    return [
        quote,
        tok.encode("The return statement"),
        tok.encode("When an exception is raised, the interpreter looks for a handler"),
        quote[:20],
        tok.encode("Python"),
        tok.encode("zebra quantum pickle harmonica"),
        quote[5:],
        tok.encode("A class definition defines a class object"),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_tokens_equal_plain_decoding_alone_and_batched(
    tok: Any, model: Any, dtype: torch.dtype
) -> None:
    """bf16: the verify call's products of R x (k + 1) token rows (oneDNN's bf16 GEMM)
    against the decode step's of R, each output rounded to bfloat16."""
    if dtype != torch.float32:
        model = load_llama(DEMO, progress=False, dtype=dtype)
    prompts = _prompts(tok)
    plain = Generator(model, max_batch_size=8, cache_len=CACHE)
    want = plain.generate(prompts, max_new_tokens=24, stop_ids=EOS).tokens
    spec = Generator(model, max_batch_size=8, cache_len=CACHE, speculative=SPEC)
    core = spec.core()
    free = core.pool.available
    sched = spec.scheduler(core)
    from torch_tensorrt_dist.generation.core import Request

    for i, ids in enumerate(prompts):  # 8 rows at once
        sched.add(Request(i, tuple(ids), 24, SamplingConfig(), EOS))
    got: list[list[int]] = [[] for _ in prompts]
    steps = 0
    while not sched.idle():
        for e in core.step(sched.plan()):
            got[e.rid] += e.tokens
        steps += 1
    assert got == want
    assert core.spec_accepted > 0 and core.spec_proposed > core.spec_accepted
    assert core.pool.available == free and core.pool.stats().used == 0  # nothing leaked
    # alone: the quoting prompt takes fewer steps than tokens
    one = spec.generate([prompts[0]], max_new_tokens=24, stop_ids=EOS)
    assert one.tokens[0] == want[0]
    assert one.decode_steps < len(want[0]) - 1


def _jobs(tok: Any) -> list[Job]:
    quote = tok.encode(QUOTE)
    return [
        Job(0, quote, 20),
        Job(0, quote, 14, sampling={"logprobs": 3}),
        Job(1, quote, 12, sampling={"repetition_penalty": 1.3, "presence_penalty": 0.5}),
        Job(1, quote[4:], 16, sampling={"logit_bias": {"29": 3.0}, "min_tokens": 10}),
        Job(2, quote, 24, sampling={"logprobs": 2, "stop_token_ids": [STOP], "min_tokens": 10}),
        Job(
            2, tok.encode("Python"), 30, grammar=GrammarSpec.regex("[0-9]{3}-[a-z]{2,5}").to_json()
        ),
        Job(3, quote, 9, sampling={"temperature": 0.9, "seed": 4}),
    ]


def _check(result: dict[str, Any], ref: dict[str, Any], jobs: list[Job]) -> None:
    for i, job in enumerate(jobs):
        if job.sampling.get("temperature"):
            continue  # the same distribution, other draws
        assert result["tokens"][i] == ref["tokens"][i], job
        assert result["finish"][i] == ref["finish"][i], job
        got, want = result["logprobs"][i], ref["logprobs"][i]
        assert [(g.token, [t for t, _ in g.top]) for g in got] == [
            (w.token, [t for t, _ in w.top]) for w in want
        ]
        for g, w in zip(got, want):  # the verify call's sums differ in the last bits
            assert g.logprob == pytest.approx(w.logprob, abs=1e-4)


@pytest.fixture(scope="module")
def grammars() -> Any:
    pytest.importorskip("llguidance", reason="structured output needs llguidance")
    from torch_tensorrt_dist.generation.grammar import Grammars

    return Grammars.from_file(DEMO / "tokenizer.json", vocab_size=1024, eos_ids=EOS)


@pytest.fixture(scope="module")
def plain_ref(tok: Any, model: Any, grammars: Any) -> dict[str, Any]:
    with one_thread():
        return run_schedule(make_generator(model, cache_len=CACHE), _jobs(tok), EOS, grammars)


@pytest.mark.parametrize("kv_blocks", [None, 40])
def test_stops_logprobs_penalties_grammar_and_preemption_hold(
    tok: Any, model: Any, grammars: Any, plain_ref: dict[str, Any], kv_blocks: int | None
) -> None:
    jobs = _jobs(tok)
    gen = make_generator(model, kv_blocks, speculative=SPEC, cache_len=CACHE)
    result = run_schedule(gen, jobs, EOS, grammars)
    _check(result, plain_ref, jobs)
    assert result["speculated"][1] > 0  # accepted tokens
    assert result["pool"].used == 0
    if kv_blocks:
        assert result["preemptions"] > 0
    # the stop id ended its request where plain decoding did, inside an accepted run
    assert result["finish"][4] == "stop" and result["tokens"][4][-1] == STOP
    assert len(result["tokens"][4]) > 10  # min_tokens held it back at the first " or"
    assert re.fullmatch("[0-9]{3}-[a-z]{2,5}", tok.decode(result["tokens"][5]))
    assert all(0 <= t < 1024 for t in result["tokens"][6]) and len(result["tokens"][6]) == 9


def test_prefix_cache_holds_only_accepted_tokens(tok: Any, model: Any) -> None:
    """A second request of the same quoting prompt and what the first produced hits the
    blocks the first committed, and gets the same tokens as without speculation."""
    quote = tok.encode(QUOTE)
    spec = make_generator(model, speculative=SPEC, cache_len=CACHE)
    first = spec.generate([quote], max_new_tokens=20, stop_ids=EOS).tokens[0]
    longer = quote + first[:12]
    core = spec.core()
    jobs = [Job(0, quote, 20), Job(6, longer, 8)]
    result = run_schedule(spec, jobs, EOS)
    plain = run_schedule(make_generator(model, cache_len=CACHE), jobs, EOS)
    assert result["tokens"] == plain["tokens"]
    assert result["cached"].get(1, 0) >= 4 * 8  # the prompt's and the first's accepted blocks
    del core


def test_sampled_tokens_follow_plain_sampling(tok: Any, model: Any) -> None:
    """A smaller end-to-end check: the first two tokens (the second drawn by the acceptance
    rule where the lookup proposes) over 80 seeds, with and without speculation: the most
    frequent pair equally frequent within 5 standard deviations."""
    quote = tok.encode(QUOTE)
    n, counts = 80, []
    # 1-grams too: the lookup proposes after almost every first token
    for spec in (None, SpeculativeConfig(num_tokens=4, min_n=1)):
        gen = Generator(model, max_batch_size=8, cache_len=CACHE, speculative=spec)
        jobs = [Job(0, quote, 3, sampling={"temperature": 0.7, "seed": i}) for i in range(n)]
        result = run_schedule(gen, jobs, EOS)
        counts.append(Counter(tuple(t[:2]) for t in result["tokens"]))
    assert result["speculated"][0] >= n // 2  # most second tokens went through the rule
    pair, k = counts[0].most_common(1)[0]
    p = k / n
    assert 0.1 < p < 0.95  # sampled, not greedy
    assert abs(counts[1][pair] - k) < 5 * math.sqrt(2 * n * p * (1 - p))


@pytest.mark.slow
def test_two_ranks_agree_and_equal_plain_decoding(tok: Any) -> None:
    jobs = _jobs(tok)[:5]  # no grammar: the ranks load no tokenizer
    case = {
        "path": str(DEMO),
        "jobs": [asdict(j) for j in jobs],
        "stop_ids": EOS,
        "cache_len": CACHE,
    }
    spec = [case, {**case, "speculative": {"num_tokens": 4}}]
    results = run_on_ranks(rank_schedules, 2, spec, timeout=240)
    assert results[0] == results[1]  # the same plans, drafts, acceptances, tokens, logprobs
    plain, result = results[0]
    assert result["speculated"][1] > 0
    # TP 2 sums in another order than TP 1: compared with TP 2 without speculation
    assert result["tokens"] == plain["tokens"]
    assert json.dumps(result["finish"]) == json.dumps(plain["finish"])


# -- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speculative", "ngram", "--num-speculative-tokens", "17"], "--num-speculative-tokens"),
        (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens"),
        (["--speculative", "medusa"], "--speculative 'medusa'"),
        (["--num-speculative-tokens", "3"], "needs --speculative"),
    ],
)
def test_bad_speculative_options_are_refused_naming_the_option(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from torch_tensorrt_dist.cli import main

    args = ["generate", "--engine", "none", "--max-new-tokens", "4", "--prompt", "The", *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_generate_command_with_prompt_lookup_gives_the_plain_tokens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torch_tensorrt_dist.cli import main

    args = ["generate", "--engine", "none", "--max-new-tokens", "24", "--json"]
    args += ["--prompt", QUOTE]
    outs = []
    for extra in ([], ["--speculative", "ngram", "--num-speculative-tokens", "4"]):
        assert main([*args, *extra]) == 0
        out = capsys.readouterr().out
        outs.append(json.loads(out[out.index("{") :])["tokens"])
    assert outs[0] == outs[1] and len(outs[0][0]) > 5


@pytest.mark.slow
def test_served_at_tp2_with_prompt_lookup(tok: Any, model: Any) -> None:
    """``serve --tp 2 --speculative ngram``: rank 0 plans the drafts, the other rank proposes
    alike; the greedy text is plain decoding's and /metrics counts the proposals."""
    import httpx

    from ._serve import start_server

    plain = Generator(model, max_batch_size=1, cache_len=CACHE)
    want = plain.generate([tok.encode(QUOTE)], max_new_tokens=24, stop_ids=EOS).tokens[0]
    args = ["--model", str(DEMO), "--served-model-name", "demo", "--tp", "2", "--engine", "none"]
    args += ["--max-batch-size", "2", "--max-seq-len", str(CACHE)]
    args += ["--speculative", "ngram", "--num-speculative-tokens", "4"]
    server = start_server(args)
    try:
        body = {"model": "demo", "prompt": QUOTE, "max_tokens": 24, "temperature": 0}
        got = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    finally:
        server.stop()
    assert got["choices"][0]["text"] == tok.decode(want)
    counts = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("torchtrt_spec_decode")
    }
    assert counts["torchtrt_spec_decode_num_accepted_tokens_total"] > 0
    assert counts["torchtrt_spec_decode_mean_accepted_length"] > 1


@pytest.mark.slow
def test_compiled_verify_call_never_recompiles_after_warm_up() -> None:
    """A tiny random model (the compile is the cost): after ``warmup_all`` no mix of rows,
    drafts and positions compiles anything, and the tokens are plain decoding's."""
    from torch_tensorrt_dist.backend import recording
    from torch_tensorrt_dist.bench.common import bench_args
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    torch._dynamo.reset()
    tiny = random_llama(bench_args(1, dim=64, vocab=128))
    gen = make_generator(tiny, engine="eager", speculative=SPEC)
    with recording() as warm:
        gen.warmup_all()
    assert len(warm) >= 6  # the step's 4 shape classes and the verify call's 2
    loop = [3, 5, 7, 9, 11] * 4
    jobs = [Job(0, loop, 20), Job(1, [4, 8, 15, 16, 23, 42], 12), Job(2, loop[2:], 8)]
    with recording() as later:
        result = run_schedule(gen, jobs, EOS)
    assert later == []
    assert result["speculated"][0] > 0
    plain = run_schedule(make_generator(tiny), jobs, EOS)
    assert result["tokens"] == plain["tokens"]


@pytest.mark.parametrize("op", [False, True], ids=["sdpa", "cpu_op"])
@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_every_token_step_gives_the_logits_of_each_position(pack: bool, op: bool) -> None:
    """``paged_step(every=True)`` (the verify call): each real token's logits, equal to those
    of one-token steps at its position (rows of 5 and 2 tokens, the first across a block
    boundary), and written K/V that the next step reads as a plain step's. ``op``: the verify
    call attends through the CPU op (``cpu_decode``), the one-token steps through
    ``scaled_dot_product_attention`` over the gathered past."""
    from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
    from torch_tensorrt_dist.models.llama import ModelArgs
    from torch_tensorrt_dist.ops import cpu_attention
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    if op and not cpu_attention.available():
        pytest.skip(f"the CPU op cannot be built: {cpu_attention.unavailable_reason()}")
    cpu = torch.device("cpu")
    limits = StepLimits(rows=2, tokens=8, blocks=4, block_size=4)
    ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    rows = [(ids[:6], ids[6:11], [1, 2, 3]), (ids[:3], ids[3:5], [4, 5])]  # prompt, then step
    models = [random_llama(ModelArgs.from_name("tiny"), seed=2) for _ in range(2)]
    for m, cpu_decode in zip(models, (op, False), strict=True):
        m.setup_paged(num_blocks=8, block_size=4, max_seq_len=16, cpu_decode=cpu_decode)
    with torch.no_grad():
        for m in models:  # the prompts, alike
            m.paged_step(*step_inputs([(p, 0, b) for p, _, b in rows], limits, cpu))
        spans = [(s, len(p), b) for p, s, b in rows]
        every = models[0].paged_step(*step_inputs(spans, limits, cpu, pack=pack), every=True)
        want = []  # the same tokens one step at a time
        for j in range(5):
            live = [(p, s, b) for p, s, b in rows if j < len(s)]
            one = [([s[j]], len(p) + j, b) for p, s, b in live]
            want.append(models[1].paged_step(*step_inputs(one, limits, cpu)))
        at = 0
        for r, (_, s, _) in enumerate(rows):
            got = every[r, : len(s)] if every.dim() == 3 else every[at : at + len(s)]
            at += len(s)
            for j in range(len(s)):
                torch.testing.assert_close(got[j], want[j][r], atol=1e-5, rtol=1e-5)
        after = [([ids[11]], 11, [1, 2, 3])]  # row 0's next token reads what both wrote
        a, b = (m.paged_step(*step_inputs(after, limits, cpu)) for m in models)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert every.shape == ((7, 256) if pack else (2, 5, 256))
