"""Quantized sharded models end to end: the demo model at TP 2 on gloo ranks against one
process, the CLI (generate, eval, compile's checks), and the one-line errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.models.demo_heldout import heldout_path
from torch_tensorrt_dist.testing import run_on_ranks

from . import _quant_fns

TEXT = "\n\n".join(heldout_path().read_text().split("\n\n")[:40])  # 829 tokens


@pytest.fixture(scope="module")
def tp2() -> list[dict[str, Any]]:
    return run_on_ranks(_quant_fns.demo_tp, 2, TEXT, timeout=600)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """In-process runs use one thread, as each launched rank does (two threads on a shared
    2-core machine spin far longer than they compute)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tp1(one_thread: None) -> dict[str, Any]:
    return _quant_fns.demo_tp(0, 1, TEXT)


def test_int8_keeps_the_fp32_greedy_tokens_at_tp2(tp2: list[dict[str, Any]]) -> None:
    for rank in tp2:  # the ranks agree without communicating
        assert rank["int8"]["tokens"] == rank["fp32"]["tokens"] == tp2[0]["fp32"]["tokens"]
        assert len(rank["int4"]["tokens"]) == 16


def test_tp2_quantizes_its_own_slices_like_one_process(
    tp2: list[dict[str, Any]], tp1: dict[str, Any]
) -> None:
    for name in ("fp32", "int8", "int4"):
        assert tp2[0][name]["perplexity"] == pytest.approx(tp1[name]["perplexity"], rel=2e-3)
        assert tp2[0][name]["tokens"] == tp1[name]["tokens"]
    # goals of the issue on this (small) text: int8 within 1 %, int4 within 5 % of fp32
    fp32 = tp1["fp32"]["perplexity"]
    assert tp1["int8"]["perplexity"] <= 1.01 * fp32
    assert tp1["int4"]["perplexity"] <= 1.05 * fp32


def test_each_rank_holds_a_quarter_of_its_fp32_linears(
    tp2: list[dict[str, Any]], tp1: dict[str, Any]
) -> None:
    embedding = 1024 * 256 * 4  # tied, vocabulary-parallel: 1/tp per rank, in fp32
    norms = (2 * 4 + 1) * 256 * 4  # replicated
    linears = tp1["fp32"]["bytes"] - embedding - norms
    for rank in tp2:
        assert rank["fp32"]["bytes"] == linears // 2 + embedding // 2 + norms
        int8 = rank["int8"]["bytes"] - embedding // 2 - norms
        int4 = rank["int4"]["bytes"] - embedding // 2 - norms
        assert 0.25 < int8 / (linears // 2) < 0.26  # codes + one bf16 scale per row
        assert 0.125 < int4 / (linears // 2) < 0.16  # nibbles + bf16 scale/zero per group


def _json(out: str) -> dict[str, Any]:
    [line] = [ln for ln in out.splitlines() if ln.startswith("{")]
    return dict(json.loads(line))


def test_generate_quantize_int8_cli(
    tp1: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """In process: TP 2 through the launcher runs the same rank code, whose numerics the
    ranks above check."""
    args = [
        "generate",
        "--quantize",
        "int8",
        "--max-new-tokens",
        "16",
        "--engine",
        "none",
        "--json",
    ]
    assert main(args) == 0
    out = _json(capsys.readouterr().out)
    assert out["tokens"] == [tp1["fp32"]["tokens"]]
    assert out["quantize"] == {"scheme": "int8", "group_size": None, "embeddings": False}


def test_eval_perplexity_cli(
    tmp_path: Path, tp1: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    args = [
        "eval",
        "--perplexity",
        str(text),
        "--quantize",
        "int4",
        "--group-size",
        "64",
        "--window",
        "64",
        "--stride",
        "32",
        "--json",
    ]
    assert main(args) == 0
    out = _json(capsys.readouterr().out)
    assert out["perplexity"] == pytest.approx(tp1["int4"]["perplexity"], rel=1e-6)
    assert out["tokens"] == len(_quant_fns.document_ids(TEXT, _quant_fns.demo_tokenizer())) - 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["generate", "--quantize", "int3"], "--quantize 'int3' is not a scheme; use int8"),
        (
            ["generate", "--tp", "4", "--quantize", "int4"],
            "int4 group size 128 does not divide attention.wo's input (its input slice of 64 "
            "columns per rank at tp=4; groups would straddle two ranks' slices); use "
            "--group-size 32 or 64, or a smaller --tp",
        ),
        (["eval", "--perplexity", "demo", "--group-size", "64"], "--group-size needs --quantize"),
        (["compile", "--quantize", "int4", "--group-size", "48", "--out", "x"], "int4 groups are"),
        (["eval", "--perplexity", "missing.txt"], "no such file; give a text file, or 'demo'"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_heldout_text_is_help_text_the_demo_never_saw() -> None:
    from torch_tensorrt_dist.models.demo import corpus_sha256, demo_checkpoint_path, demo_corpus
    from torch_tensorrt_dist.models.demo_heldout import heldout_paragraphs

    corpus = demo_corpus()
    shipped = heldout_path().read_text().strip().split("\n\n")
    assert len(shipped) == len(set(shipped)) == 450
    assert not set(shipped) & set(corpus)  # no training paragraph
    info = json.loads((demo_checkpoint_path() / "train_info.json").read_text())
    if corpus_sha256(corpus) == info["corpus_sha256"]:  # this Python's help text is the one
        assert heldout_paragraphs(corpus) == shipped  # the demo was trained on: regenerates
