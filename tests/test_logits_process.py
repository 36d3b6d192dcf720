"""Per-request sampling settings (penalties, bias, min tokens, logprobs): the config's checks and
JSON form, and the logits processing against HF transformers' processors, vLLM's dense
definitions and hand-computed values."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.logits_process import (
    RowLogits,
    gather_logprobs,
    log_probs,
    process,
    process_rows_,
)
from torch_tensorrt_dist.generation.sampling import REPETITION_RANGE, SamplingConfig


def _logits(v: int, seed: int = 0, rows: int | None = None) -> torch.Tensor:
    shape = (v,) if rows is None else (rows, v)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


def _processed(
    cfg: SamplingConfig, x: torch.Tensor, prompt: list[int], out: list[int], eos=(1,)
) -> torch.Tensor:
    return process(x, cfg, prompt=prompt, output=out, eos_ids=eos)


def _vllm_dense(
    cfg: SamplingConfig, x: torch.Tensor, prompt: list[int], out: list[int], eos=(1,)
) -> torch.Tensor:
    """vLLM's definitions as written there (v1 sampler: min tokens, logit bias, then
    apply_penalties over bin counts of the whole vocabulary), dividing as HF does."""
    v = x.shape[0]
    x = x.clone()
    if len(out) < cfg.min_tokens:
        x[list({*eos, *cfg.stop_token_ids})] = float("-inf")
    for token, bias in cfg.logit_bias:
        x[token] += bias
    prompt_mask = torch.bincount(torch.tensor(prompt, dtype=torch.long), minlength=v) > 0
    counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=v).float()
    out_mask = counts > 0
    p = cfg.repetition_penalty
    x = torch.where(prompt_mask | out_mask, torch.where(x > 0, x / p, x * p), x)
    x -= cfg.frequency_penalty * counts
    x -= cfg.presence_penalty * out_mask.float()
    return x


# ---------------------------------------------------------------------------- the config


def test_config_errors_name_the_field() -> None:
    cases = [
        (dict(presence_penalty=3), r"presence_penalty must be a finite number in \[-2, 2\], got 3"),
        (dict(frequency_penalty=float("nan")), r"frequency_penalty must be a finite number"),
        (
            dict(repetition_penalty=0),
            r"repetition_penalty must be a finite number in \[0.01, 100\]",
        ),
        (dict(repetition_penalty=1e-300), r"repetition_penalty must be .* got 1e-300"),
        (
            dict(logit_bias={"7": 101}),
            r"logit_bias\['7'\] must be a finite number in \[-100, 100\]",
        ),
        (dict(logit_bias={"abc": 1}), r"logit_bias key 'abc' \(a token id\) must be an integer"),
        (dict(logit_bias={"-3": 1}), r"logit_bias key '-3' \(a token id\) must be an integer >= 0"),
        (dict(logit_bias={"3": 1, 3: 2}), r"logit_bias names token 3 twice"),
        (dict(logit_bias="x"), r"logit_bias must map token ids to biases"),
        (dict(min_tokens=-1), r"min_tokens must be an integer >= 0, got -1"),
        (dict(ignore_eos="false"), r'ignore_eos must be true or false, got "false"'),
        (dict(stop_token_ids="2"), r"stop_token_ids must be a list of token ids"),
        (dict(stop_token_ids=[2, 1.5]), r"stop_token_ids\[1\] must be an integer >= 0, got 1.5"),
        (dict(logprobs=21), r"logprobs must be an integer in \[0, 20\], got 21"),
        (dict(logprobs=True), r"logprobs must be an integer in \[0, 20\], got true"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            SamplingConfig(**kwargs)  # type: ignore[arg-type]


def test_config_checks_against_the_model_and_request() -> None:
    cfg = SamplingConfig(logit_bias={"99": 1.0, "5": 2.0}, stop_token_ids=[3], min_tokens=8)
    cfg.check_for(vocab_size=100, max_new_tokens=8)
    with pytest.raises(ConfigError, match=r"logit_bias holds token ids \[99\] outside the vocab"):
        cfg.check_for(vocab_size=99)
    with pytest.raises(ConfigError, match=r"min_tokens \(8\) exceeds max_tokens \(7\)"):
        cfg.check_for(vocab_size=100, max_new_tokens=7)
    with pytest.raises(ConfigError, match=r"stop_token_ids holds token ids \[3\]"):
        SamplingConfig(stop_token_ids=[3]).check_for(vocab_size=3)
    every = SamplingConfig(min_tokens=1, stop_token_ids=[0, 2, 3])
    every.check_for(vocab_size=4, eos_ids=[])  # id 1 is left to sample
    with pytest.raises(ConfigError, match=r"min_tokens \(1\) holds back every token: .* all 4 ids"):
        every.check_for(vocab_size=4, eos_ids=[1])
    SamplingConfig(stop_token_ids=[0, 1, 2, 3]).check_for(vocab_size=4, eos_ids=[1])  # no min
    ignored = SamplingConfig(min_tokens=1, stop_token_ids=[0, 2, 3], ignore_eos=True)
    ignored.check_for(vocab_size=4, eos_ids=[1])  # ignore_eos: eos is not held back


def test_repetition_penalty_range_keeps_finite_logits_finite() -> None:
    """At either end of the range a logit within float32 / 100 stays finite; below the range
    (1e-300 is 0 in float32) a seen token's logit became inf and the softmax NaN."""
    x = torch.tensor([3.0e36, -3.0e36, 5.0, -5.0])
    for p in REPETITION_RANGE:
        out = _processed(SamplingConfig(repetition_penalty=p), x, [0, 1, 2, 3], [])
        assert torch.isfinite(out).all(), (p, out)
    assert torch.isinf(x[:1] / torch.tensor(1e-300, dtype=torch.float32)).all()


def test_config_normalises_and_round_trips_through_json() -> None:
    cfg = SamplingConfig(
        0.7,
        5,
        0.9,
        2**64 - 1,
        presence_penalty=1,
        frequency_penalty=0.1 + 0.2,  # a float whose bits must survive
        repetition_penalty=1.3,
        logit_bias={"12": -100, 4: 0.5},
        min_tokens=3,
        ignore_eos=True,
        stop_token_ids=[7, 7, 2],
        logprobs=0,
    )
    assert cfg.logit_bias == ((4, 0.5), (12, -100.0))
    assert cfg.stop_token_ids == (7, 2)
    assert isinstance(cfg.presence_penalty, float)
    back = SamplingConfig.from_json(json.loads(json.dumps(cfg.to_json())))
    assert back == cfg and hash(back) == hash(cfg)
    assert back.frequency_penalty == 0.1 + 0.2
    with pytest.raises(ConfigError, match=r"unknown fields \['n'\]"):
        SamplingConfig.from_json({"n": 2})


def test_end_ids_and_whether_logits_change() -> None:
    assert SamplingConfig(stop_token_ids=[9, 2]).end_ids([2, 3]) == (2, 3, 9)
    assert SamplingConfig(ignore_eos=True, stop_token_ids=[9]).end_ids([2]) == (9,)
    assert not SamplingConfig(0.8, 40, 0.9, 1, logprobs=5, ignore_eos=True).shapes_logits
    for kwargs in (
        dict(presence_penalty=0.1),
        dict(frequency_penalty=-0.1),
        dict(repetition_penalty=0.9),
        dict(logit_bias={1: 0.0}),
        dict(min_tokens=1),
    ):
        assert SamplingConfig(**kwargs).shapes_logits, kwargs  # type: ignore[arg-type]


# ------------------------------------------------------------- against HF transformers


@pytest.mark.transformers
@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_equals_hf_bit_for_bit(penalty: float) -> None:
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    v, prompt, out = 97, [5, 9, 9, 40, 0], [9, 61, 3, 61]
    x = _logits(v)
    x[61] = 0.0  # a zero logit: neither divided nor multiplied away
    hf = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + out]), x[None])[0]
    ours = _processed(SamplingConfig(repetition_penalty=penalty), x, prompt, out)
    assert torch.equal(ours, hf)
    assert not torch.equal(ours, x)


@pytest.mark.transformers
def test_min_tokens_equals_hf_min_new_tokens() -> None:
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

    v, prompt, eos = 50, [4, 8, 15], [1, 2]
    x = _logits(v, seed=1)
    cfg = SamplingConfig(min_tokens=3)
    hf = MinNewTokensLengthLogitsProcessor(len(prompt), 3, eos)
    for n in range(5):
        out = [7] * n
        expected = hf(torch.tensor([prompt + out]), x[None])[0]
        assert torch.equal(_processed(cfg, x, prompt, out, eos=eos), expected), n
    # stop_token_ids are held back too (vLLM: every id that would end the request)
    y = _processed(SamplingConfig(min_tokens=2, stop_token_ids=[30]), x, prompt, [7], eos=eos)
    assert y[[1, 2, 30]].tolist() == [float("-inf")] * 3
    assert torch.equal(y[3:30], x[3:30])


@pytest.mark.transformers
def test_single_token_logit_bias_equals_hf_sequence_bias() -> None:
    from transformers.generation.logits_process import SequenceBiasLogitsProcessor

    x = _logits(64, seed=2)
    bias = {3: 2.5, 17: -100.0, 63: 0.125}
    hf = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])
    expected = hf(torch.tensor([[1, 2, 3]]), x[None])[0]
    assert torch.equal(_processed(SamplingConfig(logit_bias=bias), x, [1, 2, 3], []), expected)


# ------------------------------------------------------------ hand values, vLLM's form


def test_presence_and_frequency_penalties_by_hand() -> None:
    x = torch.tensor([1.0, 2.0, -0.5, 0.0, 3.0])
    # the prompt's tokens are not counted: only the output's (OpenAI's definition)
    cfg = SamplingConfig(frequency_penalty=0.5, presence_penalty=0.25)
    y = _processed(cfg, x, prompt=[0, 4], out=[1, 1, 2])
    assert y.tolist() == [1.0, 2.0 - 0.5 * 2 - 0.25, -0.5 - 0.5 - 0.25, 0.0, 3.0]
    neg = _processed(SamplingConfig(presence_penalty=-2.0), x, prompt=[], out=[3])
    assert neg.tolist() == [1.0, 2.0, -0.5, 2.0, 3.0]


def test_the_order_is_vllms() -> None:
    # min tokens, then bias, then repetition: a bias that makes a logit positive is divided
    x = torch.tensor([-1.0, 0.5, 0.5, 0.5])
    cfg = SamplingConfig(logit_bias={0: 3.0}, repetition_penalty=2.0, frequency_penalty=0.5)
    y = _processed(cfg, x, prompt=[0], out=[0])
    assert y[0].item() == (-1.0 + 3.0) / 2.0 - 0.5 * 1


SETTINGS = st.fixed_dictionaries(
    {
        "presence_penalty": st.sampled_from([0.0, 0.5, -1.25, 2.0]),
        "frequency_penalty": st.sampled_from([0.0, 0.3, -0.7]),
        "repetition_penalty": st.sampled_from([1.0, 1.2, 0.8, 3.0]),
        "min_tokens": st.integers(0, 4),
        "stop_token_ids": st.lists(st.integers(0, 39), max_size=2),
        "logit_bias": st.dictionaries(st.integers(0, 39), st.sampled_from([-100.0, -1.5, 4.0])),
    }
)


@settings(max_examples=60, deadline=None)
@given(
    kwargs=SETTINGS,
    prompt=st.lists(st.integers(0, 39), min_size=1, max_size=12),
    out=st.lists(st.integers(0, 39), max_size=12),
    seed=st.integers(0, 100),
)
def test_incremental_state_equals_vllms_dense_definition(
    kwargs: dict, prompt: list[int], out: list[int], seed: int
) -> None:
    """At every step, the state kept token by token (the core's RowLogits) and the one-call
    definition (process) give vLLM's result over whole-vocabulary bin counts of the prompt and
    output so far, bit for bit."""
    cfg = SamplingConfig(**kwargs)
    x = _logits(40, seed)
    row = RowLogits(cfg, prompt, vocab_size=40, eos_ids=(1,))
    for n in range(len(out) + 1):
        y = x.clone()
        row.apply_(y)
        expected = _vllm_dense(cfg, x, prompt, out[:n])
        assert torch.equal(y, expected), n
        assert torch.equal(process(x, cfg, prompt=prompt, output=out[:n], eos_ids=(1,)), expected)
        if n < len(out):
            row.update(out[n])


def test_batched_alone_repeated_and_forked_rows_agree() -> None:
    v = 300
    cfgs = [
        SamplingConfig(repetition_penalty=1.4, presence_penalty=0.5, logit_bias={7: 1.0}),
        None,
        SamplingConfig(frequency_penalty=0.2, min_tokens=5),
        SamplingConfig(0.8, 10, 0.9, 3),  # shapes nothing
    ]
    rows = [RowLogits(c, [1, 2, 3, 250], vocab_size=v, eos_ids=(0,)) if c else None for c in cfgs]
    for t in (5, 5, 250, 9):
        for r in rows:
            if r is not None:
                r.update(t)
    x = _logits(v, seed=3, rows=4)
    batch = x.clone()
    process_rows_(batch, rows)
    for i, r in enumerate(rows):
        alone = x[i].clone()
        if r is not None:
            r.apply_(alone)
        assert torch.equal(batch[i], alone), i
    again = x.clone()
    process_rows_(again, rows)
    assert torch.equal(again, batch)  # every rank computes the same bits
    assert torch.equal(batch[3], x[3]) and torch.equal(batch[1], x[1])
    # a fork (another choice, n > 1) continues alone: the original does not see its tokens
    first = rows[0]
    assert first is not None
    fork = first.fork()
    fork.update(100)
    y, z = x[0].clone(), x[0].clone()
    first.apply_(y)
    fork.apply_(z)
    assert torch.equal(y, batch[0]) and z[100] != y[100]


def test_bad_rows_and_prompt_ids_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"the prompt holds token ids \[50\] outside"):
        RowLogits(SamplingConfig(), [1, 50], vocab_size=50)
    with pytest.raises(ValueError, match=r"float32 logits \[B, V\] with one state per row"):
        process_rows_(torch.zeros(2, 8, dtype=torch.bfloat16), [None, None])


# -------------------------------------------------------------------------- logprobs


def test_logprobs_of_the_chosen_token_and_the_top_k() -> None:
    x = _logits(50, seed=4, rows=3)
    x[2, 10:] = float("-inf")  # a grammar that allows 10 tokens
    lp = log_probs(x, [0, 2])
    torch.testing.assert_close(lp, torch.log_softmax(x[[0, 2]].double(), -1).float())
    out = gather_logprobs(lp, [7, 3], [5, 20])
    assert out[0].token == 7 and out[0].logprob == lp[0, 7].item()
    values, ids = lp[0].topk(5)
    assert out[0].top == tuple(zip(ids.tolist(), values.tolist()))
    assert [t for t, _ in out[1].top] == lp[1, :10].argsort(descending=True).tolist()
    assert all(v > float("-inf") for _, v in out[1].top)  # forbidden tokens are left out
    assert gather_logprobs(lp[:1], [7], [0])[0].top == ()
    assert gather_logprobs(lp[:0], [], []) == []


@pytest.mark.transformers
def test_logprobs_equal_hf_log_softmax_and_greedy_penalties_equal_hf_generate() -> None:
    """Through a real (tiny) model: our processing around its logits picks the tokens HF's
    ``generate`` picks with the same repetition penalty and min_new_tokens, and our logprobs
    are HF's log_softmax of those logits."""
    from tests._llama_ckpt import hf_model

    model = hf_model("llama_gqa")  # vocab 160, float32
    # 87 is what the penalised model picks third: min_new_tokens holds it back to the sixth
    prompt, eos, steps = [3, 17, 17, 42, 5], 87, 12
    hf = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=steps,
        do_sample=False,
        repetition_penalty=1.6,
        min_new_tokens=4,
        eos_token_id=eos,
        pad_token_id=eos,
    )[0, len(prompt) :].tolist()
    cfg = SamplingConfig(repetition_penalty=1.6, min_tokens=4, logprobs=3)
    row = RowLogits(cfg, prompt, vocab_size=160, eos_ids=(eos,))
    ids, ours = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[:, -1].float()  # [1, V]
            lp = log_probs(logits, [0])
            torch.testing.assert_close(lp, torch.log_softmax(logits, -1), rtol=0, atol=1e-4)
            x = logits.clone()
            process_rows_(x, [row])
            token = int(x.argmax(-1))
            assert gather_logprobs(lp, [token], [3])[0].logprob == lp[0, token].item()
            row.update(token)
            ids.append(token)
            ours.append(token)
            if token == eos:
                break
    assert ours == hf
    assert ours[-1] == eos and len(ours) > 4  # the end came later than min_tokens: it held
