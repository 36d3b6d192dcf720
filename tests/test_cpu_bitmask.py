"""The C++ op applying grammar bitmasks to CPU logits (``ops/cpu_bitmask.py``) gives the
reference path's values bit for bit (``torch.add(logits, forbidden(bitmask))``,
``generation/grammar_masks.py``); the reused step bitmask (``step_bitmask``) allows every token
on the rows without a grammar."""

from __future__ import annotations

import pytest
import torch

from torch_tensorrt_dist.generation.grammar_masks import (
    forbidden,
    new_bitmask,
    step_bitmask,
)
from torch_tensorrt_dist.ops import cpu_bitmask

needs_op = pytest.mark.skipif(not cpu_bitmask.available(), reason="no C++ compiler")


def _bitmask(rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """Random masks, some words all ones or all zeros, every padding bit random."""
    words = (vocab + 31) // 32
    m = torch.randint(-(2**31), 2**31, (rows, words), generator=g, dtype=torch.int64)
    m = m.to(torch.int32)
    m[:, ::5] = -1
    m[:, 1::7] = 0
    return m


def _logits(rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=g) * 4
    flat = x.view(-1)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e38])
    where = torch.randint(flat.numel(), (24,), generator=g)
    flat[where] = specials[torch.arange(24) % len(specials)]
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit (the sign of zero included), NaN where NaN (its payload aside: torch's
    vectorized float16 conversion sets other payload bits than a scalar one)."""
    if a.shape != b.shape or not torch.equal(a.isnan(), b.isnan()):
        return False
    keep = ~a.isnan()
    return torch.equal(a[keep].view(torch.int32), b[keep].view(torch.int32))


@needs_op
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 300, 1024, 5_001])
def test_the_op_gives_the_reference_values_bit_for_bit(dtype: torch.dtype, vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    rows = 6
    x = _logits(rows, vocab, g).to(dtype)
    bitmask = _bitmask(rows + 2, vocab, g)  # more bitmask rows than logits rows
    for at in ([], [0], [1, 4], list(range(rows)), [5, 2, 2]):
        got = cpu_bitmask.masked_float(x, bitmask, at)
        assert got.dtype == torch.float32 and got.is_contiguous()
        # the reference: the grammar rows' masks, the others all ones (adds 0)
        ref_mask = new_bitmask(rows, vocab)
        ref_mask[at] = bitmask[at]
        want = torch.add(x, forbidden(ref_mask, vocab))
        assert _same(got, want), (dtype, vocab, at)


@needs_op
def test_strided_logits_and_a_row_subset() -> None:
    """Rows of a wider tensor, and columns with a stride: the values of their copy."""
    g = torch.Generator().manual_seed(0)
    base = _logits(8, 2 * 300, g).to(torch.bfloat16)
    bitmask = _bitmask(8, 300, g)
    for x in (base[:, :300], base[:, ::2], base[2:6, 300:]):
        got = cpu_bitmask.masked_float(x, bitmask, [0, 3])
        ref_mask = new_bitmask(x.shape[0], 300)
        ref_mask[[0, 3]] = bitmask[[0, 3]]
        assert _same(got, torch.add(x.contiguous(), forbidden(ref_mask, 300)))


@needs_op
def test_bad_operands_are_refused() -> None:
    x, m = torch.randn(2, 40), new_bitmask(2, 40)
    with pytest.raises(RuntimeError, match="only"):
        cpu_bitmask.masked_float(x.double(), m, [0])
    with pytest.raises(RuntimeError, match="is not a contiguous int32"):
        cpu_bitmask.masked_float(x, new_bitmask(2, 70), [0])
    with pytest.raises(RuntimeError, match="is not a contiguous int32"):
        cpu_bitmask.masked_float(x, new_bitmask(1, 40), [0])
    with pytest.raises(RuntimeError, match=r"row 2 is not in \[0, 2\)"):
        cpu_bitmask.masked_float(x, m, [2])
    assert cpu_bitmask.masked_float(torch.randn(0, 40), m, []).shape == (0, 40)


def test_the_step_bitmask_allows_every_token_outside_the_grammar_rows() -> None:
    vocab = 70
    first = step_bitmask(4, vocab, [1, 3])
    assert torch.equal(first, new_bitmask(4, vocab))
    first[1] = 0  # the step writes its grammar rows' masks
    first[3] = 5
    again = step_bitmask(4, vocab, [3])  # row 1 has no grammar any more: allows all again
    assert again.data_ptr() == first.data_ptr()  # the same buffer, no allocation
    assert torch.equal(again[1], new_bitmask(1, vocab)[0])
    assert int(again[3, 0]) == 5  # a grammar row is left for the step to write
    more = step_bitmask(20, vocab, [])  # more rows than the buffer: a new one, all allowed
    assert torch.equal(more, new_bitmask(20, vocab))
    assert step_bitmask(3, 40, [0]).shape == (3, 2)  # another vocabulary: its own buffer
