"""The artifact manifest (pure): round trip, atomic write, and every refusal with its message."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from torch_tensorrt_dist.artifacts.fingerprint import checkpoint_hash, running_versions
from torch_tensorrt_dist.artifacts.manifest import (
    FORMAT_VERSION,
    FileEntry,
    GroupEntry,
    Manifest,
    RankEntry,
    atomic_write_bytes,
    check_device,
    check_layout,
    check_versions,
    manifest_digest,
    pick_bucket,
    read_manifest,
    sha256_file,
    verify_files,
    write_manifest,
)
from torch_tensorrt_dist.errors import ArtifactError


def _manifest(root: Path, *, world: int = 2, schedules: list[str] | None = None) -> Manifest:
    ranks = []
    for r in range(world):
        f = root / f"rank-{r}" / "decode.pt2"
        atomic_write_bytes(f, f"graph of rank {r}".encode())
        entry = FileEntry(str(f.relative_to(root)), sha256_file(f), f.stat().st_size)
        sched = schedules if schedules is not None and r == world - 1 else ["all_reduce(sum,0)"]
        ranks.append(RankEntry(r, {"decode": entry}, {"decode": sched}, {"k": [1, 2]}))
    return Manifest(
        engine="inductor",
        world_size=world,
        tp=world,
        pp=1,
        groups=[GroupEntry("0", list(range(world)), "tp")],
        ranks=ranks,
        dtype="fp32",
        buckets=[16, 32],
        max_batch_size=2,
        cache_len=64,
        model_args={"dim": 8},
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
    data["format_version"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(
        ArtifactError,
        match=rf"manifest.json: artifact format version 99.*reads version {FORMAT_VERSION}",
    ):
        read_manifest(tmp_path)
    data["format"] = "something else"
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="not a torch_tensorrt_dist artifact manifest"):
        read_manifest(tmp_path)


def test_missing_field(tmp_path: Path) -> None:
    data = json.loads(_manifest(tmp_path).to_json())
    del data["buckets"]
    data["digest"] = manifest_digest(data)  # written so, not changed afterwards
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match=r"lacks or mistypes a field.*buckets"):
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
    (tmp_path / files["decode"].path).write_bytes(b"graph of rank X")  # same size, other bytes
    digest = sha256_file(tmp_path / files["decode"].path)
    with pytest.raises(
        ArtifactError,
        match=rf"rank-0/decode.pt2 \(decode\) is corrupt: sha256 {digest[:16]}\.\.\., the "
        rf"manifest records {files['decode'].sha256[:16]}\.\.\.; copy it again or recompile",
    ):
        verify_files(tmp_path, files)
    (tmp_path / files["decode"].path).write_bytes(b"graph")
    with pytest.raises(ArtifactError, match=r"is corrupt: 5 bytes, the manifest records 15"):
        verify_files(tmp_path, files)
    (tmp_path / files["decode"].path).unlink()
    with pytest.raises(ArtifactError, match=r"rank-0/decode.pt2 \(decode\) is missing"):
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


def test_request_beyond_compiled_shapes(tmp_path: Path) -> None:
    m = _manifest(tmp_path)  # buckets 16, 32; cache 64; batch 2
    assert pick_bucket(m, [3, 9], 10) == 16
    assert pick_bucket(m, [17], 10) == 32
    assert pick_bucket(m, [3], 40) == 16
    with pytest.raises(ArtifactError, match=r"3 prompts.*compiled for batch 2.*--max-batch 3"):
        pick_bucket(m, [3, 3, 3], 4)
    with pytest.raises(ArtifactError, match=r"exceeds the compiled sequence length 64"):
        pick_bucket(m, [30], 40)
    assert pick_bucket(m, [17], 40) == 32  # the prompt's padding is overwritten by decode
    with pytest.raises(ArtifactError, match=r"no compiled prefill bucket.*buckets \[16, 32\]"):
        pick_bucket(m, [33], 10)  # fits the cache, but no bucket holds 33 tokens


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
