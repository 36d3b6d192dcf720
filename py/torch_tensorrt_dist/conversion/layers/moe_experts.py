"""The grouped MoE experts op (``ops/experts.py``) in TensorRT: ``IMoELayer``, or PyTorch.

TensorRT has one layer for routed experts: ``IMoELayer`` (``INetworkDefinition.addMoE``, in
TensorRT 10.16 and later, so in the 11.1 that Torch-TensorRT 2.14 uses). It takes the hidden
states [B, S, H], each token's selected experts and their scores [B, S, k], and the stacked
gate/up weights [E, H, I] and down weights [E, I, H] of SwiGLU experts (``setGatedWeights`` with
``MoEActType.SILU``): exactly ``torch.ops.tensorrt_dist.moe_experts``. TensorRT documents it
for Blackwell and Thor GPUs only (SM 10.x, 11.x; not 12.x) and says performance is limited above
16 tokens per sequence. TensorRT has no grouped-matmul layer besides it, and Torch-TensorRT
2.14 has no converter for ``torch._grouped_mm``.

So the op converts to ``IMoELayer`` where the installed TensorRT has the layer, the GPU is SM
10.x/11.x and the dtype is float16 or bfloat16 (TensorRT's documentation lists the layer's
quantized FP8/FP4 modes and does not state float32; float32 is left to PyTorch rather than
claimed). Everywhere else it stays in PyTorch, where its eager kernel runs the grouped matmuls,
and Torch-TensorRT splits the engine around it: one PyTorch op per MoE layer of a prefill graph
(the decode graph's gathered "routed" form is plain TensorRT layers). ``explain`` lists each
such op and the reason (``backend/report.py``).

:func:`moe_layer_decision` is pure; :func:`moe_layer_environment` probes the installed TensorRT
and GPU; :func:`convert_moe_experts` is the TensorRT shell, which has not run here (no
TensorRT, no Blackwell GPU).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any, NamedTuple

import torch
from torch import fx

from torch_tensorrt_dist.conversion.interface import Decision
from torch_tensorrt_dist.errors import EngineUnavailableError

__all__ = [
    "MOE_LAYER_DTYPES",
    "MOE_LAYER_TENSORRT",
    "MoELayerEnvironment",
    "convert_moe_experts",
    "moe_experts_validator",
    "moe_layer_decision",
    "moe_layer_environment",
    "node_moe_decision",
]

logger = logging.getLogger(__name__)

#: the first TensorRT whose Python API has ``INetworkDefinition.add_moe`` (10.15 lacks it)
MOE_LAYER_TENSORRT = (10, 16)
#: GPU architectures IMoELayer runs on (NvInfer.h: "Blackwell or Thor ... SM 10.x or SM 11.x")
MOE_LAYER_SM_MAJOR = (10, 11)
MOE_LAYER_DTYPES = (torch.float16, torch.bfloat16)


class MoELayerEnvironment(NamedTuple):
    """What the decision needs to know about this machine."""

    tensorrt: tuple[int, ...] | None
    """The installed TensorRT's version, None if it cannot be imported."""
    compute_capability: tuple[int, int] | None
    """The current CUDA device's, None without one."""


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def moe_layer_decision(dtype: torch.dtype, env: MoELayerEnvironment) -> Decision:
    """Does one ``moe_experts`` call of this dtype become an IMoELayer here, and why (not)?"""
    where = (
        f"IMoELayer needs TensorRT >= {'.'.join(map(str, MOE_LAYER_TENSORRT))} on a GPU of SM "
        "10.x or 11.x (Blackwell, Thor)"
    )
    if env.tensorrt is None:
        return Decision(False, f"no TensorRT here; {where}")
    if env.tensorrt[:2] < MOE_LAYER_TENSORRT:
        version = ".".join(map(str, env.tensorrt))
        return Decision(False, f"TensorRT {version} has no MoE layer; {where}")
    if env.compute_capability is None:
        return Decision(False, f"no CUDA GPU here; {where}")
    major, minor = env.compute_capability
    if major not in MOE_LAYER_SM_MAJOR:
        return Decision(False, f"this GPU is SM {major}.{minor}; {where}")
    if dtype not in MOE_LAYER_DTYPES:
        name = str(dtype).removeprefix("torch.")
        return Decision(
            False,
            f"{name} experts are not converted: TensorRT documents IMoELayer for half precision "
            "and FP8/FP4, not float32; use float16 or bfloat16",
        )
    return Decision(True, "IMoELayer")


@functools.lru_cache(maxsize=1)
def moe_layer_environment() -> MoELayerEnvironment:
    """The installed TensorRT (imported only if it is there) and the current GPU."""
    version: tuple[int, ...] | None = None
    if importlib.util.find_spec("tensorrt") is not None:
        try:
            import tensorrt as trt

            version = _version(trt.__version__)
        except Exception as exc:  # TensorRT without its libraries raises a bare Exception
            logger.debug("TensorRT cannot be imported: %s", exc)
    capability = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        capability = (int(major), int(minor))
    return MoELayerEnvironment(version, capability)


def node_moe_decision(node: fx.Node, env: MoELayerEnvironment | None = None) -> Decision:
    """:func:`moe_layer_decision` for a ``moe_experts`` node of a traced graph."""
    x = node.args[0] if node.args else None
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return Decision(False, f"{node.name}: the hidden states carry no traced value")
    return moe_layer_decision(val.dtype, env if env is not None else moe_layer_environment())


_reported: set[str] = set()


def moe_experts_validator(node: fx.Node, compilation_settings: Any = None) -> bool:
    """Torch-TensorRT capability validator: False keeps the op in PyTorch (the engine splits
    around it); the reason is logged once per node."""
    decision = node_moe_decision(node)
    if not decision.convertible and node.name not in _reported:
        _reported.add(node.name)
        logger.info("%s runs in PyTorch between TensorRT engines: %s", node.name, decision.reason)
    return decision.convertible


def convert_moe_experts(ctx: Any, target: Any, args: Any, kwargs: Any, name: str) -> Any:
    """``moe_experts(x [T, D], ids [T, k], scores [T, k], w1, w3, w2, start)`` as one
    IMoELayer: global ids become local ones, a choice another rank owns becomes local expert 0
    with score 0 (it adds nothing), weights are transposed to TensorRT's [E, in, out]."""
    import tensorrt as trt
    from torch_tensorrt.dynamo._SourceIR import SourceIR
    from torch_tensorrt.dynamo.conversion import impl
    from torch_tensorrt.dynamo.conversion.converter_utils import get_trt_tensor, set_layer_name

    x, ids, scores, w1, w3, w2, start = args
    src = SourceIR.ATEN
    experts = int(w1.shape[0])
    t, d = (int(s) for s in x.shape)
    k = int(ids.shape[1])

    def tensor(value: Any, tag: str) -> Any:
        return get_trt_tensor(ctx, value, f"{name}_{tag}")

    ew = impl.elementwise
    local = ew.sub(ctx, target, src, f"{name}_local", tensor(ids, "ids"), start)
    mine = ew.logical_and(
        ctx, target, src, f"{name}_mine",
        ew.ge(ctx, target, src, f"{name}_ge", local, 0),
        ew.lt(ctx, target, src, f"{name}_lt", local, experts),
    )  # fmt: skip
    local = impl.condition.where(ctx, target, src, f"{name}_ids0", local, 0, mine)
    local = impl.cast.to_copy(ctx, target, src, f"{name}_ids32", local, torch.int32)
    hidden = tensor(x, "x")
    scores = impl.condition.where(ctx, target, src, f"{name}_w0", tensor(scores, "w"), 0.0, mine)
    scores = impl.cast.to_copy(ctx, target, src, f"{name}_wcast", scores, hidden.dtype)

    def rows(value: Any, width: int, tag: str) -> Any:  # [T, n] -> [1, T, n]
        return impl.shuffle.reshape(ctx, target, src, f"{name}_{tag}3d", value, (1, t, width))

    def k_major(w: Any, tag: str) -> Any:  # [E, out, in] -> [E, in, out]
        w = tensor(w, tag)
        return impl.permutation.permute(ctx, target, src, f"{name}_{tag}t", w, (0, 2, 1))

    layer = ctx.net.add_moe(rows(hidden, d, "x"), rows(local, k, "ids"), rows(scores, k, "w"))
    if layer is None:
        raise EngineUnavailableError(
            f"TensorRT refused the MoE layer {name}; SparseMoE.compute='dense' keeps the experts "
            "in plain TensorRT layers"
        )
    layer.set_gated_weights(
        k_major(w1, "w1"), k_major(w3, "w3"), k_major(w2, "w2"), trt.MoEActType.SILU
    )
    set_layer_name(layer, target, name, src)
    return impl.shuffle.reshape(ctx, target, src, f"{name}_out", layer.get_output(0), (t, d))
