"""The positioned-read safetensors reader: exact slices, exact bytes read, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from torch_tensorrt_dist.models.safetensors_io import CheckpointError, SafetensorsReader


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(16, 12, generator=g),
        "h": torch.randn(8, 4, generator=g).to(torch.bfloat16),
        "cube": torch.randn(3, 4, 5, generator=g).half(),
        "ids": torch.arange(10),
    }
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(["w", "h", "cube"]),
    dim=st.sampled_from([0, 1]),
    bounds=st.tuples(st.integers(0, 16), st.integers(0, 16)),
)
def test_slices_equal_torch_slicing(ckpt, name: str, dim: int, bounds: tuple[int, int]) -> None:
    path, tensors = ckpt
    full = tensors[name]
    start, stop = sorted(b % (full.shape[dim] + 1) for b in bounds)
    with SafetensorsReader(path) as f:
        got = f.read(name, dim, start, stop)
        want = full.narrow(dim, start, stop - start)
        assert got.dtype == want.dtype and torch.equal(got, want)
        assert f.bytes_read == want.numel() * want.element_size()  # only the slice was read


def test_whole_tensors_and_keys(ckpt) -> None:
    path, tensors = ckpt
    with SafetensorsReader(path) as f:
        assert sorted(f.keys()) == sorted(tensors)
        for name, t in tensors.items():
            assert torch.equal(f.read(name), t)
        assert f.info("w").shape == (16, 12)


def test_truncated_file_is_named(ckpt, tmp_path: Path) -> None:
    path, _ = ckpt
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"is truncated: tensor .* download the file again"):
        SafetensorsReader(cut)


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="not a safetensors file"):
        SafetensorsReader(bad)
    with pytest.raises(CheckpointError, match="cannot open"):
        SafetensorsReader(tmp_path / "missing.safetensors")


def test_unknown_tensor_and_bad_slice(ckpt) -> None:
    path, _ = ckpt
    with SafetensorsReader(path) as f:
        with pytest.raises(CheckpointError, match="has no tensor 'nope'"):
            f.read("nope")
        with pytest.raises(CheckpointError, match=r"slice \[4:20\]"):
            f.read("w", 1, 4, 20)
