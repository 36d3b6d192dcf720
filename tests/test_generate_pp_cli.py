"""``torchtrt-dist generate --pp`` on the shipped demo model equals ``--tp 1``: pp 2 x tp 2
(compiled by the default engine, an uneven split), pp 2 x tp 1, and pp 2 x tp 1 with each stage
quantizing its own layers (equal to the int8 whole model)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import subprocess
import sys
from typing import Any

import pytest

from torch_tensorrt_dist.cli import main


def _generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch_tensorrt_dist", "generate", "--max-new-tokens", "12", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


PROMPTS = ("--json", "--prompt", "The for statement", "--prompt", "Python")


@functools.cache
def _json(*args: str) -> dict[str, Any]:
    """The command's JSON line: a pipeline in a child process (its launcher and ranks, as a
    user runs it), ``--tp 1`` (one process, no launcher) in this one, an interpreter start
    less."""
    if "--pp" not in args:
        stdout = io.StringIO()
        # --threads 1, as each pipeline rank runs: on a busy 2-core machine two threads
        # spin-wait, up to 20x slower
        with contextlib.redirect_stdout(stdout):
            argv = ["generate", "--max-new-tokens", "12", "--threads", "1", *args, *PROMPTS]
            assert main(argv) == 0
        line = stdout.getvalue().splitlines()[-1]
    else:
        proc = _generate(*args, *PROMPTS)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = proc.stdout.splitlines()[-1]
    out: dict[str, Any] = json.loads(line)
    return out


@pytest.mark.parametrize(
    "layout",
    # compiled (the default eager engine) at pp 2 x tp 1, plain PyTorch at pp 2 x tp 2: 2 ranks
    # compile, not 4 (test_pipeline_gloo compiles pp 2 x tp 2 in one spawn)
    [("--pp", "2", "--tp", "1"), ("--pp", "2", "--tp", "2", "--split", "1,3", "--engine", "none")],
)
def test_pipeline_greedy_tokens_equal_tp1(layout: tuple[str, ...]) -> None:
    two_d, one = _json(*layout), _json("--tp", "1", "--engine", "none")
    assert (two_d["pp"], two_d["tp"], one["pp"], one["tp"]) == (2, int(layout[3]), 1, 1)
    assert len(two_d["tokens"][0]) == 12 and len(two_d["tokens"]) == 2
    assert two_d["tokens"] == one["tokens"] and two_d["text"] == one["text"]


def test_quantized_stages_equal_the_quantized_whole_model() -> None:
    int8 = ("--quantize", "int8", "--engine", "none")
    staged, whole = _json("--pp", "2", "--tp", "1", *int8), _json("--tp", "1", *int8)
    assert staged["quantize"] == whole["quantize"] and staged["quantize"]["scheme"] == "int8"
    assert staged["tokens"] == whole["tokens"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp", "5", "--tp", "1"], "pp=5"),
        (["--pp", "2", "--tp", "1", "--split", "1,2"], "split"),
        (["--pp", "2", "--split", "a,b"], "--split 'a,b' is not a comma-separated list"),
        (["--pp", "0"], "--tp, --pp and --ep must be >= 1"),
    ],
)
def test_bad_pipeline_layouts_fail_before_any_rank_starts(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """In this process (``main`` returns before it would start a rank)."""
    assert main(["generate", "--max-new-tokens", "12", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
