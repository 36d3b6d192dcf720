"""The artifact manifest (pure): round trip, atomic write, and every refusal with its message;
the graph table (which compiled graph takes a call) and the run options checked against the
compiled ones."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from torch_tensorrt_dist.artifacts.checks import (
    check_device,
    check_layout,
    check_length,
    check_versions,
)
from torch_tensorrt_dist.artifacts.fingerprint import checkpoint_hash, running_versions
from torch_tensorrt_dist.artifacts.graphs import GraphEntry, limits_of, pick_graph, step_graphs
from torch_tensorrt_dist.artifacts.load import check_options
from torch_tensorrt_dist.artifacts.manifest import (
    FORMAT_VERSION,
    FileEntry,
    GroupEntry,
    Manifest,
    RankEntry,
    atomic_write_bytes,
    manifest_digest,
    read_manifest,
    sha256_file,
    verify_files,
    write_manifest,
)
from torch_tensorrt_dist.errors import ArtifactError, ConfigError
from torch_tensorrt_dist.generation.step_inputs import StepLimits
from torch_tensorrt_dist.models.llama import ModelArgs

TINY = ModelArgs.from_name("tiny")


def _manifest(root: Path, *, world: int = 2, schedules: list[str] | None = None) -> Manifest:
    ranks = []
    for r in range(world):
        f = root / f"rank-{r}" / "step.pt2"
        atomic_write_bytes(f, f"graph of rank {r}".encode())
        entry = FileEntry(str(f.relative_to(root)), sha256_file(f), f.stat().st_size)
        sched = schedules if schedules is not None and r == world - 1 else ["all_reduce(sum,0)"]
        ranks.append(RankEntry(r, {"step": entry}, {"step": sched}, {"k": [1, 2]}))
    return Manifest(
        engine="inductor",
        world_size=world,
        tp=world,
        pp=1,
        groups=[GroupEntry("0", list(range(world)), "tp")],
        ranks=ranks,
        dtype="fp32",
        max_batch_size=2,
        cache_len=64,
        block_size=16,
        num_blocks=9,
        max_prefill_tokens=32,
        graphs=step_graphs(StepLimits(rows=2, tokens=32, blocks=4, block_size=16)),
        model_args=json.loads(json.dumps(dataclasses.asdict(TINY))),  # as read back
        checkpoint={"source": "preset:tiny", "sha256": "ab"},
        options={"lm_head": "vocab_parallel", "embedding": "vocab_parallel"},
        tokenizer=None,
        versions={"torch": "2.14.1", "nccl": None},
    )


def test_round_trip_and_no_temporaries(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    write_manifest(tmp_path, m)
    assert read_manifest(tmp_path) == m
    assert not [p for p in tmp_path.rglob("*.tmp")]
    verify_files(tmp_path, m.rank_entry(1).files)


def test_failed_atomic_write_leaves_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f.bin"
    atomic_write_bytes(target, b"old")

    def crash(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_missing_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"does not exist.*compile that did not finish"):
        read_manifest(tmp_path)


def test_corrupt_manifest_json(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        read_manifest(tmp_path)


def test_incompatible_format_version(tmp_path: Path) -> None:
    data = json.loads(_manifest(tmp_path).to_json())
    for old in (3, 99):  # 3: the per-bucket prefill graphs over per-row caches
        data["format_version"] = old
        (tmp_path / "manifest.json").write_text(json.dumps(data))
        with pytest.raises(ArtifactError) as err:
            read_manifest(tmp_path)
        assert str(err.value) == (
            f"{tmp_path}/manifest.json: artifact format version {old}, but this "
            f"torch_tensorrt_dist reads version {FORMAT_VERSION}; recompile with "
            "`torchtrt-dist compile`"
        )
    assert FORMAT_VERSION == 4
    data["format"] = "something else"
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="not a torch_tensorrt_dist artifact manifest"):
        read_manifest(tmp_path)


def test_missing_field(tmp_path: Path) -> None:
    data = json.loads(_manifest(tmp_path).to_json())
    del data["num_blocks"]
    data["digest"] = manifest_digest(data)  # written so, not changed afterwards
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"lacks or mistypes a field.*num_blocks"):
        read_manifest(tmp_path)
    del data["graphs"]
    data["digest"] = manifest_digest(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"lacks or mistypes a field.*graphs"):
        read_manifest(tmp_path)


def test_manifest_checked_against_its_own_digest(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    write_manifest(tmp_path, m)
    text = (tmp_path / "manifest.json").read_text()
    data = json.loads(text)
    assert data["digest"] == manifest_digest(data)
    # any change after writing: a value, a file's hash, a schedule, the digest itself
    for old, new in [
        ('"cache_len": 64', '"cache_len": 65'),
        ("sum,0", "sum,1"),
        (data["digest"], "0" * 64),
    ]:
        (tmp_path / "manifest.json").write_text(text.replace(old, new, 1))
        with pytest.raises(
            ArtifactError, match=r"manifest.json does not match its digest \(sha256 "
        ):
            read_manifest(tmp_path)
    del data["digest"]
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"manifest.json has no digest: it was changed after"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(
        text.replace('"', "\udcff", 1), errors="surrogateescape"
    )
    with pytest.raises(ArtifactError, match=r"manifest.json is not valid JSON"):
        read_manifest(tmp_path)


def test_incomplete_rank_list(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    with pytest.raises(ArtifactError, match=r"lists ranks \[0\], expected 0..1"):
        write_manifest(tmp_path, dataclasses.replace(m, ranks=m.ranks[:1]))
    assert not (tmp_path / "manifest.json").exists()


def test_a_rank_without_a_graph_file(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    two = [*m.graphs, GraphEntry("decode", [1, 2], [1, 1], [2, 4])]
    with pytest.raises(ArtifactError, match=r"rank 0 lists no file for the graphs \['decode'\]"):
        dataclasses.replace(m, graphs=two).check_consistent()


def test_different_schedules_in_a_group(tmp_path: Path) -> None:
    m = _manifest(tmp_path, schedules=["all_gather_into_tensor(2,0)"])
    with pytest.raises(ArtifactError, match=r"ranks 0 and 1 of group '0'.*different collective"):
        m.check_consistent()


def test_world_size_and_layout_mismatch(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    check_layout(m, world_size=2, tp=None, pp=None)
    check_layout(m, world_size=2, tp=2, pp=1)
    with pytest.raises(ArtifactError, match=r"world size 2 \(pp 1 x tp 2\).*world size 4"):
        check_layout(m, world_size=4, tp=None, pp=None)
    with pytest.raises(ArtifactError, match=r"this run has world size 2 \(pp 2 x tp 1\)"):
        check_layout(m, world_size=2, tp=1, pp=2)


def test_missing_and_corrupt_rank_files(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    files = m.rank_entry(0).files
    (tmp_path / files["step"].path).write_bytes(b"graph of rank X")  # same size, other bytes
    digest = sha256_file(tmp_path / files["step"].path)
    with pytest.raises(
        ArtifactError,
        match=rf"rank-0/step.pt2 \(step\) is corrupt: sha256 {digest[:16]}\.\.\., the "
        rf"manifest records {files['step'].sha256[:16]}\.\.\.; copy it again or recompile",
    ):
        verify_files(tmp_path, files)
    (tmp_path / files["step"].path).write_bytes(b"graph")
    with pytest.raises(ArtifactError, match=r"is corrupt: 5 bytes, the manifest records 15"):
        verify_files(tmp_path, files)
    (tmp_path / files["step"].path).unlink()
    with pytest.raises(ArtifactError, match=r"rank-0/step.pt2 \(step\) is missing"):
        verify_files(tmp_path, files)
    with pytest.raises(ArtifactError, match="no entry for rank 5"):
        m.rank_entry(5)


def test_version_mismatch(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    check_versions(m, {"torch": "2.14.1", "nccl": "2.27"})  # NCCL does not pin inductor
    with pytest.raises(ArtifactError, match=r"compiled with torch 2.14.1.*has torch 2.15.0"):
        check_versions(m, {"torch": "2.15.0"})
    with pytest.raises(ArtifactError, match="engine 'tensorrt', which this version cannot load"):
        check_versions(dataclasses.replace(m, engine="tensorrt"), running_versions())


def test_request_beyond_the_compiled_length(tmp_path: Path) -> None:
    m = _manifest(tmp_path)  # sequences of 64 tokens; more prompts than rows queue
    check_length(m, 9, 55)
    check_length(m, 63, 1)
    with pytest.raises(ArtifactError) as err:
        check_length(m, 30, 40)
    assert str(err.value) == (
        "prompt (30 tokens) + max_new_tokens (40) = 70 exceeds the compiled sequence length 64; "
        "use max_new_tokens <= 34, or recompile with a larger --max-seq-len"
    )


def test_the_graph_table() -> None:
    """One graph takes every call within the limits (R and S from 1, NB from 2: the core pads
    a table to 2 blocks); a call beyond them names the ranges."""
    graphs = step_graphs(StepLimits(rows=4, tokens=64, blocks=16, block_size=16))
    assert graphs == [GraphEntry("step", [1, 4], [1, 64], [2, 16])]
    assert limits_of(graphs, 16) == StepLimits(rows=4, tokens=64, blocks=16, block_size=16)
    for rows, tokens, blocks in [(1, 1, 2), (4, 1, 16), (1, 64, 3), (3, 17, 16)]:
        assert pick_graph(graphs, rows=rows, tokens=tokens, blocks=blocks).role == "step"
    # a second graph (a decode one, say) is picked where it holds the call, first come first
    decode = GraphEntry("decode", [1, 4], [1, 1], [2, 16])
    assert pick_graph([decode, *graphs], rows=2, tokens=1, blocks=5) is decode
    assert pick_graph([decode, *graphs], rows=2, tokens=2, blocks=5) is graphs[0]
    with pytest.raises(ArtifactError) as err:
        pick_graph(graphs, rows=5, tokens=1, blocks=2)
    assert str(err.value) == (
        "no compiled step graph takes 5 rows x 1 tokens over 2 blocks (step: rows 1..4, "
        "tokens 1..64, blocks 2..16); recompile with a larger --max-batch-size, "
        "--max-prefill-tokens or --max-seq-len"
    )
    # the smallest limits still give a table of 2 blocks and a chunk of 1 token
    assert step_graphs(StepLimits(1, 1, 1, 16)) == [GraphEntry("step", [1, 1], [1, 1], [2, 2])]
    with pytest.raises(ArtifactError, match="lists no step graph"):
        limits_of([], 16)


def test_run_options_against_the_compiled_ones(tmp_path: Path) -> None:
    """serve / generate --artifacts: an option the graphs fix is refused with the fix where it
    differs; None (not given) and equal values pass; a memory that buys the pool passes."""
    m = _manifest(tmp_path)  # tiny, tp 2: 4 KiB a block of 16 tokens; 9 blocks with the null
    same = {"max_batch_size": 2, "max_seq_len": 64, "block_size": 16, "max_prefill_tokens": 32}
    check_options(m, same)
    check_options(m, dict.fromkeys(same))
    check_options(m, {"kv_cache_memory": 8 * 4096})
    check_options(m, {"kv_cache_memory": 9 * 4096 - 1})  # still 8 blocks
    refusals = {
        "max_batch_size": (
            3,
            "--max-batch-size 3: the artifacts were compiled for 2 rows; leave it unset or "
            "recompile with `torchtrt-dist compile --max-batch-size 3`",
        ),
        "max_seq_len": (128, "compiled for sequences of 64 tokens; leave it unset"),
        "block_size": (32, "--block-size 32: the artifacts were compiled for blocks of 16 tokens"),
        "max_prefill_tokens": (512, "compiled for 32 prompt tokens per step"),
        "kv_cache_memory": (
            1 << 20,
            "--kv-cache-memory 1048576 (1.0 MiB) makes a pool of 257 blocks, but the artifacts "
            "were compiled with 9 (32.0 KiB of KV cache per rank; the pool is part of the "
            "graphs); leave it unset, or recompile with `torchtrt-dist compile "
            "--kv-cache-memory 1048576`",
        ),
    }
    for name, (value, message) in refusals.items():
        with pytest.raises(ArtifactError) as err:
            check_options(m, {name: value})
        assert message in str(err.value), str(err.value)
    with pytest.raises(ConfigError, match=r"holds 1 blocks of 16 tokens.*needs 4"):
        check_options(m, {"kv_cache_memory": 4096})


def test_running_versions_and_checkpoint_hash(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    v = running_versions()
    assert v["torch"] == torch.__version__ and v["format"] == str(FORMAT_VERSION)
    (tmp_path / "config.json").write_text('{"a": 1}')
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    h = checkpoint_hash(tmp_path)
    assert h == checkpoint_hash(tmp_path)
    save_file({"w": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    assert checkpoint_hash(tmp_path) != h  # a header change is seen


def test_device_mismatch(tmp_path: Path) -> None:
    m = _manifest(tmp_path)
    check_device(m, "cpu")
    with pytest.raises(ArtifactError, match="compiled for cpu, but this rank runs on cuda"):
        check_device(m, "cuda")
    data = json.loads(m.to_json())
    del data["device"]  # a manifest without the field (an older writer): cpu
    assert Manifest.from_dict(data).device == "cpu"
