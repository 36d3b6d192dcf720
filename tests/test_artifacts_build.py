"""Building artifacts: the exported step keeps sizes of 1 symbolic (one graph runs every shape
class, as eager does), a compile that fails midway leaves no manifest (an old one is removed
first) and no temporary files, and the compile options parse."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.artifacts import build, compile_artifacts, inductor, load_generator
from torch_tensorrt_dist.artifacts.graphs import GraphEntry
from torch_tensorrt_dist.cli.compile import parse_size
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_one_exported_step_runs_every_shape_class_as_eager(quantize: str | None) -> None:
    """torch.export over R in [1, 3], S in [1, 8] traces no 0/1 specialisation: the exported
    step equals eager ``paged_step`` for a prefill of one row and of two, a decode of one row
    and of three, each reading what the calls before it wrote into the pools (int8 weights:
    the weight-only matmuls take the dynamic rows too)."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_name("tiny")).eval()
    if quantize is not None:
        quantize_model(model, QuantConfig(quantize), engine="inductor")
    model.setup_paged(13, 4, 32)
    eager = copy.deepcopy(model)  # its own pools
    ep, schedule = inductor.export_step(model, GraphEntry("step", [1, 3], [1, 8], [2, 8]))
    assert schedule == []  # one rank: no collective
    exported = ep.module()
    t = torch.tensor
    calls = [  # tokens [R, S], start [R], last [R], table [R, NB]: rows own blocks 1-4, 5-8, 9-12
        (t([[9, 8, 7, 6, 5, 4, 3]]), t([0]), t([6]), t([[1, 2]])),
        (t([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]]), t([0, 0]), t([4, 2]), t([[5, 6], [9, 10]])),
        (t([[11]]), t([7]), t([0]), t([[1, 2]])),
        (t([[12], [13], [14]]), t([8, 5, 3]), t([0, 0, 0]), t([[1, 2, 3], [5, 6, 0], [9, 0, 0]])),
    ]
    with torch.no_grad():
        for call in calls:
            torch.testing.assert_close(exported(*call), eager.paged_step(*call))


def test_crash_mid_compile_leaves_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "art"
    out.mkdir()
    (out / "manifest.json").write_text("{}")  # a previous, complete set
    calls: list[str] = []

    def crash(ep: Any, path: Path, **kwargs: Any) -> float:
        calls.append(path.name)
        raise RuntimeError("compiler killed")

    monkeypatch.setattr(inductor, "compile_graph", crash)
    with pytest.raises(RuntimeError, match="compiler killed"):
        compile_artifacts("tiny", out, max_seq_len=64, max_batch_size=2)
    assert calls == ["step.pt2"]
    assert not (out / "manifest.json").exists()
    assert not list(out.rglob("*.tmp"))
    with pytest.raises(ArtifactError, match="a compile that did not finish writes no manifest"):
        load_generator(out)


def test_sequence_length_and_pool_before_any_rank() -> None:
    args = ModelArgs.from_name("tiny")  # 256 positions; 512 bytes of KV a token (fp32)
    assert build.cache_len_for(args, None) == 256 and build.cache_len_for(args, 1000) == 256
    assert build.cache_len_for(args, 64) == 64
    pool = {"tp": 1, "dtype": torch.float32, "block_size": 16, "max_batch_size": 2}
    assert build.check_pool(args, kv_cache_memory=None, cache_len=64, **pool) == 2 * 4 + 1
    assert build.check_pool(args, kv_cache_memory=1 << 20, cache_len=64, **pool) == 128 + 1
    tp2 = {**pool, "tp": 2}  # one KV head a rank: half the bytes a block
    assert build.check_pool(args, kv_cache_memory=1 << 20, cache_len=64, **tp2) == 256 + 1


def test_kv_cache_memory_sizes() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("64KiB") == 64 << 10
    assert parse_size("1.5 GiB") == 3 << 29
    assert parse_size("2gib") == 2 << 30
    assert parse_size("512MiB") == 512 << 20
    for bad in ("", "2GB", "1e9", "-1", "0", "MiB", "2 G"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"KiB, MiB, GiB|at least 1 byte"):
            parse_size(bad)


def test_private_aoti_loader_api_is_there() -> None:
    """inductor.Package calls torch's AOTInductor loader directly (no torch._inductor import)."""
    loader = torch._C._aoti.AOTIModelPackageLoader
    for name in ("get_constant_fqns", "load_constants", "boxed_run"):
        assert hasattr(loader, name), name
