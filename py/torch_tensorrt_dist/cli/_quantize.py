"""``--quantize``, ``--group-size`` and ``--quantize-embeddings``, shared by ``generate``,
``compile``, ``eval`` and ``serve``: the options, their validation before any rank starts, and the
per-rank step after loading."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from torch_tensorrt_dist.quantization.scheme import (
    QuantConfig,
    check_engine_group,
    check_group_slices,
    quant_config,
)

__all__ = ["add_quantize_args", "check_quantize", "quantize_rank", "requested"]

logger = logging.getLogger(__name__)


def add_quantize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quantize",
        default=None,
        metavar="{int8,int4}",
        help="weight-only quantization of the decoder's linears, applied on each rank to the "
        "slices it holds: int8 (one scale per output channel) or int4 (groups along the input)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        help="int4: weights per scale along the input dimension, 32, 64 or 128 (default 128; "
        "--engine tensorrt takes 64 or 128); must divide each rank's slice of a row-parallel "
        "weight",
    )
    p.add_argument(
        "--quantize-embeddings",
        action="store_true",
        help="also quantize the embedding and LM head (int8, one scale per vocabulary row); "
        "by default they stay in the model dtype",
    )


def requested(ns: argparse.Namespace) -> QuantConfig | None:
    """The requested config (None: no --quantize); ConfigError for a bad combination."""
    return quant_config(
        getattr(ns, "quantize", None),
        getattr(ns, "group_size", None),
        bool(getattr(ns, "quantize_embeddings", False)),
    )


def check_quantize(
    ns: argparse.Namespace, args: Any, *, tp: int, expert_size: int | None = None
) -> QuantConfig | None:
    """Validate the options against the model, layout and engine (before any rank starts)."""
    config = requested(ns)
    engine = getattr(ns, "engine", None)
    check_engine_group(config, engine)
    check_group_slices(args, tp=tp, config=config, expert_size=expert_size, engine=engine)
    return config


def quantize_rank(model: Any, ns: argparse.Namespace, *, engine: str) -> QuantConfig | None:
    """Quantize this rank's loaded shard in place when ``--quantize`` was given."""
    from torch_tensorrt_dist.quantization import quantize_model

    config = requested(ns)
    if config is not None:
        report = quantize_model(model, config, engine=engine)
        logger.info(
            "%s: %d layers, %.1f -> %.1f MiB on this rank",
            config.describe(),
            report.layers,
            report.bytes_before / 2**20,
            report.bytes_after / 2**20,
        )
        if engine == "tensorrt":
            logger.info(
                "each TensorRT engine (every prefill bucket, the decode step) holds its own copy "
                "of these weights: %.1f MiB more per engine on this rank",
                (report.engine_bytes(1) - report.bytes_after) / 2**20,
            )
    return config
