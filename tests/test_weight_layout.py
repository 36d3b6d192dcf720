"""Column-major linear weights for CPU matmuls (``models/weight_layout.py``): same values and
outputs, only eligible weights changed, and the Inductor generator applies it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.models.weight_layout import (
    column_major_linears,
    is_column_major,
    row_major_linears,
)
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model
from torch_tensorrt_dist.runtime import huge_pages

ARGS = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=96, intermediate_size=96)


def _model(seed: int = 0, **kw: object) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelArgs(**{**ARGS, "max_seq_len": 32, **kw})).eval()  # type: ignore[arg-type]


def _linears(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.weight for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def test_every_float_linear_becomes_column_major_with_its_values() -> None:
    model = _model()
    before = {n: (w, w.detach().clone()) for n, w in _linears(model).items()}
    xs = {n: torch.randn(3, w.shape[1]) for n, w in _linears(model).items()}
    mods = dict(model.named_modules())
    with torch.no_grad():
        ref = {n: mods[n](x) for n, x in xs.items()}
    assert column_major_linears(model) == len(before) == 2 * 7 + 1  # 7 per layer, the head
    for name, w in _linears(model).items():
        param, values = before[name]
        assert w is param  # the same parameter, new storage
        assert is_column_major(w) and not w.is_contiguous() and w.shape == values.shape
        assert torch.equal(w, values)
    with torch.no_grad():
        for n, x in xs.items():
            torch.testing.assert_close(mods[n](x), ref[n], rtol=1e-5, atol=1e-5)
    assert column_major_linears(model) == 0  # nothing left to change


def test_quantized_linears_embeddings_and_tied_heads_keep_their_layout() -> None:
    model = _model(tie_embeddings=True)
    embedding = model.tok_embeddings.weight
    quantize_model(model, QuantConfig("int8"), engine="inductor")
    buffers = {n: b.stride() for n, b in model.named_buffers()}
    assert column_major_linears(model) == 0  # every linear is quantized; the head is tied
    assert {n: b.stride() for n, b in model.named_buffers()} == buffers
    assert model.tok_embeddings.weight is embedding and embedding.is_contiguous()


def test_meta_and_vector_weights_are_left_alone() -> None:
    layers = nn.Sequential(nn.Linear(8, 1), nn.Linear(1, 8))
    with torch.device("meta"):
        meta = nn.Linear(8, 8)
    assert column_major_linears(nn.ModuleList([layers, meta])) == 0
    assert all(m.weight.is_contiguous() for m in (*layers, meta))


@pytest.mark.parametrize(
    ("engine", "cpu_gemm", "changed"),
    [("inductor", "aten", True), ("inductor", "reduce", False), ("none", "aten", False)],
)
def test_the_inductor_generator_lays_out_its_linears(
    engine: str, cpu_gemm: str, changed: bool
) -> None:
    """Only the Inductor engine with ATen's products: the eager engine is the reference (and
    the compile-once artifacts' export, whose packages read row-major weights from their
    file); ``reduce`` reads weight rows (``backend/row_products.py``), and gets them back
    from a model an earlier generator laid out column-major."""
    model = _model()
    Generator(model, engine=engine, max_batch_size=2, cache_len=32, cpu_gemm=cpu_gemm)
    assert all(is_column_major(w) == changed for w in _linears(model).values())
    if cpu_gemm == "reduce":
        column_major_linears(model)
        Generator(model, engine=engine, max_batch_size=2, cache_len=32, cpu_gemm=cpu_gemm)
        assert all(w.is_contiguous() for w in _linears(model).values())


def test_reduce_copies_no_float32_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row-major as loaded, a float32 weight keeps its storage under ``reduce`` (it is not laid
    out column-major and back; the move into huge pages, which copies every weight once, is
    off here, as on a system whose THP mode is never: tests/test_weight_huge_pages.py)."""
    monkeypatch.setattr(huge_pages, "system_thp_mode", lambda: "never")
    model = _model()
    storages = {n: w.data_ptr() for n, w in _linears(model).items()}
    Generator(model, engine="inductor", max_batch_size=2, cache_len=32, cpu_gemm="reduce")
    assert {n: w.data_ptr() for n, w in _linears(model).items()} == storages


def test_row_major_undoes_column_major_with_the_values() -> None:
    model = _model()
    values = {n: w.detach().clone() for n, w in _linears(model).items()}
    assert row_major_linears(model) == 0  # as loaded
    column_major_linears(model)
    assert row_major_linears(model) == len(values)
    for name, w in _linears(model).items():
        assert w.is_contiguous() and torch.equal(w, values[name])


def test_reduce_keeps_float32_weights_row_major_and_others_column_major() -> None:
    """The reductions take float32 weights only (``backend/row_products.py``): a bf16 model's
    products stay ATen's, on the layout ATen's GEMM reads faster."""
    for dtype, column in ((torch.float32, False), (torch.bfloat16, True)):
        model = _model().to(dtype)
        Generator(model, engine="inductor", max_batch_size=2, cache_len=32, cpu_gemm="reduce")
        assert all(is_column_major(w) == column for w in _linears(model).values()), dtype
