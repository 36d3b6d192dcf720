"""FX lowering passes (one per file, signature ``(gm, settings) -> gm``)."""

from torch_tensorrt_dist.lowering.fuse_collectives import (
    FusionReport,
    fuse_collectives,
    fusion_report,
)

__all__ = ["FusionReport", "fuse_collectives", "fusion_report"]
