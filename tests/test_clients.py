"""Other projects' own TP code through our backend, on 2 gloo ranks: torchtitan and HF
transformers (``examples/distributed_inference/{torchtitan_llama3,hf_transformers_tp}.py``).

Each launch checks, on every rank: one graph per compile unit and no breaks; ``explain``'s
per-call collectives equal to what the uncompiled sharded model issues (counted by the
profiler); logits equal to the unsharded model's; modules named as ``named_modules()`` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).parents[1] / "examples" / "distributed_inference"
TOL = 1e-5


def _launch(example: str, *args: str) -> dict[str, Any]:
    launch = [sys.executable, "-m", "torch_tensorrt_dist", "run", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*launch, str(EXAMPLES / example), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout[-4000:]  # rank 0 prints one JSON line
    return json.loads(lines[0])


def _clean(modules: list[str]) -> None:
    for name in modules:
        assert "__closure__" not in name and ".forward" not in name and "[" not in name, name


@pytest.mark.torchtitan
def test_torchtitan_tp_whole_and_per_block_sp_off_and_on() -> None:
    layers = 2
    out = _launch("torchtitan_llama3.py", "--layers", str(layers), "--engine", "eager")
    # torchtitan's own per-block compile cannot take our backend: why compile_blocks exists
    assert "neither 'inductor' nor 'aot_eager'" in out["apply_compile_refuses"]
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    for rank in out["ranks"]:
        off, on = rank["runs"]
        assert (off["sp"], on["sp"]) == (False, True)
        # SP off: an all-reduce after the embedding and after attention and MLP of each block;
        # SP on: reduce-scatter / all-gather pairs instead, and the final norm's all-gather
        assert off["uncompiled"]["collectives"] == 1 + 2 * layers
        assert on["uncompiled"]["collectives"] == 2 + 4 * layers
        for run in (off, on):
            expected = run["uncompiled"]["collectives"]
            assert run["uncompiled"]["max_abs_err"] <= TOL
            whole, blocks = run["whole"], run["blocks"]
            assert (whole["graphs"], whole["graph_breaks"], whole["units"]) == (1, 0, 0)
            assert whole["per_call"] == whole["listed"] == expected
            assert whole["outside_graphs"] == 0 and whole["max_abs_err"] <= TOL
            assert blocks["units"] == layers and blocks["graph_breaks"] == 0
            assert sum(blocks["runs"]) == layers  # each block call ran one graph
            assert blocks["per_call"] == expected  # in graphs x runs, plus outside graphs
            assert blocks["outside_graphs"] > 0 and blocks["max_abs_err"] <= TOL
            _clean(whole["modules"] + blocks["modules"])
            assert {"tok_embeddings", "layers.0.attention.wo", "layers.1.feed_forward.w2"} <= set(
                whole["modules"]
            )
        # SP off: one graph serves every block, and the summary says so
        assert off["blocks"]["graphs"] == 1 and off["blocks"]["runs"] == [layers]
        assert "one graph reused by layers.[0-1]" in off["blocks"]["summary"]
        assert {"layers.0.attention", "norm"} <= set(on["whole"]["modules"])  # SP's all-gathers


@pytest.mark.transformers
def test_hf_transformers_tp_plan_auto() -> None:
    out = _launch("hf_transformers_tp.py", "--engine", "eager")
    expected_modules = sorted(
        ["model.embed_tokens", "lm_head"]
        + [f"model.layers.{i}.{m}" for i in range(2) for m in ("self_attn.o_proj", "mlp.down_proj")]
    )
    for rank in out["ranks"]:
        compiled = rank["compiled"]
        assert rank["uncompiled"]["collectives"] == 6  # 2 per layer, embedding, lm_head
        assert rank["uncompiled"]["max_abs_err"] <= TOL
        assert (compiled["graphs"], compiled["graph_breaks"]) == (1, 0)
        assert compiled["per_call"] == compiled["listed"] == rank["uncompiled"]["collectives"]
        assert compiled["max_abs_err"] <= TOL
        assert compiled["modules"] == expected_modules
