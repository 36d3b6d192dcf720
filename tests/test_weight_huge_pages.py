"""The CPU weights moved into transparent huge pages (``runtime/huge_pages.py``): the same values,
layouts and ties, backed by huge pages where the kernel gives them, and the same tokens."""

from __future__ import annotations

import mmap

import pytest
import torch
from torch import nn

from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.runtime import huge_pages
from torch_tensorrt_dist.runtime.huge_pages import (
    huge_kib,
    huge_page_tensors,
    huge_page_weights,
    huge_pages_available,
)

needs_thp = pytest.mark.skipif(
    not huge_pages_available(), reason="no transparent huge pages here (not Linux, or never)"
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(512, 1024), nn.Linear(1024, 512), nn.Embedding(512, 1024))
    m[1].weight.data = m[1].weight.data.t().contiguous().t()  # column-major, as ATen's wants
    head = nn.Linear(1024, 512, bias=False)
    head.weight = m[1].weight  # tied: one Parameter in two modules
    m.append(head)
    return m


def _region(m: nn.Module) -> tuple[int, int]:
    """The lowest and highest byte of ``m``'s parameters."""
    return (
        min(p.data_ptr() for p in m.parameters()),
        max(p.data_ptr() + p.untyped_storage().nbytes() for p in m.parameters()),
    )


def _huge_kib(lo: int, hi: int) -> int:
    kib = huge_kib(lo, hi)
    assert kib is not None, "/proc/self/smaps cannot be read"
    return kib


@needs_thp
def test_weights_move_with_their_values_strides_and_ties() -> None:
    m = _model()
    x, y = torch.randn(3, 512), torch.randn(3, 1024)
    want, head = m[1](m[0](x)).clone(), m[3](y).clone()
    before = {n: (p.stride(), p.data_ptr(), p.clone()) for n, p in m.named_parameters()}
    moved = huge_page_weights(m)
    assert moved >= sum(p.numel() * 4 for p in m.parameters())
    for name, p in m.named_parameters():
        stride, ptr, value = before[name]
        assert p.stride() == stride and p.data_ptr() != ptr and torch.equal(p, value), name
    assert m[3].weight is m[1].weight
    assert m[3].weight.data_ptr() == m[1].weight.data_ptr()
    assert torch.equal(m[1](m[0](x)), want) and torch.equal(m[3](y), head)
    lo, hi = _region(m)
    assert hi - lo <= 2 * moved  # one region
    m[0].weight.data.add_(1.0)  # a write after the move lands in the parameter
    assert torch.equal(m[0].weight, before["0.weight"][2] + 1.0)


@needs_thp
def test_the_moved_weights_are_backed_by_huge_pages() -> None:
    m = _model()  # about 6 MiB: whole 2 MiB pages inside it
    huge_page_weights(m)
    assert _huge_kib(*_region(m)) >= 2048


class _Marked(torch.Tensor):
    pass


@needs_thp
def test_loose_tensors_move_into_one_aligned_region_with_their_values() -> None:
    """What a loaded artifact's weight shard gets (``artifacts/load.py``): a dict of tensors,
    int8 codes among them, one a transposed view of another's storage."""
    torch.manual_seed(0)
    big = torch.randn(1024, 1024)  # 4 MiB: whole huge pages inside the region
    weights = {
        "w": big,
        "w.t": big.t(),
        "codes": torch.randint(-128, 127, (300, 7), dtype=torch.int8),
        "scales": torch.rand(300, dtype=torch.bfloat16),
    }
    before = {k: (t.clone(), t.stride(), t.storage_offset()) for k, t in weights.items()}
    other = torch.rand(8).as_subclass(_Marked)  # a subclass (as DTensor is): not ours to move
    other_ptr = other.data_ptr()
    storages = big.nbytes + weights["codes"].nbytes + weights["scales"].nbytes  # 3, not 4
    moved = huge_page_tensors([*weights.values(), other])
    assert storages <= moved < storages + 3 * 64
    # each storage moves as a storage of its own, its tensors at their own storage offsets:
    # code that reads a tensor from its storage's start (Inductor's C++ GEMM template packing
    # a constant weight) reads the same bytes as before the move
    assert len({t.untyped_storage().data_ptr() for t in weights.values()}) == 3
    for k, t in weights.items():
        value, stride, offset = before[k]
        assert torch.equal(t, value) and t.stride() == stride and t.data_ptr() % 64 == 0, k
        assert t.storage_offset() == offset == 0, k
        from_start = torch.empty(0, dtype=t.dtype).set_(
            t.untyped_storage(), 0, t.size(), t.stride()
        )
        assert torch.equal(from_start, value), k
    assert weights["w.t"].untyped_storage().data_ptr() == weights["w"].untyped_storage().data_ptr()
    assert other.data_ptr() == other_ptr
    assert _huge_kib(big.data_ptr(), big.data_ptr() + big.nbytes) >= 2048


def test_nothing_moves_where_the_system_gives_no_huge_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(huge_pages, "system_thp_mode", lambda: "never")
    assert not huge_pages_available()
    m = _model()
    ptrs = [p.data_ptr() for p in m.parameters()]
    assert huge_page_weights(m) == 0
    assert huge_page_tensors(m.parameters()) == 0
    assert [p.data_ptr() for p in m.parameters()] == ptrs


def test_only_where_the_system_gives_them() -> None:
    assert not huge_pages_available("never")
    assert huge_pages_available("madvise") == hasattr(mmap, "MADV_HUGEPAGE")
    assert huge_pages_available("always") == hasattr(mmap, "MADV_HUGEPAGE")


@needs_thp
def test_the_generator_moves_its_weights_not_its_pools_and_keeps_the_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prompt = [[5, 17, 301, 44, 9]]
    with monkeypatch.context() as never:  # the reference: a system without huge pages
        never.setattr(huge_pages, "system_thp_mode", lambda: "never")
        plain = Generator(load_llama(demo_checkpoint_path(), progress=False), cache_len=64)
    want = plain.generate(prompt, max_new_tokens=8).tokens
    model = load_llama(demo_checkpoint_path(), progress=False)
    gen = Generator(model, cache_len=64)
    assert gen.generate(prompt, max_new_tokens=8).tokens == want
    lo, hi = _region(model)
    assert _huge_kib(lo, hi) >= 2048
    assert all(lo <= p.data_ptr() < hi for p in model.parameters())
    pools = [b for n, b in model.named_buffers() if n.endswith("_pool")]
    assert pools and not any(lo <= b.data_ptr() < hi for b in pools)
