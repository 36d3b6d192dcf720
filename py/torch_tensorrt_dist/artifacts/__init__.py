"""Compile once, run many: per-rank compiled artifacts with a manifest.

``families.compile.compile_artifacts`` (every rank) writes ``DIR/rank-R/`` (``build``: a
rank's files) and rank 0 ``DIR/manifest.json``; ``load_generator`` (every rank) checks them
and returns a generator that needs no checkpoint and no compiler. ``manifest`` is the pure
format (build, write, read, validate); ``graphs`` the step graphs and the calls each takes.
"""

from torch_tensorrt_dist.artifacts.build import CompileResult
from torch_tensorrt_dist.artifacts.load import ArtifactRunner, load_generator, open_artifacts
from torch_tensorrt_dist.artifacts.manifest import Manifest, read_manifest, write_manifest

__all__ = [
    "ArtifactRunner",
    "CompileResult",
    "Manifest",
    "load_generator",
    "open_artifacts",
    "read_manifest",
    "write_manifest",
]
