"""Sharding: device meshes and tensor-parallel plans."""

from torch_tensorrt_dist.parallel.llama import apply_tp
from torch_tensorrt_dist.parallel.mesh import make_mesh

__all__ = ["apply_tp", "make_mesh"]
