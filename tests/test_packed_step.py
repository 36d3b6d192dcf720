"""Packed prefill steps (``live``): a step of several rows of different lengths runs its
products over the real tokens only, with the logits and the KV cache of the padded step."""

from __future__ import annotations

import copy

import pytest
import torch

from torch_tensorrt_dist.generation import runner
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama import ModelArgs
from torch_tensorrt_dist.models.paged import pack_rows, unpack_rows
from torch_tensorrt_dist.models.stage import StageRole
from torch_tensorrt_dist.parallel.llama_load import random_llama

CPU = torch.device("cpu")
ARGS = ModelArgs(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64, intermediate_size=64
)
LIMITS = StepLimits(rows=4, tokens=16, blocks=8, block_size=4)


def test_step_inputs_pack_only_prefills_of_several_rows() -> None:
    rows = [([1, 2, 3], 0, [1]), ([4], 0, [2]), ([5, 6], 0, [3])]
    live = step_inputs(rows, LIMITS, CPU, pack=True)[5]  # S = 3: rows at 0, 3 and 6
    assert live.tolist() == [0, 1, 2, 3, 6, 7]
    assert len(step_inputs(rows, LIMITS, CPU)) == 5  # not asked
    assert len(step_inputs(rows[:1], LIMITS, CPU, pack=True)) == 5  # one row: no padding
    decode = [([1], 4, [1, 5]), ([2], 4, [2, 6])]
    assert len(step_inputs(decode, LIMITS, CPU, pack=True)) == 5  # S = 1: no padding


def test_pack_and_unpack_rows() -> None:
    x = torch.arange(2 * 3 * 2).reshape(2, 3, 2)
    live = torch.tensor([0, 1, 3])  # row 0: 2 tokens, row 1: 1
    packed = pack_rows(x, live)
    assert packed.tolist() == [[[0, 1], [2, 3], [6, 7]]]
    back = unpack_rows(packed, live, 2, 3)
    assert back.tolist() == [[[0, 1], [2, 3], [0, 0]], [[6, 7], [0, 0], [0, 0]]]


def _steps() -> list[list[tuple[list[int], int, list[int]]]]:
    """Three rows prefilled at different lengths, then a step that mixes a decoding row
    (one token over its past) with chunks of two others."""
    a, b, c = [1, 2], [3, 4], [5, 6]  # each row's blocks (4 tokens each)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(1, ARGS.vocab_size, (8,), generator=g).tolist() for _ in range(3)]
    return [
        [(ids[0][:6], 0, a), (ids[1][:2], 0, b), (ids[2][:4], 0, c)],
        [(ids[0][6:7], 6, a), (ids[1][2:7], 2, b), (ids[2][4:6], 4, c)],
    ]


@pytest.mark.parametrize("role", [None, StageRole(0, 2, range(0, 1))], ids=["whole", "stage"])
def test_a_packed_step_gives_the_padded_steps_logits_and_cache(role: StageRole | None) -> None:
    """The same steps padded and packed, each model with its own pools: the same logits (or,
    a pipeline stage before the last, the same hidden states at every real token, zero at the
    padding), and the same K/V in every block a sequence owns."""
    padded = random_llama(ARGS, seed=1, stage=role)
    padded.setup_paged(num_blocks=8, block_size=4, max_seq_len=32)
    packed = copy.deepcopy(padded)
    with torch.no_grad():
        for rows in _steps():
            want = padded.paged_step(*step_inputs(rows, LIMITS, CPU))
            inputs = step_inputs(rows, LIMITS, CPU, pack=True)
            got = packed.paged_step(*inputs)
            if role is None:  # logits of each row's last token
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
                continue
            real = torch.zeros(want.shape[:2], dtype=torch.bool)
            real.view(-1)[inputs[5]] = True
            torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
            assert not got[~real].any()
    for mine, theirs in zip(packed.blocks, padded.blocks, strict=True):
        for pool in ("k_pool", "v_pool"):  # block 0, the null block, takes padding writes
            a = getattr(mine.attention.kv_pages, pool)[1:]
            b = getattr(theirs.attention.kv_pages, pool)[1:]
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
            assert a.abs().sum() > 0


def test_reduce_splits_a_packed_step_by_its_real_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """``cpu_gemm="reduce"`` sends a step of at most REDUCE_ROWS token rows to the reductions'
    graph: a packed step by its N real tokens, not by R x S."""
    calls: list[str] = []
    made = iter(["few", "rest"])

    def compiled(fn, engine, verify, cpu_gemm):  # type: ignore[no-untyped-def]
        name = next(made)
        assert cpu_gemm == ("reduce" if name == "few" else "aten")
        return lambda *inputs: calls.append(name)

    monkeypatch.setattr(runner, "_compiled", compiled)  # each form's compile
    limits = StepLimits(rows=8, tokens=16, blocks=8, block_size=4)
    step = runner.compile_paged_step(lambda *a: None, "inductor", verify=None, cpu_gemm="reduce")
    chunk = ([1] * 10, 0, [1, 2, 3])
    decoding = [([1], 4, [4 + i, 0]) for i in range(3)]
    step(*step_inputs([chunk, *decoding], limits, CPU, mark_dynamic=False, pack=True))  # 13
    step(*step_inputs([chunk, *decoding], limits, CPU, mark_dynamic=False))  # 4 x 10
    step(*step_inputs([chunk, chunk], limits, CPU, mark_dynamic=False, pack=True))  # 20
    assert calls == ["few", "rest", "rest"]
