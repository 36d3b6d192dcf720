"""``torchtrt-dist generate`` end to end: --json at tp 1 (in process) and tp 2 (own ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.cli import main

from . import _llama_ckpt
from ._core_fns import one_thread

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Hi there"
#: the runs in this process: one torch thread, as each launched rank runs (on a busy 2-core
#: machine two threads spin-wait, up to 20x slower)
ONE_THREAD = ("--threads", "1")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    path = tmp_path_factory.mktemp("cli") / "llama"
    # no tokenizer.json: byte tokens; one layer: the CLI is under test here (depth and
    # layouts at tp 2 and 4: test_generate_tp.py), and the verify tests compile it twice
    hf = _llama_ckpt.save_checkpoint("llama_gqa", path, num_hidden_layers=1)
    with one_thread():
        return path, _llama_ckpt.hf_greedy(hf, list(PROMPT.encode()), 6)


def _json(stdout: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, stdout  # exactly one JSON object, from rank 0
    return dict(json.loads(lines[0]))


def _args(path: Path, *extra: str) -> list[str]:
    return [
        "generate",
        "--model",
        str(path),
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "6",
        "--engine",
        "none",
        "--json",
        *extra,
    ]


def test_tp1_json_equals_transformers(
    ckpt: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, expected = ckpt
    assert main([*_args(path), *ONE_THREAD]) == 0
    out = _json(capsys.readouterr().out)
    assert out["tokens"] == [expected]
    assert out["text"] == [bytes(t for t in expected if t < 256).decode(errors="replace")]
    assert out["tp"] == 1 and out["engine"] == "none"
    assert out["ttft_s"] > 0 and out["tokens_per_s"] > 0


def test_tp1_verified_eager_equals_transformers(
    ckpt: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    # the prefill and decode graphs (KV caches written in place) pass their first-call check
    path, expected = ckpt
    assert main([*_args(path), "--engine", "eager", "--verify", *ONE_THREAD]) == 0
    out = _json(capsys.readouterr().out)
    assert out["tokens"] == [expected] and out["engine"] == "eager"


def test_tp1_verify_failure_is_a_one_line_error(
    ckpt: tuple[Path, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    import torch._dynamo

    from . import _verify_fns

    path, _ = ckpt
    torch._dynamo.reset()  # compile anew (an earlier test may have compiled the same steps)
    with _verify_fns.broken_engine(_verify_fns.double_first_output):
        assert main([*_args(path), "--engine", "eager", "--verify", *ONE_THREAD]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the loading progress bar
    assert last.startswith("error: rank 0: graph #") and "(engine eager): output 0" in last
    assert "Traceback" not in err


def test_tp2_starts_its_own_ranks(ckpt: tuple[Path, list[int]]) -> None:
    # gpt-fast's layout (the default one is checked at tp 2 and 4 in test_generate_tp.py)
    layout = ["--embedding", "replicated", "--lm-head", "replicated"]
    path, expected = ckpt
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "py"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "torch_tensorrt_dist", "-v", *_args(path, "--tp", "2", *layout)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = _json(proc.stdout)
    assert out["tokens"] == [expected] and out["tp"] == 2
    # -v reaches the ranks it started: each logs at INFO, its lines naming it
    for rank in (0, 1):
        assert f"INFO rank {rank} torch_tensorrt_dist" in proc.stderr, proc.stderr[-3000:]
    # rank 0's threads: its share of the cores (two ranks here), or what OMP_NUM_THREADS says
    from torch_tensorrt_dist.runtime.threads import cores_given, threads_for

    assert out["threads"] == threads_for(cores_given(), 2, None, env.get("OMP_NUM_THREADS"))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--prompt", "x" * 200], "the prompt has 200 tokens, but the model's max sequence"),
        (["--max-new-tokens", "500"], "exceeds the KV cache length 128; use max_new_tokens <= 120"),
        (["--tp", "3"], "n_heads=4 is not divisible by tp=3; use tp in [1, 2, 4]"),
        (["--temperature", "-1"], "temperature must be 0 (greedy) or in [0.001, 100]"),
        (["--verify"], "--verify checks a compiled engine; --engine none compiles nothing"),
    ],
)
def test_bad_input_exits_2_with_the_fix(
    ckpt: tuple[Path, list[int]], extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = ckpt
    args = ["generate", "--model", str(path), "--engine", "none", *extra]
    if "--prompt" not in extra:
        args += ["--prompt", PROMPT]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_default_model_never_fails(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["generate", "--engine", "none", "--max-new-tokens", "4", "--json", "--prompt", "The"]
    assert main([*args, *ONE_THREAD]) == 0
    out = _json(capsys.readouterr().out)
    assert 1 <= len(out["tokens"][0]) <= 4 and isinstance(out["text"][0], str)
