"""``torchtrt-dist bench``: the fast sections end to end, and the figure table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torch_tensorrt_dist.bench import Figure, format_figures
from torch_tensorrt_dist.bench.gpu import bandwidth_limit_ms
from torch_tensorrt_dist.cli import main


def test_communication_and_gpu_sections_write_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (``main``): the sections compile in one process either way; no
    interpreter start to pay."""
    out = tmp_path / "figures.json"
    argv = ["bench", "--section", "communication", "--section", "gpu", "--json", str(out)]
    argv += ["--threads", "1"]  # the rank a child would be; two threads spin-wait on 2 busy cores
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    figures = {f["name"]: f for f in json.loads(out.read_text())["figures"]}
    for tp in (2, 4, 8):
        assert figures[f"tp={tp} all_reduces per layer"]["value"] == 2
        assert figures[f"tp={tp} graphs / breaks"]["value"] == "1 / 0"
        per_layer = figures[f"tp={tp} bytes per layer per step"]
        assert per_layer["met"] is True and per_layer["value"] == 2 * 256 * 2  # bf16, hidden 256
        assert "all_gather" in per_layer["note"]  # the vocab-parallel head's one gather
    gpu = figures["TensorRT vs Inductor decode"]
    assert gpu["value"] == "skipped" and gpu["note"]
    assert "NOT MET" not in stdout and "tp=8 all_reduces per layer" in stdout


def test_table_marks_unmet_goals() -> None:
    table = format_figures(
        [
            Figure("s", "fast", 5.0, "x", goal=">= 3x", met=True),
            Figure("s", "slow", 1.5, "x", goal=">= 3x", met=False, note="why"),
        ]
    )
    lines = table.splitlines()
    assert "met" in lines[2] and "NOT MET" in lines[3] and "why" in lines[3]


def test_bandwidth_limit() -> None:
    # 16 GB of weights at TP 2 on 4.8 TB/s: 1.67 ms per token
    assert abs(bandwidth_limit_ms(16_000_000_000, 2, "NVIDIA H200") - 1.6667) < 1e-3
    assert bandwidth_limit_ms(1, 1, "Some GPU") is None


def test_verify_section_times_both_variants_without_recompiling() -> None:
    from torch_tensorrt_dist.bench.verify_cost import verify_cost

    figures = verify_cost(n_layers=1, blocks=1, calls=2, wrapper_calls=100)
    ratio, wrapper, recompiles = figures
    assert ratio.unit == "x" and ratio.value > 0 and "ms per call" in ratio.note
    assert wrapper.unit == "us" and wrapper.value >= 0
    assert recompiles.value == 0 and recompiles.met  # verified and plain graphs coexist
