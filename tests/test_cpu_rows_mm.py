"""The C++ op of products of few token rows with row-major float32 weights
(``ops/cpu_rows_mm.py``), which ``cpu_gemm="reduce"`` puts in the Inductor engine's graphs
(``backend/row_products.py``; the steps: tests/test_row_products.py)."""

from __future__ import annotations

import pytest
import torch

from torch_tensorrt_dist.ops import cpu_rows_mm

pytestmark = pytest.mark.skipif(not cpu_rows_mm.available(), reason="no C++ compiler")


@pytest.mark.parametrize("k", [3, 16, 70, 256])
def test_products_equal_mm_for_every_row_count_and_shape(k):
    """Every blocking the kernel picks (1, 2-4, 5 and more rows; 8 rows at once and the rest;
    outputs in blocks and one at a time; a row length that is not a multiple of 16)."""
    torch.manual_seed(k)
    for n in (1, 13, 96):
        w = torch.randn(n, k)
        for m in (1, 2, 4, 5, 8, 9, 13, 40):
            x = torch.randn(m, k)
            y = cpu_rows_mm.rows_mm(x, w)
            assert y.shape == (m, n) and y.is_contiguous()
            torch.testing.assert_close(y, x @ w.t(), rtol=1e-5, atol=1e-5)


def test_a_rows_result_does_not_depend_on_the_other_rows_or_threads():
    torch.manual_seed(0)
    w, x = torch.randn(200, 256), torch.randn(13, 256)
    batch = cpu_rows_mm.rows_mm(x, w)
    threads = torch.get_num_threads()
    try:
        for t in {1, 2}:
            torch.set_num_threads(t)
            for i in range(13):
                assert torch.equal(cpu_rows_mm.rows_mm(x[i : i + 1].clone(), w), batch[i : i + 1])
            assert torch.equal(cpu_rows_mm.rows_mm(x[4:9].clone(), w), batch[4:9])
    finally:
        torch.set_num_threads(threads)


def test_bad_operands_are_refused_and_empty_ones_give_empty_products():
    with pytest.raises(RuntimeError, match="float32 only"):
        cpu_rows_mm.rows_mm(torch.randn(2, 4).double(), torch.randn(3, 4).double())
    with pytest.raises(RuntimeError, match="are not"):
        cpu_rows_mm.rows_mm(torch.randn(2, 4), torch.randn(3, 5))
    assert cpu_rows_mm.rows_mm(torch.randn(0, 4), torch.randn(3, 4)).shape == (0, 3)
    assert torch.equal(cpu_rows_mm.rows_mm(torch.randn(2, 0), torch.randn(3, 0)), torch.zeros(2, 3))


def test_the_reduce_graphs_call_the_op():
    """A compiled linear with ``cpu_gemm="reduce"`` runs the op (not Inductor's reduction)."""
    torch._dynamo.reset()
    model = torch.nn.Linear(64, 32).eval()
    fn = torch.compile(
        model, backend="torch_tensorrt_dist", options={"engine": "inductor", "cpu_gemm": "reduce"}
    )
    x = torch.randn(3, 64)
    with torch.no_grad(), torch.profiler.profile() as prof:
        y = fn(x)
    names = {e.name for e in prof.events()}
    assert any("rows_mm" in n for n in names), sorted(names)
    torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
