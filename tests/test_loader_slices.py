"""The loader: each rank reads only its slices (bytes counted); index files; dtypes; errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.models.llama_args import read_config
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader
from torch_tensorrt_dist.parallel import sharded_load as loader
from torch_tensorrt_dist.parallel.llama import shard_slice, tp_layout
from torch_tensorrt_dist.parallel.llama_load import hf_name, load_llama

from . import _llama_ckpt

pytest.importorskip("transformers")


class _CountingReader(SafetensorsReader):
    """Records the shape and size of every tensor the loader reads."""

    reads: list[tuple[str, tuple[int, ...], int]] = []

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        before = self.bytes_read
        t = super().read(name, dim, start, stop)
        self.reads.append((name, tuple(t.shape), self.bytes_read - before))
        return t


def _load_on_fake_rank(
    path: Path, rank: int, world: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.nn.Module, list[tuple[str, tuple[int, ...], int]]]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    reads: list[tuple[str, tuple[int, ...], int]] = []
    monkeypatch.setattr(_CountingReader, "reads", reads)
    monkeypatch.setattr(loader, "SafetensorsReader", _CountingReader)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        model = load_llama(path, group=dist.group.WORLD, progress=False)
    finally:
        dist.destroy_process_group()
        monkeypatch.undo()
    return model, reads


@pytest.mark.parametrize("world", [2, 4])
def test_each_rank_reads_only_its_slices(
    tmp_path: Path, world: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _llama_ckpt.save_checkpoint("llama_gqa", tmp_path, shard_kb=60)  # 4 heads, 2 KV, vocab 160
    full = {k: v for f in tmp_path.glob("*.safetensors") for k, v in load_file(f).items()}
    total = sum(t.numel() * t.element_size() for t in full.values())
    args = read_config(tmp_path)
    per_rank_bytes = []
    sharded_read: dict[str, int] = {}
    for rank in range(world):
        model, reads = _load_on_fake_rank(tmp_path, rank, world, monkeypatch)
        layout = tp_layout(args, rank, world)
        local = {hf_name(n, args): tuple(p.shape) for n, p in model.named_parameters()}
        for name, shape, nbytes in reads:
            assert shape == local[name], (rank, name)  # exactly the local shard, nothing more
            ours = next(n for n, _ in model.named_parameters() if hf_name(n, args) == name)
            if shard_slice(ours, layout) is not None:
                assert shape != tuple(full[name].shape)
                sharded_read[name] = sharded_read.get(name, 0) + nbytes
        per_rank_bytes.append(sum(nbytes for *_, nbytes in reads))
    replicated = sum(full[n].numel() * 4 for n in full if n not in sharded_read)
    for name, nbytes in sharded_read.items():  # the ranks together read each shard once
        kv = ".k_proj." in name or ".v_proj." in name
        copies = max(1, world // args.n_kv_heads) if kv else 1
        assert nbytes == copies * full[name].numel() * 4, name
    for nbytes in per_rank_bytes:
        assert nbytes < replicated + (total - replicated) / world * 1.5
        assert nbytes < total


def test_dtype_and_unsharded_index_free_load(tmp_path: Path) -> None:
    hf = _llama_ckpt.save_checkpoint("qwen2_tied", tmp_path)
    model = load_llama(tmp_path, dtype=torch.bfloat16, progress=False)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model.setup_caches(1, 16)
    tokens = torch.arange(12)[None]
    with torch.no_grad():
        out = model(tokens, torch.arange(12)).float()
        ref = hf(tokens).logits
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()


def _saved(tmp_path: Path) -> Path:
    _llama_ckpt.save_checkpoint("llama_gqa", tmp_path)
    return tmp_path


def test_error_missing_directory_and_config(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_llama(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"has no config\.json"):
        load_llama(tmp_path)


def test_error_truncated_file(tmp_path: Path) -> None:
    file = _saved(tmp_path) / "model.safetensors"
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="is truncated"):
        load_llama(tmp_path, progress=False)


def test_error_wrong_shape(tmp_path: Path) -> None:
    cfg_file = _saved(tmp_path) / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["intermediate_size"] = 256
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(
        CheckpointError,
        match=r"gate_proj.weight' has shape \[128, 64\], but "
        r"config.json implies \[256, 64\]",
    ):
        load_llama(tmp_path, progress=False)


def test_error_missing_tensor_and_missing_shard(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"lacks tensor 'model\.norm\.weight'"):
        load_llama(path, progress=False)
    index = {"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"missing: model-00002-of-00002\.safetensors"):
        load_llama(path, progress=False)


def test_error_heads_not_divisible_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    path = _saved(tmp_path)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=3)
    try:
        with pytest.raises(ConfigError, match="n_heads=4 is not divisible by tp=3"):
            load_llama(path, group=dist.group.WORLD, progress=False)
    finally:
        dist.destroy_process_group()
