"""The grouped MoE experts op (``ops/experts.py``) in TensorRT: ``IMoELayer``, or PyTorch.

TensorRT has one layer for routed experts: ``IMoELayer`` (``INetworkDefinition.add_moe``; the
Python API has it from 10.16, so in the 11.1 that Torch-TensorRT 2.14 uses). It takes the hidden
states [batch, seqLen, H], each token's selected experts and their scores [batch, seqLen, k],
and the stacked gate/up weights [E, H, I] and down weights [E, I, H] of SwiGLU experts
(``set_gated_weights`` with ``MoEActType.SILU``): exactly ``torch.ops.tensorrt_dist.moe_experts``.
TensorRT documents it for Blackwell and Thor GPUs only (SM 10.x, 11.x; not 12.x) and says
performance is limited when seqLen > 16, so the T tokens go in as T sequences of one token
(``[T, 1, H]``), never as one sequence of T. TensorRT has no grouped-matmul layer besides it, and
Torch-TensorRT 2.14 has no converter for ``torch._grouped_mm``.

So the op converts to ``IMoELayer`` where the installed TensorRT has ``add_moe`` (checked with
``hasattr``, not a version), the GPU is SM 10.x/11.x and the dtype is float16 or bfloat16
(TensorRT's documentation lists the layer's quantized FP8/FP4 modes and does not state float32;
float32 is left to PyTorch rather than claimed). Its weights must be build-time constants: the
backend freezes the expert weights of such an op into the graph for ``engine='tensorrt'``
(:func:`frozen_expert_inputs`, ``lowering/freeze_constants.py``), as it does for quantized
weights, and the validator refuses an op whose weights are still graph inputs. Everywhere else
it stays in PyTorch, where its eager kernel runs the grouped matmuls, and Torch-TensorRT splits
the engine around it: one PyTorch op per MoE layer of a prefill graph (the decode graph's
gathered "routed" form is plain TensorRT layers). ``explain`` lists each such op and the reason
(``backend/report.py``).

Expert parallelism: a rank holds experts ``start .. start + E - 1``. A token's choice of an
expert another rank owns becomes local expert 0 with score 0, so it adds nothing. One token's
top-k may then name local expert 0 more than once (two choices elsewhere, or one elsewhere and
a real choice of expert 0); the layer's contract (a weighted sum over the selected experts)
does not ask for distinct ids, and such a duplicate costs one more expert-0 evaluation of the
token. Whether the GPU kernel takes repeats as the header reads has not been checked here (no
TensorRT); ``tests/test_tensorrt_moe.py`` compares an engine on a shard of the experts
(``start > 0``) with PyTorch where a Blackwell GPU is available.

:func:`moe_layer_decision` and :func:`moe_layer_shapes` are pure; :func:`moe_layer_environment`
probes the installed TensorRT and GPU (only when asked: the inductor and eager engines never
do); :func:`convert_moe_experts` is the TensorRT shell, which has not run here (no TensorRT, no
Blackwell GPU).
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
    "MoELayerEnvironment",
    "convert_moe_experts",
    "frozen_expert_inputs",
    "moe_experts_validator",
    "moe_layer_decision",
    "moe_layer_environment",
    "moe_layer_shapes",
    "node_moe_decision",
]

logger = logging.getLogger(__name__)

#: GPU architectures IMoELayer runs on (NvInfer.h: "Blackwell or Thor ... SM 10.x or SM 11.x")
MOE_LAYER_SM_MAJOR = (10, 11)
MOE_LAYER_DTYPES = (torch.float16, torch.bfloat16)
#: where w1, w3, w2 sit in ``moe_experts(x, ids, scores, w1, w3, w2, start)``
_WEIGHT_ARGS = (3, 4, 5)


class MoELayerEnvironment(NamedTuple):
    """What the decision needs to know about this machine."""

    tensorrt: str | None
    """The installed TensorRT's version, None if it cannot be imported."""
    moe_layer: bool
    """``hasattr(tensorrt.INetworkDefinition, "add_moe")``: its Python API has the layer."""
    compute_capability: tuple[int, int] | None
    """The current CUDA device's, None without one."""


def moe_layer_decision(
    dtype: torch.dtype, env: MoELayerEnvironment, *, constant_weights: bool = True
) -> Decision:
    """Does one ``moe_experts`` call of this dtype become an IMoELayer here, and why (not)?
    ``constant_weights``: whether its w1/w3/w2 are constants of the graph."""
    where = (
        "IMoELayer needs a TensorRT whose network has add_moe (10.16 or newer) on a GPU of SM "
        "10.x or 11.x (Blackwell, Thor)"
    )
    if env.tensorrt is None:
        return Decision(False, f"no TensorRT here; {where}")
    if not env.moe_layer:
        return Decision(False, f"TensorRT {env.tensorrt} has no MoE layer; {where}")
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
    if not constant_weights:
        return Decision(
            False,
            "the expert weights are graph inputs, not constants: IMoELayer is built on constant "
            "weights, which the backend freezes for engine='tensorrt' (compile through it)",
        )
    return Decision(True, "IMoELayer")


def moe_layer_shapes(tokens: int, dim: int, top_k: int) -> tuple[tuple[int, ...], ...]:
    """IMoELayer's hidden states, expert ids and scores for ``T`` tokens: ``T`` sequences of
    one token each (``[T, 1, D]``, ``[T, 1, k]``, ``[T, 1, k]``); the header warns that the
    layer is slow when seqLen > 16, and a token's experts do not depend on its neighbours."""
    return (tokens, 1, dim), (tokens, 1, top_k), (tokens, 1, top_k)


@functools.lru_cache(maxsize=1)
def moe_layer_environment() -> MoELayerEnvironment:
    """The installed TensorRT (imported only if it is there) and the current GPU."""
    version: str | None = None
    has_layer = False
    if importlib.util.find_spec("tensorrt") is not None:
        try:
            import tensorrt as trt

            version = str(trt.__version__)
            has_layer = hasattr(trt.INetworkDefinition, "add_moe")
        except Exception as exc:  # TensorRT without its libraries raises a bare Exception
            logger.debug("TensorRT cannot be imported: %s", exc)
    capability = None
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        capability = (int(major), int(minor))
    return MoELayerEnvironment(version, has_layer, capability)


def _weights_are_constants(node: fx.Node) -> bool:
    weights = [node.args[i] if len(node.args) > i else None for i in _WEIGHT_ARGS]
    return all(isinstance(w, fx.Node) and w.op == "get_attr" for w in weights)


def node_moe_decision(
    node: fx.Node, env: MoELayerEnvironment | None = None, *, require_constants: bool = True
) -> Decision:
    """:func:`moe_layer_decision` for a ``moe_experts`` node of a traced graph.
    ``require_constants=False`` asks what happens under ``engine='tensorrt'``, which freezes
    the weights first (``explain`` traces with the eager engine, which does not)."""
    x = node.args[0] if node.args else None
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return Decision(False, f"{node.name}: the hidden states carry no traced value")
    constant = _weights_are_constants(node) or not require_constants
    env = env if env is not None else moe_layer_environment()
    return moe_layer_decision(val.dtype, env, constant_weights=constant)


def frozen_expert_inputs(gm: fx.GraphModule, env: MoELayerEnvironment | None = None) -> list[int]:
    """Positions among ``gm``'s placeholders of the w1/w3/w2 of every ``moe_experts`` call that
    would become an IMoELayer here once its weights are constants (the backend freezes them).
    Empty (and nothing probed) when the graph has no such call."""
    from torch_tensorrt_dist.ops.experts import EXPERTS_OP

    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is EXPERTS_OP]
    if not calls:
        return []
    position = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    out: set[int] = set()
    for node in calls:
        if not node_moe_decision(node, env, require_constants=False).convertible:
            continue
        weights = [node.args[i] for i in _WEIGHT_ARGS]
        if all(isinstance(w, fx.Node) and w in position for w in weights):
            out.update(position[w] for w in weights)
    return sorted(out)


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
    t, d = (int(s) for s in x.shape)  # t = -1 for dynamic tokens: each reshape infers it
    k = int(ids.shape[1])

    def tensor(value: Any, tag: str) -> Any:
        return get_trt_tensor(ctx, value, f"{name}_{tag}")

    ew = impl.elementwise
    local = ew.sub(ctx, target, src, f"{name}_local", tensor(ids, "ids"), start)
    mine = ew.logical_and(
        ctx,
        target,
        src,
        f"{name}_mine",
        ew.ge(ctx, target, src, f"{name}_ge", local, 0),
        ew.lt(ctx, target, src, f"{name}_lt", local, experts),
    )
    # where() takes tensors on both sides (it reads .shape of each): [1] constants, broadcast
    local = impl.cast.to_copy(ctx, target, src, f"{name}_ids32", local, torch.int32)
    zero_id = torch.zeros(1, dtype=torch.int32)
    local = impl.condition.where(ctx, target, src, f"{name}_ids0", local, zero_id, mine)
    hidden = tensor(x, "x")
    zero_score = torch.zeros(1, dtype=torch.float32)
    scores = impl.condition.where(
        ctx, target, src, f"{name}_w0", tensor(scores, "w"), zero_score, mine
    )
    scores = impl.cast.to_copy(ctx, target, src, f"{name}_wcast", scores, hidden.dtype)
    x_shape, ids_shape, w_shape = moe_layer_shapes(t, d, k)

    def reshape(value: Any, shape: tuple[int, ...], tag: str) -> Any:
        return impl.shuffle.reshape(ctx, target, src, f"{name}_{tag}3d", value, shape)

    def k_major(w: Any, tag: str) -> Any:  # [E, out, in] -> [E, in, out]
        w = tensor(w, tag)
        return impl.permutation.permute(ctx, target, src, f"{name}_{tag}t", w, (0, 2, 1))

    layer = ctx.net.add_moe(
        reshape(hidden, x_shape, "x"),
        reshape(local, ids_shape, "ids"),
        reshape(scores, w_shape, "w"),
    )
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
