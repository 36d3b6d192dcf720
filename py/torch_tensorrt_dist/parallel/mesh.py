"""Device meshes for data x tensor (and pipeline x tensor) parallel layouts."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["make_mesh", "mesh_device_type"]


def mesh_device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"


def make_mesh(
    *, tp: int, dp: int | None = None, world_size: int | None = None, outer: str = "dp"
) -> DeviceMesh:
    """A 2-D ``(outer, "tp")`` mesh; TP is the inner (fastest-varying) dimension.

    ``dp`` defaults to ``world_size // tp``. Ranks ``[k*tp, (k+1)*tp)`` form TP group ``k``.
    """
    if not dist.is_initialized():
        raise ConfigError("make_mesh needs torch.distributed initialised (init_distributed())")
    world = dist.get_world_size() if world_size is None else world_size
    if tp < 1 or world % tp:
        raise ConfigError(f"tp={tp} must be >= 1 and divide the world size {world}")
    dp = world // tp if dp is None else dp
    if dp * tp != world:
        raise ConfigError(
            f"mesh {outer}={dp} x tp={tp} = {dp * tp} ranks does not match the world size {world}; "
            f"use {outer}={world // tp}"
        )
    return init_device_mesh(mesh_device_type(), (dp, tp), mesh_dim_names=(outer, "tp"))
