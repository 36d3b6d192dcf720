"""Sharding: device meshes and tensor-parallel plans."""

from torch_tensorrt_dist.parallel.mesh import make_mesh

__all__ = ["make_mesh"]
