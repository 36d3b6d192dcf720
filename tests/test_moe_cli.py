"""``generate --ep`` (and ``--pp`` stages of it) and the expert-parallel example, as a user runs
them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.testing import free_port

from . import _llama_ckpt, _moe_ckpt

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "distributed_inference" / "expert_parallel_moe.py"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    path = tmp_path_factory.mktemp("moe") / "qwen2_moe"
    hf = _moe_ckpt.save_checkpoint("qwen2_moe", path)
    return path, _llama_ckpt.hf_greedy(hf, list(b"Hello"), 8)


def _generate(path: Path, *extra: str) -> list[str]:
    return [
        "generate",
        "--model",
        str(path),
        "--engine",
        "none",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "8",
        *extra,
    ]


def test_generate_moe_json_equals_transformers(
    qwen: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, expected = qwen
    assert main([*_generate(path), "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens"] == [expected] and out["ep"] == 1


@pytest.mark.parametrize(
    ("extra", "text"),
    [
        (("--ep", "3"), "ep=3 does not divide the 4 experts; use ep in [1, 2, 4]"),
        (("--ep", "2", "--tp", "3"), "tp=3 does not divide the expert FFN size 16"),
        (("--ep", "2", "--pp", "3"), "pp=3 stages but the model has 2 layers"),
    ],
)
def test_generate_moe_bad_layout_exits_2(
    qwen: tuple[Path, list[int]],
    capsys: pytest.CaptureFixture[str],
    extra: tuple[str, ...],
    text: str,
) -> None:
    assert main([*_generate(qwen[0]), *extra]) == 2
    assert text in capsys.readouterr().err


def test_generate_moe_stages_pp2_ep2_equal_transformers(
    qwen: tuple[Path, list[int]], capfd: pytest.CaptureFixture[str]
) -> None:
    """Two pipeline stages of ep 2 (4 gloo ranks): each stage a MoE model of its layers."""
    path, expected = qwen
    assert main([*_generate(path), "--pp", "2", "--ep", "2", "--json"]) == 0
    out: dict[str, Any] = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert out["tokens"] == [expected] and (out["pp"], out["ep"], out["tp"]) == (2, 2, 1)


def test_ep_on_a_dense_model_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--engine", "none", "--ep", "2", "--max-new-tokens", "2"]) == 2
    assert "--ep 2 needs a mixture-of-experts checkpoint" in capsys.readouterr().err


def test_expert_parallel_example_two_ranks(qwen: tuple[Path, list[int]]) -> None:
    """ep 2 on 2 gloo ranks through the eager engine (compiled prefill and decode graphs)."""
    path, expected = qwen
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "py"), env.get("PYTHONPATH", "")])
    launch = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]
    cmd = [
        *launch,
        str(EXAMPLE),
        "--model",
        str(path),
        "--ep",
        "2",
        "--engine",
        "eager",
        "--prompt",
        "Hello",
        "--max-new-tokens",
        "8",
        "--check",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert out["match"] is True and (out["ep"], out["tp"]) == (2, 1)
    assert out["tokens"] == expected
