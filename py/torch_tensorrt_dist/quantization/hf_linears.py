"""Weight-only int8 / int4 (``--quantize``) for the transformers family: the linears of
transformers' decoder layers as :class:`~.modules.WeightOnlyLinear`, on each rank's slice.

    reason = hf_refusal(meta_model, tp)          # at plan time, before any weight is read
    report = quantize_hf(model, QuantConfig("int8"), engine="inductor")   # after loading

Which linears: the ``nn.Linear`` modules of the decoder layers that the model's own
``base_model_tp_plan`` names (every projection of attention and the MLP of a Llama-like model;
at TP 1 the plan is not applied, it only names them); the rest keep the model dtype, as the
native families keep theirs (a MoE router, fused experts, the embedding and the LM head).

Under TP > 1 transformers runs a sharded linear through a forward of its own around the module
(``install_forward``); the quantized module replaces it: a ``colwise`` slice needs nothing
around it (its input is replicated, its output this rank's columns), a ``rowwise`` one is
:class:`RowParallel` (its local product summed over the TP group by one functional all-reduce,
as the native models sum theirs, then the bias). A plan that splits a layer's linear by
another style (phi3's ``colwise_gather_output``) is refused under TP > 1 by name. Scales are
per output row (int8) or per group of input columns of this rank's slice (int4), as
``quantization/apply.py`` quantizes a native rank's slice.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor, nn

from torch_tensorrt_dist.quantization.apply import QuantReport, check_shape, layer_kind
from torch_tensorrt_dist.quantization.kernels import compute_dtype
from torch_tensorrt_dist.quantization.modules import WeightOnlyLinear, quantize_matrix
from torch_tensorrt_dist.quantization.scheme import QuantConfig

__all__ = ["STYLES", "RowParallel", "hf_refusal", "hf_targets", "quantize_hf"]

logger = logging.getLogger(__name__)

#: the TP plan styles of the linears quantized here
STYLES = ("colwise", "rowwise")


class RowParallel(nn.Module):
    """A ``rowwise`` linear's quantized slice: its product over this rank's input columns,
    summed over the TP group, then the (replicated) bias."""

    def __init__(self, inner: WeightOnlyLinear, bias: Tensor | None, group: Any) -> None:
        super().__init__()
        self.inner, self.group = inner, group
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        y = funcol.all_reduce(self.inner(x), "sum", self.group)
        return y if self.bias is None else y + self.bias


def _plan(model: Any) -> dict[str, str]:
    """The model's TP plan by module name (``layers.*`` expanded)."""
    plan = dict(getattr(model, "tp_plan", None) or {})
    return dict(model._expand_parallel_plan(plan)) if plan else {}


def hf_targets(model: Any, tp: int) -> list[tuple[str, str]]:
    """(module name, style) of every ``nn.Linear`` of the decoder layers the plan names (at
    ``tp`` > 1: ``colwise`` or ``rowwise``; at TP 1 the plan is not applied, any style)."""
    plan, out = _plan(model), []
    for name, module in model.named_modules():
        style = plan.get(name)
        linear = isinstance(module, nn.Linear) and ".layers." in name
        if linear and style is not None and (tp == 1 or style in STYLES):
            out.append((name, style))
    return out


def hf_refusal(model: Any, tp: int, *, embeddings: bool = False) -> str | None:
    """Why ``--quantize`` cannot run ``model`` (its meta form) at ``tp``, else None."""
    kind = type(model).__name__
    if embeddings:
        return (
            f"--quantize-embeddings: {kind}'s embedding and LM head stay in the model dtype "
            "(transformers' own modules): drop it"
        )
    if tp > 1:
        modules = dict(model.named_modules())
        for name, style in _plan(model).items():
            module = modules.get(name) if ".layers." in name else None  # (or a parameter's)
            if isinstance(module, nn.Linear) and style not in STYLES:
                return (
                    f"--quantize at --tp {tp}: {kind}'s TP plan splits {name} as {style!r}; "
                    f"quantized linears run {' and '.join(STYLES)} only: use --tp 1"
                )
    if not hf_targets(model, tp):
        return (
            f"--quantize takes the decoder's linears that {kind}'s base_model_tp_plan names; "
            "it names none: drop --quantize"
        )
    return None


def _local(t: Any) -> Tensor | None:
    """A (DTensor) parameter's local shard, detached."""
    if t is None:
        return None
    from torch.distributed.tensor import DTensor

    return (t.to_local() if isinstance(t, DTensor) else t).detach()


def quantize_hf(
    model: nn.Module,
    config: QuantConfig,
    *,
    engine: str = "inductor",
    group: dist.ProcessGroup | None = None,
) -> QuantReport:
    """Replace the plan's colwise / rowwise linears of transformers' ``model`` (this rank's
    slices; ``group``: its TP group, None at TP 1) by quantized ones, in place."""
    device = next(model.parameters()).device
    kind = layer_kind(config, engine=engine, device_type=device.type)
    targets = hf_targets(model, 1 if group is None else dist.get_world_size(group))
    for name, _ in targets:
        w = _local(model.get_submodule(name).weight)
        assert w is not None
        check_shape(name, w, config, kind)
    before = after = 0
    with torch.no_grad():
        for name, style in targets:
            owner, _, attr = name.rpartition(".")
            linear = model.get_submodule(name)
            w, bias = _local(linear.weight), _local(linear.bias)
            assert w is not None
            before += w.numel() * w.element_size()
            q, s = quantize_matrix(w, config, kind, compute_dtype(w.device.type, w.dtype))
            rows, cols = w.shape
            row_parallel = style == "rowwise" and group is not None
            inner_bias = None if row_parallel else bias  # a rowwise bias: after the sum
            inner = WeightOnlyLinear(
                cols, rows, q, s, kind=kind, group_size=config.group, bias=inner_bias
            )
            if engine == "tensorrt":
                inner.dense_rows = None
            after += sum(b.nbytes for b in inner.buffers())
            new: nn.Module = RowParallel(inner, bias, group) if row_parallel else inner
            setattr(model.get_submodule(owner), attr, new)
            del linear, w
    n, scheme = len(targets), config.scheme
    logger.info("quantized %d linears to %s (%s): %d -> %d bytes", n, scheme, kind, before, after)
    return QuantReport(config, kind, len(targets), before, after)
