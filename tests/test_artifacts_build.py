"""Building artifacts: the exported step keeps sizes of 1 symbolic (one graph runs every shape
class, as eager does), a compile that fails midway leaves no manifest (an old one is removed
first) and no temporary files, and the compile options parse."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.artifacts import inductor, load_generator
from torch_tensorrt_dist.artifacts.graphs import GraphEntry
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.families.compile import compile_artifacts
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model


@pytest.mark.parametrize(
    ("quantize", "overrides"),
    [(None, {}), ("int8", {}), (None, {"qk_norm": True, "head_dim": 24})],
    ids=["fp32", "int8", "qwen3"],
)
def test_one_exported_step_runs_every_shape_class_as_eager(
    quantize: str | None, overrides: dict[str, Any]
) -> None:
    """torch.export over R in [1, 3], S in [1, 8] traces no 0/1 specialisation: the exported
    step equals eager ``paged_step`` for a prefill of one row and of two, a decode of one row
    and of three, each reading what the calls before it wrote into the pools (int8 weights:
    the weight-only matmuls take the dynamic rows too; Qwen3's per-head q/k norms with a
    head_dim that is not dim / heads)."""
    torch.manual_seed(0)
    model = Transformer(ModelArgs.from_name("tiny", **overrides)).eval()
    if quantize is not None:
        quantize_model(model, QuantConfig(quantize), engine="inductor")
    model.setup_paged(13, 4, 32)
    eager = copy.deepcopy(model)  # its own pools
    ep, schedule = inductor.export_step(model, GraphEntry("step", [1, 3], [1, 8], [2, 8]))
    assert schedule == []  # one rank: no collective
    exported = ep.module()
    limits = StepLimits(rows=3, tokens=8, blocks=8, block_size=4)
    rows = [  # (tokens, start, blocks): the sequences own blocks 1-4, 5-8, 9-12
        [([9, 8, 7, 6, 5, 4, 3], 0, [1, 2])],
        [([1, 2, 3, 4, 5], 0, [5, 6]), ([6, 7, 8], 0, [9, 10])],
        [([11], 7, [1, 2])],
        [([12], 8, [1, 2, 3]), ([13], 5, [5, 6]), ([14], 3, [9])],
    ]
    with torch.no_grad():
        for call in rows:
            inputs = step_inputs(call, limits, torch.device("cpu"), mark_dynamic=False)
            torch.testing.assert_close(exported(*inputs), eager.paged_step(*inputs))


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


def test_the_pool_a_compile_builds_is_known_before_any_rank() -> None:
    """The KV pool of each rank from the model's shape alone (what ``compile`` checks before
    any rank starts, ``families.check_kv_cache``): blocks of 16 tokens, 512 bytes of KV a token
    for the tiny model in fp32, half of that a rank at TP 2 (one KV head each)."""
    from torch_tensorrt_dist.errors import ConfigError
    from torch_tensorrt_dist.generation.kv_memory import kv_layout_for

    args = ModelArgs.from_name("tiny")
    one = kv_layout_for(args, tp=1, dtype=torch.float32, block_size=16)
    assert one.bytes_per_token == 2 * 2 * 2 * 16 * 4 == 512  # k and v, 2 layers, 2 heads, 16 dims
    assert one.blocks_for_memory(None, rows=2, max_seq_len=64) == 2 * 4 + 1
    assert one.blocks_for_memory(1 << 20, rows=2, max_seq_len=64) == 128 + 1
    two = kv_layout_for(args, tp=2, dtype=torch.float32, block_size=16)
    assert two.blocks_for_memory(1 << 20, rows=2, max_seq_len=64) == 256 + 1
    with pytest.raises(ConfigError, match=r"needs 4: give at least 32768 \(32.0 KiB\)"):
        one.blocks_for_memory(30_000, rows=2, max_seq_len=64)


def test_private_aoti_loader_api_is_there() -> None:
    """inductor.Package calls torch's AOTInductor loader directly (no torch._inductor import)."""
    loader = torch._C._aoti.AOTIModelPackageLoader
    for name in ("get_constant_fqns", "load_constants", "boxed_run"):
        assert hasattr(loader, name), name
