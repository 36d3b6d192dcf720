"""Hashes and versions recorded in a manifest: checkpoint, collective schedule, software.

The checkpoint hash covers ``config.json`` and, for every ``*.safetensors`` file, its name,
size and JSON header (tensor names, dtypes, shapes, offsets), not the tensor bytes: reading
16 GB to start a server would defeat the point. A checkpoint whose weights were rewritten in
place with the same layout is therefore not detected; the per-rank weight shard in the
artifacts carries its own sha256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import struct
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from torch_tensorrt_dist._version import __version__
from torch_tensorrt_dist.artifacts.manifest import FORMAT_VERSION
from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.ops.collectives import COLLECTIVE_OPS

__all__ = ["args_hash", "checkpoint_hash", "collective_schedule", "running_versions"]


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _nccl_version() -> str | None:
    cuda_nccl = getattr(torch.cuda, "nccl", None)
    if torch.version.cuda is None or cuda_nccl is None:
        return None
    try:
        v = cuda_nccl.version()
    except (RuntimeError, AttributeError):  # a build without NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def running_versions() -> dict[str, str | None]:
    """torch, torch-tensorrt, TensorRT and NCCL of this process (None where absent)."""
    trt = None
    for dist_name in ("tensorrt", "tensorrt-cu13", "tensorrt-cu12"):
        trt = trt or _dist_version(dist_name)
    return {
        "torch": torch.__version__,
        "torch_tensorrt": _dist_version("torch-tensorrt") or _dist_version("torch_tensorrt"),
        "tensorrt": trt,
        "nccl": _nccl_version(),
        "torch_tensorrt_dist": __version__,
        "format": str(FORMAT_VERSION),
    }


def _safetensors_header(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        header = f.read(n)
        if len(header) != n:
            raise CheckpointError(f"{path} is truncated inside its header")
    return header


def checkpoint_hash(path: Path) -> str:
    """sha256 over config.json and each safetensors file's name, size and header."""
    root = Path(path)
    h = hashlib.sha256()
    h.update((root / "config.json").read_bytes())
    for file in sorted(root.glob("*.safetensors")):
        h.update(file.name.encode())
        h.update(str(file.stat().st_size).encode())
        h.update(_safetensors_header(file))
    return h.hexdigest()


def args_hash(args: Any, seed: int) -> str:
    """The hash of a preset model (random weights from ``seed``)."""
    blob = json.dumps({"args": asdict(args), "seed": seed}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


_COLLECTIVES = frozenset(COLLECTIVE_OPS.values())


def collective_schedule(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's collectives in order, as ``op(group, dtype, shape)`` strings."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not hasattr(node.target, "namespace"):
            continue
        if node.target.namespace not in ("_c10d_functional", "tensorrt_dist"):
            continue
        if node.target.namespace == "tensorrt_dist" and node.target not in _COLLECTIVES:
            continue  # our other ops (MoE experts, weight-only matmuls) are not collectives
        name = node.target._opname
        if name == "wait_tensor":
            continue
        groups = [a for a in node.args if isinstance(a, str)]
        val = node.meta.get("val")
        desc = f"{val.dtype}{list(val.shape)}" if isinstance(val, torch.Tensor) else ""
        out.append(f"{name}({','.join(groups)}){desc}")
    return out
