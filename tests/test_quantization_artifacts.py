"""Quantized artifacts: the manifest records the scheme and refuses a mismatch, and the weight
shard keeps codes and scales, read back aligned (the int8 kernel needs it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from torch_tensorrt_dist.artifacts import inductor
from torch_tensorrt_dist.artifacts.build import _save_weights
from torch_tensorrt_dist.artifacts.checks import check_quantization
from torch_tensorrt_dist.artifacts.load import read_weights
from torch_tensorrt_dist.artifacts.manifest import Manifest, RankEntry, write_manifest
from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

ARGS = ModelArgs.from_name("tiny")


def _manifest(quantization: dict[str, object] | None) -> Manifest:
    return Manifest(
        engine="inductor",
        world_size=1,
        tp=1,
        pp=1,
        groups=[],
        ranks=[RankEntry(0, {}, {"step": []})],
        dtype="fp32",
        max_batch_size=1,
        cache_len=64,
        block_size=16,
        num_blocks=5,
        max_prefill_tokens=64,
        graphs=[],
        model_args=dataclasses.asdict(ARGS),
        checkpoint={"source": "preset:tiny", "sha256": "ab"},
        options={},
        tokenizer=None,
        versions={"torch": torch.__version__},
        quantization=quantization,
    )


def test_the_manifest_records_the_scheme_and_refuses_a_mismatch() -> None:
    int8 = QuantConfig("int8").to_dict()
    m = _manifest(int8)
    assert Manifest.from_dict(json.loads(m.to_json())).quantization == int8
    check_quantization(m, None)  # no --quantize: the compiled weights are used
    check_quantization(m, int8)
    with pytest.raises(ArtifactError, match="differs from the compiled"):
        check_quantization(m, QuantConfig("int8", embeddings=True).to_dict())
    plain = _manifest(None)
    with pytest.raises(ArtifactError) as err:
        check_quantization(plain, int8)
    assert str(err.value) == (
        "--quantize int8: the artifacts were compiled without --quantize (their weights are "
        "fp32); drop --quantize, or recompile with `torchtrt-dist compile --quantize int8`"
    )
    data = json.loads(plain.to_json())
    del data["quantization"]  # written before the field existed
    assert Manifest.from_dict(data).quantization is None


def test_generate_quantize_on_plain_artifacts_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_manifest(tmp_path, _manifest(None))
    assert main(["generate", "--artifacts", str(tmp_path), "--quantize", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --quantize int8: the artifacts were compiled without")
    assert len(err.splitlines()) == 1


def test_int4_artifacts_are_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["compile", "--model", "tiny", "--quantize", "int4", "--group-size", "32"]
    assert main([*args, "--out", str(tmp_path)]) == 2
    assert "compile with --quantize int8" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()


def test_the_weight_shard_holds_codes_and_scales_read_back_aligned(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    quantize_model(model, QuantConfig("int8"))
    model.setup_paged(5, 4, 16)
    saved, state = inductor.constants_of(model)
    # the pools are state (zeros at load), not saved; the RoPE tables are saved
    assert state["model.layers.0.attention.kv_pages.k_pool"] == [5, 4, 2, 16]
    assert len(state) == 2 * ARGS.n_layers and "model.rope_cos" in saved
    _save_weights(tmp_path / "weights.safetensors", saved)
    back = read_weights(tmp_path / "weights.safetensors", torch.device("cpu"))
    assert back.keys() == saved.keys()
    assert back["model.layers.0.attention.wq.weight"].dtype == torch.int8
    assert back["model.layers.0.attention.wq.scales"].dtype == torch.bfloat16
    for name, t in back.items():
        assert torch.equal(t, saved[name]), name
        assert t.data_ptr() % 64 == 0, name
