"""``bench --section quantize`` on a tiny checkpoint in one process: what a rank measures, and
the figures and goals built from it."""

from __future__ import annotations

from pathlib import Path

import torch

from torch_tensorrt_dist.bench.memory import write_checkpoint
from torch_tensorrt_dist.bench.quantize import CONFIGS, _tp_figures, quantize_rank
from torch_tensorrt_dist.models.llama_args import ModelArgs

ARGS = ModelArgs(
    dim=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=256,
    intermediate_size=256,
    max_seq_len=64,
)


def test_one_rank_measures_bytes_speed_and_load_peak(tmp_path: Path) -> None:
    size = write_checkpoint(tmp_path, ARGS)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = quantize_rank(0, 1, str(tmp_path), steps=2, rounds=1)
    finally:
        torch.set_num_threads(threads)
    assert list(res) == list(CONFIGS)
    fp32, bf16, int8, int4 = (res[n]["bytes"] for n in CONFIGS)
    assert fp32 == size and bf16 == size // 2
    assert int4 < int8 < bf16  # codes + scales, the bf16 embedding and head included
    assert all(res[n]["s_per_token"] > 0 and res[n]["peak"] >= 0 for n in CONFIGS)
    figures = _tp_figures("q", 1, [res], size)
    names = [f.name for f in figures]
    assert names[:4] == [f"tp=1 {n}: decode" for n in CONFIGS]
    ratio = figures[4]
    assert ratio.goal == ">= 1.5x" and ratio.met == (ratio.value >= 1.5)
    assert figures[5].name == "tp=1 int4 vs int8" and figures[5].goal == "> 1x"
