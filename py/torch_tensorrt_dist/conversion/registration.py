"""Plug into Torch-TensorRT: our lowering passes in its pass list, our converters in its registry.

:func:`register_with_torch_tensorrt` runs when Torch-TensorRT gets imported (the import hook
in ``_autoregister.py``; ``import torch_tensorrt_dist`` itself never imports it) and at our
``engine="tensorrt"`` compile. After it, ``torch.compile(model, backend="torch_tensorrt")`` lowers
c10d collectives to our typed ops (before Torch-TensorRT's own ``fuse_distributed_ops``),
converts them with our converters, and keeps the paged KV cache's block writes in PyTorch, in
place (``layers/paged_kv.py``; the pass runs after Torch-TensorRT's
``remove_input_alias_fixing_clones``, once a pool write reads its graph input directly). Where
Torch-TensorRT is not installed it does nothing.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from typing import Any

from torch import fx

from torch_tensorrt_dist.errors import EngineUnavailableError

__all__ = [
    "CLONES_REMOVED_PASS",
    "PASS_NAME",
    "UPSTREAM_FUSED_OPS",
    "fuse_collectives_pass",
    "keep_upstream_collectives_in_torch",
    "pool_pass_index",
    "register_with_torch_tensorrt",
]

logger = logging.getLogger(__name__)

PASS_NAME = "torch_tensorrt_dist_fuse_collectives"
#: Torch-TensorRT's own collective pass; ours must run before it
UPSTREAM_PASS = "fuse_distributed_ops"
#: the pass after which a graph input's readers read it directly (its clones removed): the
#: block-write pass runs right after it
CLONES_REMOVED_PASS = "remove_input_alias_fixing_clones"

_lock = threading.Lock()
_registered: list[bool] = []


#: Torch-TensorRT 2.14's own fused collectives (``lowering/passes/fuse_distributed_ops.py``), by
#: the qualified name its partitioners match ``torch_executed_ops`` against. Their converters
#: use the world group and float32, so a collective we leave unfused must not reach them.
UPSTREAM_FUSED_OPS: tuple[str, ...] = tuple(
    f"torch.ops.tensorrt.fused_nccl_{name}.default"
    for name in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "scatter", "gather")
)


def keep_upstream_collectives_in_torch(settings: Any) -> None:
    """Add Torch-TensorRT's fused collective ops to ``settings.torch_executed_ops``: they then
    run in PyTorch (their eager kernels use the op's own group), never through its converters."""
    current = set(getattr(settings, "torch_executed_ops", None) or ())
    settings.torch_executed_ops = current | set(UPSTREAM_FUSED_OPS)


def fuse_collectives_pass(gm: fx.GraphModule, settings: Any = None) -> fx.GraphModule:
    """Torch-TensorRT lowering-pass signature ``(gm, settings) -> gm`` around fuse_collectives.

    A collective it cannot fuse (it is reported) stays a ``_c10d_functional`` op, which
    Torch-TensorRT's own ``fuse_distributed_ops`` would then convert with the world group and
    float32; those ops are kept in PyTorch instead (``torch_executed_ops``).
    """
    from torch_tensorrt_dist.lowering import fuse_collectives, fusion_report

    fuse_collectives(gm)
    unfused = fusion_report(gm).unfused
    if unfused and settings is not None:
        keep_upstream_collectives_in_torch(settings)
        logger.warning(
            "%d collective(s) left unfused (%s); they run in PyTorch, not through "
            "Torch-TensorRT's own collective converters",
            len(unfused),
            "; ".join(reason for _, reason in unfused),
        )
    return gm


fuse_collectives_pass.__name__ = PASS_NAME


def pass_index(pass_names: list[str]) -> int | None:
    """Where our pass goes: just before Torch-TensorRT's collective pass, else at the end."""
    return pass_names.index(UPSTREAM_PASS) if UPSTREAM_PASS in pass_names else None


def pool_pass_index(pass_names: list[str]) -> int | None:
    """Where the block-write pass goes: just after Torch-TensorRT's clone removal, else at the
    end (a pool write that still reads a clone is then left to Torch-TensorRT, as before)."""
    if CLONES_REMOVED_PASS in pass_names:
        return pass_names.index(CLONES_REMOVED_PASS) + 1
    return None


def _register_pass() -> None:
    from torch_tensorrt.dynamo.lowering.passes._aten_lowering_pass import (
        ATEN_POST_LOWERING_PASSES,
        _aten_lowering_pass,
    )

    from torch_tensorrt_dist.conversion.layers.paged_kv import pool_write_pass

    names = [getattr(p, "__name__", "") for p in ATEN_POST_LOWERING_PASSES.passes]
    if PASS_NAME not in names:
        _aten_lowering_pass(fuse_collectives_pass, index=pass_index(names))
    names = [getattr(p, "__name__", "") for p in ATEN_POST_LOWERING_PASSES.passes]
    if pool_write_pass.__name__ not in names:
        _aten_lowering_pass(pool_write_pass, index=pool_pass_index(names))


def register_with_torch_tensorrt(strict: bool = False) -> bool:
    """Register the pass and converters once; False (and nothing done) without Torch-TensorRT.

    Where Torch-TensorRT is installed but unusable (import fails, or its registry API is not
    the one we call) this logs a warning and returns False, so ``import torch_tensorrt_dist``
    still works for the other engines; ``strict=True`` (``engine="tensorrt"``) raises instead.
    """
    if importlib.util.find_spec("torch_tensorrt") is None:
        if strict:
            raise EngineUnavailableError(
                "Torch-TensorRT is not installed: pip install 'torch_tensorrt_dist[tensorrt]'"
            )
        return False
    with _lock:
        if _registered:
            return True
        from torch_tensorrt_dist.conversion.nccl_library import preload_torch_nccl

        preload_torch_nccl()  # before TensorRT can dlopen an NCCL of its own
        try:
            import torch_tensorrt  # noqa: F401

            from torch_tensorrt_dist.conversion.converters import register_converters
            from torch_tensorrt_dist.conversion.impl import implementations

            _register_pass()
            register_converters()
            for impl in implementations():
                impl.install()  # e.g. the TensorRT-LLM plugins' IS_BUILDING during builds
        except Exception as exc:  # torch_tensorrt raises a bare Exception without libnvinfer
            message = (
                f"cannot register with the installed Torch-TensorRT ({type(exc).__name__}: "
                f"{exc}); install torch-tensorrt>=2.14,<2.15 with a matching TensorRT"
            )
            if strict:
                raise EngineUnavailableError(message) from exc
            logger.warning("%s; backend='torch_tensorrt' will not convert our collectives", message)
            return False
        _registered.append(True)
        logger.debug("registered %s and the collective converters with Torch-TensorRT", PASS_NAME)
        return True
