"""``engine="tensorrt"`` for our backend: a lowered aten graph -> Torch-TensorRT engines.

    compiled = compile_tensorrt(gm, example_inputs, settings)   # boxed: compiled(list_of_inputs)

Uses the same pass and converters as ``backend="torch_tensorrt"`` (``registration.py``), with
the collective implementation and plugin path from ``settings`` and build failures raised,
never swallowed. Native layers bind the NCCL communicator of the group most of the graph's
collectives use (Torch-TensorRT binds one communicator per engine); a collective on another
group stays in PyTorch, with the reason logged. Not run against a real TensorRT here.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.conversion.availability import collective_settings, current_impl
from torch_tensorrt_dist.conversion.mpi_world import check_plugin_world
from torch_tensorrt_dist.conversion.nccl_library import preload_torch_nccl
from torch_tensorrt_dist.conversion.node_args import CollectiveCall, collective_calls
from torch_tensorrt_dist.conversion.plugin_loader import load_trtllm_plugins
from torch_tensorrt_dist.errors import EngineUnavailableError

__all__ = ["compile_tensorrt", "decompositions", "engine_group"]

logger = logging.getLogger(__name__)

_PIP = "pip install 'torch_tensorrt_dist[tensorrt]'"
#: Torch-TensorRT options we set unless the user passes them in torch_tensorrt_options
_DEFAULT_OPTIONS = {"min_block_size": 1}


def _require_torch_tensorrt() -> Any:
    try:
        import tensorrt  # noqa: F401
    except ImportError as exc:
        raise EngineUnavailableError(
            f"engine='tensorrt' needs TensorRT, which cannot be imported ({exc}); {_PIP} on a "
            "machine with an NVIDIA GPU, or use engine='inductor'/'eager'"
        ) from exc
    try:
        import torch_tensorrt
    except ImportError as exc:
        raise EngineUnavailableError(
            f"engine='tensorrt' needs Torch-TensorRT, which cannot be imported ({exc}); {_PIP} "
            "(torch-tensorrt>=2.14,<2.15), or use engine='inductor'/'eager'"
        ) from exc
    return torch_tensorrt


def engine_group(calls: list[CollectiveCall]) -> CollectiveCall | None:
    """The collective whose group the engine binds: the most used group (first on a tie)."""
    multi = [c for c in calls if len(c.group_ranks) > 1]
    if not multi:
        return None
    counts = collections.Counter(c.group_ranks for c in multi)
    best = max(counts.values())
    return next(c for c in multi if counts[c.group_ranks] == best)


def decompositions(settings: Any) -> dict[Any, Callable[..., Any]]:
    """The decomposition table Torch-TensorRT traces with (called by the backend)."""
    _require_torch_tensorrt()
    from torch_tensorrt.dynamo.lowering import get_decompositions

    options = dict(getattr(settings, "torch_tensorrt_options", {}) or {})
    return dict(
        get_decompositions(
            enable_experimental_decompositions=bool(
                options.get("enable_experimental_decompositions", False)
            ),
            decompose_attention=bool(options.get("decompose_attention", False)),
            use_distributed_mode_trace=True,
        )
    )


def _trt_settings(settings: Any) -> Any:
    from torch_tensorrt.dynamo.utils import parse_dynamo_kwargs

    options = {**_DEFAULT_OPTIONS, **dict(getattr(settings, "torch_tensorrt_options", {}) or {})}
    trt_settings, _cache = parse_dynamo_kwargs({"options": options})
    trt_settings.use_distributed_mode_trace = True  # the graph is already aten (AOTAutograd)
    trt_settings.pass_through_build_failures = True  # never hand back the PyTorch graph silently
    return trt_settings


@contextlib.contextmanager
def _bound_group(group_name: str | None) -> Iterator[Any]:
    if group_name is None:
        yield None
        return
    from torch_tensorrt.distributed import distributed_context

    from torch_tensorrt_dist.ops.groups import resolve_group

    pg = resolve_group(group_name)
    with distributed_context(pg):
        yield pg


def _fake_inputs(example_inputs: list[Any]) -> list[Any]:
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    if detect_fake_mode(example_inputs) is not None:
        return example_inputs
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    return [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]


def compile_tensorrt(
    gm: fx.GraphModule, example_inputs: list[Any], settings: Any
) -> Callable[[list[Any]], Any]:
    """Build the engines for one rank's lowered graph; returns a boxed callable (its
    ``trt_module`` attribute is the GraphModule that holds the engines).

    Reads ``settings.collective_impl`` ("auto"|"native"|"plugin"|"torch_nccl"),
    ``settings.plugin_path`` (str | None) and ``settings.torch_tensorrt_options`` (a mapping
    passed to Torch-TensorRT).
    """
    _require_torch_tensorrt()
    from torch._functorch.aot_autograd import make_boxed_func
    from torch_tensorrt.dynamo.backend.backends import _pretraced_backend

    from torch_tensorrt_dist.conversion.registration import register_with_torch_tensorrt

    preload_torch_nccl()  # one NCCL for torch, TensorRT and the plugins
    register_with_torch_tensorrt(strict=True)
    impl_setting = getattr(settings, "collective_impl", "auto")
    plugin_path = getattr(settings, "plugin_path", None)
    calls = collective_calls(gm)
    multi = [c for c in calls if len(c.group_ranks) > 1]
    # --- torch_nccl: auto's choice is engine-wide (native only where one group takes it all);
    # pin it so every capability validator of this engine sees the same implementation ---
    with collective_settings(impl_setting, plugin_path):
        choice = current_impl(native_takes_all=len({c.group_ranks for c in multi}) <= 1)
    if choice.impl == "torch_nccl":
        impl_setting = "torch_nccl"
    # --- end torch_nccl ---
    with collective_settings(impl_setting, plugin_path):
        if multi and choice.impl is None:
            raise EngineUnavailableError(choice.reason)
        bound = None
        if multi and choice.impl == "plugin":
            load_trtllm_plugins(plugin_path)
            check_plugin_world([c.group_ranks for c in multi])
        elif multi and choice.impl == "torch_nccl":
            from torch_tensorrt_dist.conversion.torch_nccl_converter import prepare_torch_nccl

            prepare_torch_nccl(multi)
        elif multi and choice.impl == "native":
            bound = engine_group(calls)
        logger.info("TensorRT collectives: %s (%s)", choice.impl, choice.reason)
        with _bound_group(bound.group_name if bound else None) as pg:
            compiled = _pretraced_backend(gm, _fake_inputs(example_inputs), _trt_settings(settings))
        if pg is not None and isinstance(compiled, torch.nn.Module):
            from torch_tensorrt.distributed import set_distributed_mode

            set_distributed_mode(pg, compiled)
    boxed = make_boxed_func(compiled)
    boxed.trt_module = compiled  # type: ignore[attr-defined]  # the GraphModule holding the engines (for checks and tests)
    return boxed
