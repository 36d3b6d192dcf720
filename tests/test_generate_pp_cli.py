"""``torchtrt-dist generate --pp 2 --tp 2`` on the shipped demo model equals ``--tp 1``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch_tensorrt_dist", "generate", "--max-new-tokens", "12", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_pp2_tp2_greedy_tokens_equal_tp1() -> None:
    two_d = _generate("--pp", "2", "--tp", "2", "--json", "--split", "1,3")
    one = _generate("--tp", "1", "--json")
    assert two_d.returncode == 0, two_d.stderr[-3000:]
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = json.loads(two_d.stdout.splitlines()[-1]), json.loads(one.stdout.splitlines()[-1])
    assert (a["pp"], a["tp"], b["pp"], b["tp"]) == (2, 2, 1, 1)
    assert len(a["tokens"][0]) == 12
    assert a["tokens"] == b["tokens"] and a["text"] == b["text"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "5", "--tp", "1"], "pp=5"),
        (["--pp", "2", "--tp", "1", "--split", "1,2"], "split"),
        (["--pp", "2", "--split", "a,b"], "--split 'a,b' is not a comma-separated list"),
        (["--pp", "0"], "--tp, --pp and --ep must be >= 1"),
    ],
)
def test_bad_pipeline_layouts_fail_before_any_rank_starts(args: list[str], message: str) -> None:
    proc = _generate(*args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
