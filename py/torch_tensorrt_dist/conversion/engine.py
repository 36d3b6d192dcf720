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

from torch_tensorrt_dist.conversion.availability import require_tensorrt_engine
from torch_tensorrt_dist.conversion.choice import current_impl
from torch_tensorrt_dist.conversion.engine_binding import (
    keep_aliased_outputs,
    multidevice_engines,
    pin_engines,
    with_bound_communicator,
)
from torch_tensorrt_dist.conversion.impl import implementation
from torch_tensorrt_dist.conversion.nccl_library import preload_torch_nccl
from torch_tensorrt_dist.conversion.node_args import CollectiveCall, collective_calls
from torch_tensorrt_dist.conversion.settings import collective_settings
from torch_tensorrt_dist.errors import DistributedSetupError, EngineUnavailableError
from torch_tensorrt_dist.validation import check_known_options

__all__ = ["compile_tensorrt", "decompositions", "engine_group"]

logger = logging.getLogger(__name__)

#: Torch-TensorRT options we set unless the user passes them in torch_tensorrt_options.
#: ``attn_bias_is_causal`` (True upstream) would replace an attention mask with plain causal
#: masking whenever query and key lengths match: left padding and sliding windows need the mask.
_DEFAULT_OPTIONS: dict[str, Any] = {"min_block_size": 1, "attn_bias_is_causal": False}
#: keys ``parse_dynamo_kwargs`` (torch-tensorrt 2.14) reads besides CompilationSettings fields
_EXTRA_OPTION_KEYS = frozenset(
    {"truncate_long_and_double", "custom_engine_cache", "engine_cache_dir", "engine_cache_size"}
)


def _require_torch_tensorrt() -> Any:
    require_tensorrt_engine()
    import torch_tensorrt

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
    """The decomposition table, as Torch-TensorRT's own AOT (distributed) path builds it:
    ``get_decompositions(experimental, decompose_attention, use_distributed_mode_trace=True,
    use_fp32_acc=...)`` without the ``detach`` decompositions (they leave alias nodes)."""
    _require_torch_tensorrt()
    from torch_tensorrt.dynamo.lowering import get_decompositions

    trt_settings, _cache = _trt_settings(settings)
    table = dict(
        get_decompositions(
            trt_settings.enable_experimental_decompositions,
            trt_settings.decompose_attention,
            True,
            use_fp32_acc=trt_settings.use_fp32_acc,
        )
    )
    return {k: v for k, v in table.items() if "detach" not in k._name}


def _trt_settings(settings: Any, *, collectives: bool = False) -> tuple[Any, Any]:
    """Torch-TensorRT's ``(CompilationSettings, engine cache)`` from our settings; an unknown
    key in ``torch_tensorrt_options`` is a ConfigError (upstream drops it silently).

    With ``collectives`` (the graph communicates), TensorRT's auxiliary streams are off unless
    the user sets ``max_aux_streams``: on them two independent collective layers could run at
    once, or in another order on another rank (each rank tunes its engine alone), and NCCL
    would hang."""
    from dataclasses import fields

    from torch_tensorrt.dynamo import CompilationSettings
    from torch_tensorrt.dynamo.utils import parse_dynamo_kwargs

    user = dict(getattr(settings, "torch_tensorrt_options", {}) or {})
    known = {f.name for f in fields(CompilationSettings)} | _EXTRA_OPTION_KEYS
    check_known_options(user, known, "torch_tensorrt_options key")
    options = {**_DEFAULT_OPTIONS, **({"max_aux_streams": 0} if collectives else {}), **user}
    trt_settings, engine_cache = parse_dynamo_kwargs({"options": options})
    trt_settings.use_distributed_mode_trace = True  # the graph is already aten (AOTAutograd)
    trt_settings.pass_through_build_failures = True  # never hand back the PyTorch graph silently
    return trt_settings, engine_cache


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


def collectives_left_in_torch(compiled: torch.nn.Module) -> int:
    """Typed collectives over more than one rank that still run in PyTorch after partitioning
    (in the top graph or a PyTorch submodule; the engines hold the others)."""
    left = 0
    for sub in compiled.modules():
        if isinstance(sub, fx.GraphModule):
            left += sum(len(c.group_ranks) > 1 for c in collective_calls(sub))
    return left


def compile_tensorrt(
    gm: fx.GraphModule, example_inputs: list[Any], settings: Any
) -> Callable[[list[Any]], Any]:
    """Build the engines for one rank's lowered graph; returns a boxed callable (its
    ``trt_module`` attribute is the GraphModule that holds the engines).

    Reads ``settings.collective_impl`` ("auto" or a registered implementation's name),
    ``settings.plugin_path`` (str | None) and ``settings.torch_tensorrt_options`` (a mapping
    passed to Torch-TensorRT). The chosen implementation prepares first (``prepare``: load its
    library, register communicators...). With one that binds one communicator per engine
    (native layers), the engines of this graph (only) are pinned to the group they were built
    for, and the first call creates that group's communicator and checks every engine is bound
    to it (``engine_binding.py``).
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
    # auto's choice is engine-wide (an implementation that binds one communicator first only
    # where one group takes it all): pin it, so every capability validator of this engine sees
    # the same implementation
    with collective_settings(impl_setting, plugin_path):
        choice = current_impl(native_takes_all=len({c.group_ranks for c in multi}) <= 1)
    impl = implementation(choice.impl) if choice.impl is not None else None
    if impl is not None:
        impl_setting = impl.name
    with collective_settings(impl_setting, plugin_path):
        if multi and impl is None:
            raise EngineUnavailableError(choice.reason)
        bound = None
        if multi and impl is not None:
            impl.prepare(multi, plugin_path)  # load a library, register communicators...
            if impl.one_communicator_per_engine:
                bound = engine_group(calls)
        logger.info("TensorRT collectives: %s (%s)", choice.impl, choice.reason)
        trt_settings, engine_cache = _trt_settings(settings, collectives=bool(multi))
        with _bound_group(bound.group_name if bound else None) as pg:
            compiled = _pretraced_backend(
                gm, _fake_inputs(example_inputs), trt_settings, engine_cache
            )
        keep_aliased_outputs(compiled)
    run = make_boxed_func(compiled)
    if pg is not None and isinstance(compiled, torch.nn.Module):
        run = _bind_native(run, compiled, pg, len(multi))
    run.trt_module = compiled  # type: ignore[attr-defined]  # the module holding the engines
    return run


def _bind_native(
    run: Callable[[list[Any]], Any], compiled: torch.nn.Module, pg: Any, n_multi: int
) -> Callable[[list[Any]], Any]:
    """Pin this graph's engines to ``pg``, refuse engines that cannot hold its collectives,
    and bind the communicator before the first run."""
    engines = multidevice_engines(compiled)
    converted = n_multi - collectives_left_in_torch(compiled)
    if converted > 0 and not engines:
        raise DistributedSetupError(
            f"{converted} collective(s) were converted into TensorRT engines, but no engine of "
            "this graph is multi-device (requires_native_multidevice), so none would get a "
            "communicator; the installed Torch-TensorRT cannot run native collectives here. "
            "Use collective_impl='plugin', or a Torch-TensorRT built with NCCL collectives"
        )
    pin_engines(engines, pg.group_name)
    device = torch.device("cuda", torch.cuda.current_device())
    return with_bound_communicator(run, engines, pg, device)
