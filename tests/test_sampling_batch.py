"""``sampling.sample_each``: the rows of a step drawn together give each row the token that
``sample`` gives it alone, from the same generator, step after step; grammar masks computed
row by row and expanded (CPU logits, ``StepMasks.forbid``) sample what the engine's parallel
masks with the bitmask applied sample."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.plan import Request
from torch_tensorrt_dist.generation.sampler import Pick, RowSampling, StepMasks, sample_step
from torch_tensorrt_dist.generation.sampling import SamplingConfig, sample, sample_each

CONFIGS = [
    None,
    SamplingConfig(),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7),
    SamplingConfig(temperature=1e-3),
    SamplingConfig(temperature=100.0),
    SamplingConfig(temperature=1.0, top_k=3),
    SamplingConfig(temperature=1.0, top_p=0.5),
]


def _logits(rows: int, vocab: int, dtype: torch.dtype, masked: bool, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 5
    if masked:  # most tokens forbidden (a grammar's mask), one left at least
        keep = x[:, :1].clone()
        x[torch.rand(rows, vocab, generator=g) < 0.9] = float("-inf")
        x[:, :1] = keep
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("vocab", [7, 1024, 5_000, 20_000])  # 20,000: a row at a time
def test_each_row_draws_what_it_draws_alone(dtype: torch.dtype, masked: bool, vocab: int) -> None:
    rows = 2 * len(CONFIGS)
    cfgs = [CONFIGS[(i * 3) % len(CONFIGS)] for i in range(rows)]
    alone = [torch.Generator().manual_seed(100 + i) for i in range(rows)]
    batched = [torch.Generator().manual_seed(100 + i) for i in range(rows)]
    for step in range(3):
        x = _logits(rows, vocab, dtype, masked, step)
        want = [
            None if c is None else int(sample(x[i : i + 1], c, alone[i])[0])
            for i, c in enumerate(cfgs)
        ]
        got = sample_each(x, cfgs, batched)
        for i, c in enumerate(cfgs):
            if c is None:
                assert got[i] is None
            elif c.top_k or c.top_p:  # left to sample(): drawn alone, in the same order
                assert got[i] is None
                got[i] = int(sample(x[i : i + 1], c, batched[i])[0])
        assert got == want
    # no generator of a row left out was advanced
    assert [g.get_state().equal(h.get_state()) for g, h in zip(alone, batched)] == [True] * rows


def test_rows_without_a_finite_maximum_are_left_to_sample() -> None:
    x = torch.randn(4, 16)
    x[1] = float("-inf")
    x[2, 3] = float("nan")
    x[3, 5] = float("inf")
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    before = [g.get_state() for g in gens]
    got = sample_each(x, [SamplingConfig(temperature=1.0)] * 4, gens)
    assert got[0] is not None and got[1:] == [None, None, None]
    assert [g.get_state().equal(b) for g, b in zip(gens[1:], before[1:])] == [True] * 3


def _requests(cfgs: list[tuple[SamplingConfig, Any]], grammars: Any) -> list[RowSampling]:
    """A row per (config, grammar spec or None), request ids in order."""
    return [
        RowSampling(Request(i, (1,), 50, cfg, grammar=spec), grammars)
        for i, (cfg, spec) in enumerate(cfgs)
    ]


def _rows(grammars: Any) -> list[RowSampling]:
    spec = GrammarSpec.json_schema({"type": "array", "items": {"type": "integer"}})
    cfgs = [
        (SamplingConfig(temperature=1.0, seed=1), spec),
        (SamplingConfig(seed=2), None),
        (SamplingConfig(temperature=0.8, seed=3, logprobs=2), spec),
        (SamplingConfig(temperature=1.0, seed=4), None),
        (SamplingConfig(seed=5), spec),
        (SamplingConfig(temperature=1.0, seed=6, top_k=5), spec),
    ]
    return _requests(cfgs, grammars)


@pytest.mark.parametrize("op", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masks_row_by_row_and_expanded_sample_what_the_bitmask_samples(
    dtype: torch.dtype, op: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``op``: CPU masks applied by the C++ op (``ops/cpu_bitmask``) over the reused bitmask,
    else expanded (``StepMasks.forbid``); both sample what the bitmask applied samples."""
    pytest.importorskip("llguidance")
    from torch_tensorrt_dist.generation.grammar import Grammars
    from torch_tensorrt_dist.ops import cpu_bitmask

    if op and not cpu_bitmask.available():
        pytest.skip("no C++ compiler")
    monkeypatch.setattr(cpu_bitmask, "ready", lambda: op)
    grammars = Grammars.for_bytes(vocab_size=300, eos_ids=(299,))
    runs = []
    for device in (None, torch.device("cpu")):  # the bitmask applied here; expanded (CPU)
        rows, picks = _rows(grammars), []
        for step in range(6):
            masks = StepMasks.start(grammars, rows, device)
            bitmask, failed = masks.wait()
            assert (masks.forbid is not None) == (device is not None and not op)
            x = torch.randn(len(rows), 300, generator=torch.Generator().manual_seed(step))
            got = sample_step(x.to(dtype), rows, bitmask, failed, masks.forbid)
            for pick, row in zip(got, rows):
                assert isinstance(pick, Pick)
                row.accept(pick.token)
            picks.append(got)
        runs.append(picks)
    assert runs[0] == runs[1]


def _mixed_rows(grammars: Any) -> list[RowSampling]:
    """Plain greedy and sampled rows, a JSON schema, a forced tool call (``tool_choice``
    "required": one token allowed at many steps) greedy and sampled, logprobs with and
    without a grammar."""
    from torch_tensorrt_dist.bench.grammar_cost import TOOL_SCHEMA

    schema = GrammarSpec.json_schema({"type": "array", "items": {"type": "integer"}})
    tool = GrammarSpec.json_schema(TOOL_SCHEMA)
    cfgs = [
        (SamplingConfig(seed=1), None),
        (SamplingConfig(temperature=1.0, seed=2), None),
        (SamplingConfig(temperature=0.8, seed=3, logprobs=2), schema),
        (SamplingConfig(seed=4), tool),
        (SamplingConfig(temperature=1.0, seed=5, logprobs=1), tool),
        (SamplingConfig(temperature=0.7, seed=6, logprobs=3), None),
        (SamplingConfig(temperature=1.0, seed=7, top_k=4), tool),
    ]
    return _requests(cfgs, grammars)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mixed_batch_samples_each_row_as_it_samples_alone(dtype: torch.dtype) -> None:
    """Every row of a batch mixing plain, grammar and logprobs rows (one draw for them all,
    the CPU masks expanded) gets the token and logprobs it gets alone in a batch of one
    (plain: the logits as they are; grammar: the bitmask path), from the same random
    stream, step after step."""
    pytest.importorskip("llguidance")
    from torch_tensorrt_dist.generation.grammar import Grammars

    grammars = Grammars.for_bytes(vocab_size=300, eos_ids=(299,))
    batched, alone = _mixed_rows(grammars), _mixed_rows(grammars)
    for step in range(12):
        x = torch.randn(len(batched), 300, generator=torch.Generator().manual_seed(step)) * 3
        masks = StepMasks.start(grammars, batched, torch.device("cpu"))
        bitmask, failed = masks.wait()
        got = sample_step(x.to(dtype), batched, bitmask, failed, masks.forbid)
        want = []
        for i, row in enumerate(alone):
            one = StepMasks.start(grammars, [row])  # no device: the bitmask applied
            want += sample_step(x[i : i + 1].to(dtype), [row], *one.wait(), one.forbid)
        assert got == want, step
        for pick, b, a in zip(got, batched, alone):
            assert isinstance(pick, Pick)
            b.accept(pick.token)
            a.accept(pick.token)
    assert all(b.gen.get_state().equal(a.gen.get_state()) for b, a in zip(batched, alone))
    assert any(p.logprobs is not None for p in got)
