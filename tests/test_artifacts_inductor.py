"""Compile once, run many (AOTInductor, 2 gloo ranks): the same greedy tokens as the checkpoint,
and every refusal of a defective directory or an out-of-shape request, with its message.

One spawn compiles the artifacts (a tiny tied-embedding checkpoint, one prefill bucket) and
checks everything that needs live ranks; the CLI test reuses the directory.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.artifacts import read_manifest
from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.testing import run_on_ranks

from . import _artifact_fns, _llama_ckpt

pytest.importorskip("transformers")

PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]
MAX_NEW = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("artifacts")
    hf = _llama_ckpt.save_checkpoint("qwen2_tied", root / "ckpt")
    out = root / "out"
    res = run_on_ranks(
        _artifact_fns.compile_and_generate,
        2,
        str(root / "ckpt"),
        str(out),
        PROMPTS,
        MAX_NEW,
        timeout=420,
    )
    return {
        "out": out,
        "ranks": res,
        "hf": [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS],
    }


def test_same_tokens_as_checkpoint_and_transformers(built: dict[str, Any]) -> None:
    for r in built["ranks"]:
        assert r["artifacts"] == r["checkpoint"] == built["hf"]
        assert r["single"] == built["hf"][:1]  # one row through the 2-row graphs
        # the serving core (joins, leaves, a cancel, slot reuse) over the loaded graphs
        assert r["served"] == r["served_checkpoint"] and r["served"][0] == built["hf"][0]


def test_manifest_records_layout_groups_and_files(built: dict[str, Any]) -> None:
    out: Path = built["out"]
    m = read_manifest(out)
    assert (m.world_size, m.tp, m.pp, m.engine, m.device) == (2, 2, 1, "inductor", "cpu")
    assert [(g.name, g.ranks) for g in m.groups] == [("0", [0, 1])]
    assert m.buckets == [16] and m.cache_len == 64 and m.max_batch_size == 2
    for entry in m.ranks:
        assert set(entry.files) == {"prefill-16", "decode", "weights"}
        # 2 all-reduces per layer + the embedding's + the vocab-parallel head's
        assert len(entry.schedules["decode"]) == 2 * 2 + 2
        assert all(s.startswith("all_reduce(sum,0)") for s in entry.schedules["decode"])
        for f in entry.files.values():
            mode = stat.S_IMODE(os.stat(out / f.path).st_mode)
            assert mode == 0o644, (f.path, oct(mode))
    assert m.versions["torch"] and m.checkpoint["sha256"]
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.pt2"))


def test_refusals_by_name(built: dict[str, Any]) -> None:
    errors = built["ranks"][0]["errors"]
    assert (
        "ArtifactError: rank-1/decode.pt2 (decode) is corrupt"
        in built["ranks"][1]["errors"]["corrupt"]
    )
    assert errors["corrupt"] == ""  # rank 0's own files are intact; rank 1 stops the job
    assert "rank-0/weights.safetensors (weights) is missing" in errors["missing"]
    assert "compiled with torch 2.0.0" in errors["version"]
    assert "process group '0' (tp) of the artifacts" in errors["groups"]
    assert "ranks [1, 0]" in errors["groups"]
    assert "artifact format version 99" in errors["format"]
    assert "this run has world size 2 (pp 2 x tp 1)" in errors["layout"]
    assert "3 prompts, but the artifacts were compiled for batch 2" in errors["batch"]
    assert "no compiled prefill bucket fits a 20-token prompt" in errors["bucket"]
    assert "exceeds the compiled sequence length 64" in errors["length"]


def test_one_process_is_refused_before_any_collective(built: dict[str, Any]) -> None:
    from torch_tensorrt_dist.artifacts import load_generator

    with pytest.raises(ArtifactError, match=r"world size 2 \(pp 1 x tp 2\).*world size 1"):
        load_generator(built["out"])


def test_cli_generate_from_artifacts(
    built: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    out = str(built["out"])
    text = "\x03\x05\x07\x09\x0b"  # byte tokens 3 5 7 9 11 (no tokenizer.json)
    args = ["generate", "--artifacts", out, "--prompt", text, "--max-new-tokens", str(MAX_NEW)]
    assert main([*args, "--json"]) == 0
    captured = capfd.readouterr()
    lines = [ln for ln in captured.out.splitlines() if ln.startswith("{")]
    result = json.loads(lines[0])
    assert result["tokens"] == built["hf"][:1]
    assert result["engine"] == "artifacts:inductor" and result["tp"] == 2
    assert "OMP_NUM_THREADS" not in captured.err  # the launcher sets it silently
    # refused before any rank starts
    assert main([*args, "--tp", "1"]) == 2
    assert "compiled for world size 2" in capfd.readouterr().err
    assert main([*args, "--max-new-tokens", "60"]) == 2
    assert "exceeds the compiled sequence length 64" in capfd.readouterr().err


def test_cli_compile_refuses_pipeline_and_tensorrt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compile", "--model", "tiny", "--pp", "2", "--out", str(tmp_path)]) == 2
    assert "--pp 2: pipeline artifacts are not supported yet" in capsys.readouterr().err
    assert main(["compile", "--model", "tiny", "--engine", "tensorrt", "--out", str(tmp_path)]) == 2
    assert "TensorRT artifacts are not built yet" in capsys.readouterr().err
    assert main(["compile", "--model", "nope", "--tp", "2", "--out", str(tmp_path)]) == 2
    assert "'nope' is neither a checkpoint directory nor a preset" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()
