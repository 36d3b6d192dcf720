"""``torchtrt-dist explain`` end to end: one run as a user runs it (``python -m``), the others
through ``main`` in this process (the same code after the interpreter starts)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torch_tensorrt_dist.cli import main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m torch_tensorrt_dist ARGS``, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "torch_tensorrt_dist", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )


def _explain(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``main(["explain", *ARGS])`` in this process (no interpreter start): its stdout."""
    capsys.readouterr()
    code = main(["explain", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_rank_5_of_8_with_tp_4_uses_ranks_4_to_7() -> None:
    proc = _run("explain", "--model", "mlp", "--world-size", "8", "--tp", "4", "--rank", "5")
    assert proc.returncode == 0, proc.stderr
    assert "rank 5 of 8" in proc.stdout
    assert "graphs: 1   graph breaks: 0   collectives: 1" in proc.stdout
    assert "all_reduce  [4, 5, 6, 7]" in proc.stdout


def test_json_report_on_a_2d_mesh() -> None:
    """In a process of its own: a fake world of 8 at tp 2 traced in the same process as
    tests/test_fake_pg_capture.py's (8, 2, 6) layouts fails the later trace whichever comes
    first ("Could not resolve the process group registered under the name 4"; torch keeps
    something of the destroyed world that clearing DTensor's plan caches and Dynamo did not
    drop; not found yet)."""
    done = _run(
        "explain",
        "--model",
        "mlp-sp",
        "--world-size",
        "8",
        "--tp",
        "2",
        "--rank",
        "3",
        "--dtype",
        "bfloat16",
        "--json",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["graph_count"] == 1 and report["graph_breaks"] == []
    assert [c["op"] for c in report["collectives"]] == ["all_gather", "reduce_scatter"]
    assert all(c["group_ranks"] == [2, 3] for c in report["collectives"])
    assert all(c["dtype"] == "bfloat16" for c in report["collectives"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--world-size", "6", "--tp", "4"], "tp=4 must be >= 1 and divide the world size 6"),
        (["--world-size", "8", "--tp", "4", "--dp", "3"], "does not match the world size 8"),
        (["--world-size", "4", "--rank", "4"], "rank 4 is not a rank of a world of size 4"),
        (["--world-size", "2", "--dim", "63"], "--dim 63 must be divisible by --tp 2"),
    ],
)
def test_bad_layouts_are_clear_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", *args]) == 2  # in this process: the checks come before any work
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_llama_decode_step_has_two_all_reduces_per_layer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _explain(
        capsys,
        "--model",
        "llama",
        "--layers",
        "3",
        "--world-size",
        "8",
        "--tp",
        "4",
        "--rank",
        "6",
        "--json",
    )
    report = json.loads(out)
    assert report["graph_count"] == 1 and report["graph_breaks"] == []
    ops = [(c["op"], c["module"].split(".")[0]) for c in report["collectives"]]
    # the vocab-parallel embedding, 2 per layer, the vocab-parallel head
    embedding, head = ("all_reduce", "tok_embeddings"), ("all_gather", "")
    assert ops == [embedding, *[("all_reduce", "layers")] * 6, head]
    assert all(c["group_ranks"] == [4, 5, 6, 7] for c in report["collectives"])
    # the KV caches (k and v of 3 layers) are written in place: no cache copied back whole
    [writes] = report["input_writes"]
    assert writes["in_place"] == 6 and writes["copied_back"] == 0
    assert writes["copied_back_bytes"] == 0 and writes["in_place_bytes"] > 0
    # which TensorRT implementation this machine would use, and why: none here
    assert report["tensorrt_impl"]["impl"] is None
    assert "TensorRT is not installed" in report["tensorrt_impl"]["reason"]


def test_llama_prefill_graph_writes_its_row_in_place(capsys: pytest.CaptureFixture[str]) -> None:
    """``--graph prefill``: the serving prefill of one bucket into one row."""
    args = [
        "explain",
        "--model",
        "llama",
        "--graph",
        "prefill",
        "--seq",
        "16",
        "--layers",
        "1",
        "--dim",
        "32",
        "--json",
    ]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    [writes] = report["input_writes"]
    # k and v of the layer: [16 positions, 8 heads / tp 2, head_dim 4] fp32 each, in place
    assert (writes["in_place"], writes["copied_back"]) == (2, 0)
    assert writes["in_place_bytes"] == 2 * 16 * 4 * 4 * 4
    assert report["collectives"][0]["shape"] == [1, 16, 32]  # the embedding's all_reduce


def test_llama_replicated_embedding_and_head_have_only_the_layers_all_reduces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _explain(
        capsys,
        "--model",
        "llama",
        "--layers",
        "2",
        "--tp",
        "2",
        "--embedding",
        "replicated",
        "--lm-head",
        "replicated",
        "--json",
    )
    report = json.loads(out)
    assert [c["module"] for c in report["collectives"]] == [
        "layers.0.attention",
        "layers.0.feed_forward",
        "layers.1.attention",
        "layers.1.feed_forward",
    ]


def test_pipeline_explain_shows_stage_collectives_and_transfers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _explain(
        capsys,
        "--model",
        "llama",
        "--layers",
        "4",
        "--world-size",
        "8",
        "--pp",
        "2",
        "--tp",
        "4",
        "--rank",
        "2",
    )
    assert "pipeline stage 0 of 2 (rank 2, tp rank 2 of group [0, 1, 2, 3])" in out
    # 2 layers x 2 + the vocab-parallel embedding, on the stage's TP group
    assert out.count("all_reduce  [0, 1, 2, 3]") == 5
    assert out.count("tok_embeddings") == 1
    assert "send     6  hidden" in out  # to TP rank 2 of stage 1
    assert "recv     6  logits" in out  # the last stage's logits, broadcast back


def test_llama_with_torch_nccl_selected_names_it_for_every_collective(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _explain(
        capsys,
        "--model",
        "llama",
        "--world-size",
        "8",
        "--tp",
        "4",
        "--rank",
        "5",
        "--layers",
        "1",
        "--collective-impl",
        "torch_nccl",
    )
    rows = [line for line in out.splitlines() if "[4, 5, 6, 7]" in line]
    assert len(rows) == 4  # embedding, attention, feed-forward, head gather
    assert all("torch_nccl" in row for row in rows)
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("TensorRT collectives (collective_impl=torch_nccl): torch_nccl")
    assert "layers for 4 of 4 collectives" in summary


def test_impl_summary_counts_what_the_implementation_takes() -> None:
    from types import SimpleNamespace

    from torch_tensorrt_dist.cli.explain import impl_summary
    from torch_tensorrt_dist.conversion.interface import ImplChoice

    a = SimpleNamespace(tensorrt={"native": None, "torch_nccl": None})
    b = SimpleNamespace(tensorrt={"native": "two groups", "torch_nccl": None})
    usable = impl_summary([a, b], "auto", ImplChoice("torch_nccl", "auto"))
    assert usable.endswith("torch_nccl layers for 2 of 2 collectives (usable here)")
    native = impl_summary([a, b], "native", ImplChoice(None, "no TensorRT"))
    assert "native layers for 1 of 2 collectives (not usable here: no TensorRT)" in native
    none = impl_summary([a], "auto", ImplChoice(None, "nothing installed"))
    assert none.endswith("none usable: nothing installed")
