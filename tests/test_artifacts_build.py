"""A compile that fails midway leaves no manifest (an old one is removed first), and no
temporary files: loading then refuses the directory by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.artifacts import build, compile_artifacts, inductor, load_generator
from torch_tensorrt_dist.errors import ArtifactError


def test_crash_mid_compile_leaves_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "art"
    out.mkdir()
    (out / "manifest.json").write_text("{}")  # a previous, complete set
    calls: list[str] = []

    def crash(ep: Any, path: Path, **kwargs: Any) -> float:
        calls.append(path.name)
        if path.name == "decode.pt2":
            raise RuntimeError("compiler killed")
        path.write_bytes(b"package")
        return 0.0

    monkeypatch.setattr(inductor, "compile_graph", crash)
    with pytest.raises(RuntimeError, match="compiler killed"):
        compile_artifacts("tiny", out, max_seq_len=64, buckets=[16])
    assert calls == ["prefill-16.pt2", "decode.pt2"]
    assert not (out / "manifest.json").exists()
    assert not list(out.rglob("*.tmp"))
    with pytest.raises(ArtifactError, match="a compile that did not finish writes no manifest"):
        load_generator(out)


def test_default_buckets() -> None:
    assert build.default_buckets(256) == [16, 32, 64, 128]
    assert build.default_buckets(64) == [16, 32]
    assert build.default_buckets(20) == [16]


def test_private_aoti_loader_api_is_there() -> None:
    """inductor.Package calls torch's AOTInductor loader directly (no torch._inductor import)."""
    import torch

    loader = torch._C._aoti.AOTIModelPackageLoader
    for name in ("get_constant_fqns", "load_constants", "boxed_run"):
        assert hasattr(loader, name), name
