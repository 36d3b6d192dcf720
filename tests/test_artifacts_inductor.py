"""Compile once, run many (AOTInductor, 2 gloo ranks): the same greedy tokens as the checkpoint,
and every refusal of a defective directory or an out-of-shape request, with its message.

One spawn compiles the artifacts (a tiny tied-embedding checkpoint: one step package per rank,
a pool of 20 blocks of 4 tokens); a second spawn, in fresh processes, loads them and checks
everything that needs live ranks: the first calls compile nothing, every shape class runs, the
core's schedule (joins, a cancel, a prefix hit, preemptions) gives the checkpoint's tokens, and
a byte flipped in each kind of file is refused on each rank. The CLI tests reuse the directory
and its defective copies (a rank-1 refusal under torchrun and mpirun reaches the user; the
manifest and tokenizer are refused before any rank).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.artifacts import read_manifest
from torch_tensorrt_dist.artifacts.graphs import GraphEntry
from torch_tensorrt_dist.artifacts.manifest import manifest_digest, sha256_file
from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.errors import ArtifactError
from torch_tensorrt_dist.runtime.huge_pages import huge_pages_available
from torch_tensorrt_dist.testing import run_on_ranks

from . import _artifact_fns, _llama_ckpt

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]
MAX_NEW = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("artifacts")
    hf = _llama_ckpt.save_checkpoint("qwen2_tied", root / "ckpt")
    out = root / "out"
    ckpt = str(root / "ckpt")
    compile_s = run_on_ranks(_artifact_fns.compile_rank, 2, ckpt, str(out), timeout=420)
    # fresh interpreters: the suite's forkserver preloads Dynamo and Inductor, which a rank
    # that loads artifacts must not import (test_loading_compiles_nothing)
    res = run_on_ranks(
        _artifact_fns.load_and_generate,
        2,
        ckpt,
        str(out),
        PROMPTS,
        MAX_NEW,
        timeout=300,
        fresh=True,
    )
    return {
        "out": out,
        "ranks": res,
        "compile_s": compile_s,
        "hf": [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS],
    }


def test_same_tokens_as_checkpoint_and_transformers(built: dict[str, Any]) -> None:
    for r in built["ranks"]:
        assert r["artifacts"] == r["checkpoint"] == built["hf"]
        assert r["single"] == built["hf"][:1]  # one row through the 2-row graph
        assert r["queued"] == r["queued_checkpoint"] and r["queued"][:2] == built["hf"]
        # one package ran every shape class: decode or prefill, one row or several
        assert r["classes"] == [(False, False), (False, True), (True, False), (True, True)]


def test_the_weights_are_moved_into_huge_pages_and_the_pools_are_not(
    built: dict[str, Any],
) -> None:
    for r in built["ranks"]:
        s = r["storages"]
        assert s["n_pools"] > 0 and s["pools"] == s["n_pools"]
        assert s["weights"] > 1  # a storage of its own per weight storage (runtime/huge_pages.py)
        assert s["weights_packed"] == huge_pages_available(), s


def test_the_core_schedule_matches_the_checkpoint(built: dict[str, Any]) -> None:
    """Joins, leaves, a cancel, a prefix-cache hit and preemptions (a pool of 20 blocks for two
    15-block requests): the tokens of the checkpoint's generator with the same options."""
    for r in built["ranks"]:
        art, ckpt = r["served"], r["served_checkpoint"]
        assert art["tokens"] == ckpt["tokens"] and art["tokens"][0] == built["hf"][0]
        assert art["tokens"][3] == built["hf"][0][:5]
        assert art["cached"] == ckpt["cached"] and art["cached"].get(3, 0) > 0
        assert art["preemptions"] == ckpt["preemptions"] > 0


def test_loading_compiles_nothing(built: dict[str, Any]) -> None:
    for r in built["ranks"]:
        assert r["imported"] == []  # neither Inductor's compiler nor Dynamo was imported
        assert r["load_s"] < 30 and r["first_s"] < 30  # generous: a loaded 2-core machine


def test_loading_leaves_nothing_in_the_temporary_directory(
    built: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from torch_tensorrt_dist.artifacts.inductor import Package

    package = tmp_path / "step.pt2"
    shutil.copy(built["out"] / "rank-0" / "step.pt2", package)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the loader would extract it
    first = Package(package, torch.device("cpu"))
    again = Package(package, torch.device("cpu"))
    assert first.source == again.source == tmp_path / f"step.{sha256_file(package)[:16]}.d"
    assert {p.name for p in tmp_path.iterdir()} == {"step.pt2", first.source.name, "tmp"}
    assert list(scratch.iterdir()) == [] and first.constant_names() == again.constant_names()
    # the check can fail: given the file itself, the loader extracts it there (and removes it
    # only when destroyed, which a rank ending through os._exit never is)
    raw = torch._C._aoti.AOTIModelPackageLoader(str(package), "model", False, 1, -1)
    assert len(list(scratch.iterdir())) == 1
    del raw


def test_a_verified_hash_is_not_computed_again_to_name_the_folder(
    built: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from torch_tensorrt_dist.artifacts import inductor

    package = tmp_path / "step.pt2"
    shutil.copy(built["out"] / "rank-0" / "step.pt2", package)
    recorded = read_manifest(built["out"]).rank_entry(0).files["step"].sha256
    assert recorded == sha256_file(package)

    def no_second_read(path: Path, chunk: int = 0) -> str:
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(inductor, "sha256_file", no_second_read)
    loaded = inductor.Package(package, torch.device("cpu"), recorded)
    assert loaded.source == tmp_path / f"step.{recorded[:16]}.d"
    with pytest.raises(AssertionError, match="hashed again"):  # without it, the file is read
        inductor.Package(package, torch.device("cpu"))


def test_manifest_records_layout_groups_and_files(built: dict[str, Any]) -> None:
    out: Path = built["out"]
    m = read_manifest(out)
    assert (m.world_size, m.tp, m.pp, m.engine, m.device) == (2, 2, 1, "inductor", "cpu")
    assert [(g.name, g.ranks) for g in m.groups] == [("0", [0, 1])]
    assert (m.cache_len, m.max_batch_size, m.block_size, m.max_prefill_tokens) == (64, 2, 4, 8)
    assert m.num_blocks == _artifact_fns.KV_BLOCKS + 1  # and the null block
    # one graph: rows 1..2, tokens 1..8 (the prefill budget), tables of 2..16 blocks (64 / 4)
    assert m.graphs == [GraphEntry("step", [1, 2], [1, 8], [2, 16])]
    for entry in m.ranks:
        assert set(entry.files) == {"step", "weights", "entry"}
        assert entry.files["entry"].path == f"rank-{entry.rank}/rank.json"
        # 2 all-reduces per layer + the embedding's + the vocab-parallel head's
        assert len(entry.schedules["step"]) == 2 * 2 + 2
        assert all(s.startswith("all_reduce(sum,0)") for s in entry.schedules["step"])
        # each layer's pools: 21 blocks of 4 tokens of this rank's 1 KV head of 16
        assert entry.state["model.layers.1.attention.kv_pages.v_pool"] == [21, 4, 1, 16]
        assert len(entry.state) == 2 * 2
        for f in entry.files.values():
            mode = stat.S_IMODE(os.stat(out / f.path).st_mode)
            assert mode == 0o644, (f.path, oct(mode))
    assert m.versions["torch"] and m.checkpoint["sha256"]
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.pt2"))


def test_refusals_by_name(built: dict[str, Any]) -> None:
    errors = built["ranks"][0]["errors"]
    # one byte flipped in one rank's file (packages, weights, rank.json): that rank names the
    # file and its hash; the other rank stops too, before any graph runs, quoting it
    for name, rel in _artifact_fns.FLIPPED.items():
        owner = int(rel.split("/")[0].removeprefix("rank-"))
        own = built["ranks"][owner]["errors"][name]
        other = built["ranks"][1 - owner]["errors"][name]
        assert own.startswith(f"ArtifactError: {rel} ("), own
        assert " is corrupt: sha256 " in own and "..., the manifest records " in own
        assert other == f"RankFailedError: rank {owner} failed the artifact check: {own}"
    assert "rank-0/weights.safetensors (weights) is missing" in errors["missing"]
    assert "rank 0 failed the artifact check" in built["ranks"][1]["errors"]["missing"]
    for ranks_errors in (errors, built["ranks"][1]["errors"]):  # every rank finds these itself
        assert "compiled with torch 2.0.0" in ranks_errors["version"]
        assert "process group '0' (tp) of the artifacts" in ranks_errors["groups"]
        assert "ranks [1, 0]" in ranks_errors["groups"]
        assert ranks_errors["format"].endswith(
            "manifest.json: artifact format version 3, but this torch_tensorrt_dist reads "
            "version 4; recompile with `torchtrt-dist compile`"
        )
        assert "manifest.json does not match its digest" in ranks_errors["manifest"]
    assert "this run has world size 2 (pp 2 x tp 1)" in errors["layout"]
    assert errors["length"] == (
        "ArtifactError: prompt (10 tokens) + max_new_tokens (60) = 70 exceeds the compiled "
        "sequence length 64; use max_new_tokens <= 54, or recompile with a larger --max-seq-len"
    )


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
    # refused before any rank starts, describing the run as it would be
    assert main([*args, "--tp", "1"]) == 2
    assert (
        "compiled for world size 2 (pp 1 x tp 2), but this run has world size 1 (pp 1 x tp 1)"
        in (capfd.readouterr().err)
    )
    assert main([*args, "--max-new-tokens", "60"]) == 2
    assert "exceeds the compiled sequence length 64" in capfd.readouterr().err


def test_serve_from_artifacts(built: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """``serve --artifacts``: no compile; concurrent requests get the checkpoint's tokens; the
    compiled shapes bound what it accepts."""
    pytest.importorskip("fastapi")
    import concurrent.futures as cf

    import httpx

    from ._serve import start_server

    out = str(built["out"])
    assert main(["serve", "--artifacts", out, "--max-batch-size", "3"]) == 2
    assert capsys.readouterr().err == (
        "error: --max-batch-size 3: the artifacts were compiled for 2 rows; leave it unset or "
        "recompile with `torchtrt-dist compile --max-batch-size 3`\n"
    )
    assert main(["serve", "--artifacts", out, "--max-seq-len", "128"]) == 2
    assert "compiled for sequences of 64 tokens; leave it unset" in capsys.readouterr().err
    srv = start_server(["--artifacts", out])
    try:
        assert "engine artifacts:inductor, 2 rows x 64 tokens" in srv.output()

        def ask(prompt: list[int]) -> Any:
            body = {"prompt": prompt, "max_tokens": MAX_NEW, "temperature": 0}
            return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120)

        with cf.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(ask, PROMPTS))
        for res, ref in zip(results, built["hf"]):
            assert res.json()["usage"]["completion_tokens"] == len(ref)
            assert res.json()["choices"][0]["text"] == bytes(ref).decode(errors="replace")
        too_long = ask(list(range(1, 60)))  # 59 tokens + 8: beyond the compiled 64
        assert too_long.status_code == 400
        assert "exceeds the longest request served, 64 tokens" in too_long.text
        assert srv.stop() == 0
    finally:
        srv.kill()


TEXT = "\x03\x05\x07\x09\x0b"  # byte tokens 3 5 7 9 11 (no tokenizer.json)


def test_cli_rank_1_refusal_stops_every_rank_before_any_text(
    built: dict[str, Any], capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    bad = built["out"].parent / "weights"  # rank-1/weights.safetensors: one byte flipped
    args = ["generate", "--artifacts", str(bad), "--prompt", TEXT, "--max-new-tokens", "2"]
    with caplog.at_level(logging.INFO, logger="torch_tensorrt_dist.runtime.launcher"):
        assert main(args) == 2
    captured = capfd.readouterr()
    assert captured.out == ""  # not even the prompt: no rank went past the verdict
    error, named = captured.err.strip().splitlines()[-2:]
    assert error.startswith(
        "error: rank 1: ArtifactError: rank-1/weights.safetensors (weights) is corrupt: sha256 "
    )
    assert error.endswith("...; copy it again or recompile")  # a refusal: no traceback hint
    assert named.startswith("torchtrt-dist run (torchrun): rank 1 of 2 (on ")
    assert named.endswith("exited with code 2; the other ranks were stopped.")
    assert "Traceback" not in captured.err
    # rank 0 passed its own checks and refused with rank 1's message (logged at -v)
    assert "rank 0 also failed (repeating rank 1): RankFailedError: rank 1 failed the " in (
        caplog.text
    )


def test_cli_rank_0_refusal_stops_every_rank_before_any_text(
    built: dict[str, Any], capfd: pytest.CaptureFixture[str]
) -> None:
    bad = built["out"].parent / "entry"  # rank-0/rank.json: one byte flipped
    args = ["generate", "--artifacts", str(bad), "--prompt", TEXT, "--max-new-tokens", "2"]
    assert main(args) == 2
    captured = capfd.readouterr()
    assert captured.out == ""
    error, named = captured.err.strip().splitlines()[-2:]
    assert error.startswith("error: rank 0: ArtifactError: rank-0/rank.json (") and (
        "is corrupt: sha256 " in error
    ), error
    assert named.startswith("torchtrt-dist run (torchrun): rank 0 of 2 (on ")
    assert "Traceback" not in captured.err


@pytest.mark.mpi
def test_cli_rank_1_refusal_under_mpirun(built: dict[str, Any]) -> None:
    bad = built["out"].parent / "corrupt"  # rank-1/step.pt2: one byte flipped
    launcher_vars = ("OMPI_", "PMIX_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher_vars)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT / "py"), env.get("PYTHONPATH"))))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_tensorrt_dist",
            "run",
            "--launcher",
            "mpi",
            "--nproc-per-node",
            "2",
            "-m",
            "torch_tensorrt_dist",
            "generate",
            "--artifacts",
            str(bad),
            "--prompt",
            TEXT,
            "--max-new-tokens",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stdout == ""
    error, named = out.stderr.strip().splitlines()[-2:]
    assert error.startswith("rank 1: ArtifactError: rank-1/step.pt2 (step) is corrupt: sha256")
    assert named.startswith("torchtrt-dist run (mpi): rank 1 of 2")
    assert "mpirun detected" not in out.stderr  # Open MPI's banner: only under -v


def test_cli_manifest_and_tokenizer_refused_before_any_rank(
    built: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", "--prompt", TEXT, "--max-new-tokens", "2", "--artifacts"]
    assert main([*args, str(built["out"].parent / "manifest")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "manifest.json does not match its digest (sha256 " in err
    # a byte flip that breaks the JSON
    flipped = tmp_path / "flipped"
    shutil.copytree(built["out"], flipped)
    _artifact_fns.flip_byte(flipped / "manifest.json")
    assert main([*args, str(flipped)]) == 2
    assert f"{flipped}/manifest.json is not valid JSON" in capsys.readouterr().err
    # a tokenizer file listed in the manifest, then damaged: named before it is parsed
    tok = tmp_path / "tok"
    shutil.copytree(built["out"], tok)
    (tok / "tokenizer").mkdir()
    (tok / "tokenizer" / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    data = json.loads((tok / "manifest.json").read_text())
    file = tok / "tokenizer" / "tokenizer.json"
    entry = {
        "path": "tokenizer/tokenizer.json",
        "bytes": file.stat().st_size,
        "sha256": sha256_file(file),
    }
    data["tokenizer"] = {"tokenizer.json": entry}
    data["digest"] = manifest_digest(data)
    (tok / "manifest.json").write_text(json.dumps(data))
    _artifact_fns.flip_byte(tok / "tokenizer" / "tokenizer.json")
    assert main([*args, str(tok)]) == 2
    assert capsys.readouterr().err.startswith(
        "error: tokenizer/tokenizer.json (tokenizer.json) is corrupt: sha256 "
    )


def test_one_rank_under_a_launcher_is_described_as_it_is(
    built: dict[str, Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert main(["generate", "--artifacts", str(built["out"]), "--prompt", TEXT]) == 2
    assert "but this run has world size 1 (pp 1 x tp 1); start 2 ranks" in (capsys.readouterr().err)


def test_cli_compile_refuses_pipeline_and_tensorrt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compile", "--model", "tiny", "--pp", "2", "--out", str(tmp_path)]) == 2
    assert "--pp 2: pipeline artifacts are not supported yet" in capsys.readouterr().err
    assert main(["compile", "--model", "tiny", "--engine", "tensorrt", "--out", str(tmp_path)]) == 2
    assert "TensorRT artifacts are not built yet" in capsys.readouterr().err
    assert main(["compile", "--model", "tiny", "--buckets", "16,64", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: --buckets: artifacts no longer hold a prefill graph per bucket; one step graph "
        "takes any prompt chunk up to --max-prefill-tokens tokens: drop --buckets\n"
    )
    # tiny: 8 KiB a block of 16 tokens; a 256-token sequence needs 16 of them
    args = ["compile", "--model", "tiny", "--kv-cache-memory", "64KiB"]
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --kv-cache-memory 65536 (64.0 KiB) holds 8 blocks of 16 tokens")
    assert "(256 tokens) needs 16: give at least 131072 (128.0 KiB)" in err
    assert main(["compile", "--model", "nope", "--tp", "2", "--out", str(tmp_path)]) == 2
    assert "'nope' is neither a checkpoint directory nor a preset" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()
    # --out, checked before any rank starts
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["compile", "--model", "tiny", "--tp", "2", "--out", str(tmp_path)]) == 2
    assert "is not empty and is not an artifact directory (it holds notes.txt)" in (
        capsys.readouterr().err
    )
    out = str(tmp_path / "notes.txt")
    assert main(["compile", "--model", "tiny", "--tp", "2", "--out", out]) == 2
    assert capsys.readouterr().err == (
        f"error: the output path {out} is a file, not a directory; choose a new or empty "
        "directory\n"
    )
