"""What really went into the TensorRT engines of a compiled step (GPU + TensorRT tests only).

A fallback passes a numeric check too (an op left to PyTorch, or Torch-TensorRT's own generic
converter instead of ours), so the TensorRT tests also look at the built module:

    with recording() as graphs, detailed_layers():
        out = compile_step(step, "tensorrt")(*inputs)
    module = graphs[-1].engine_module
    assert torch_ops_left(module, {torch.ops.aten.index_put_.default}) == 2 * n_layers
    assert len(engine_modules(module)) == n_layers + 1   # the paged step, split at its writes
    assert any("int8" in f for f in tensor_formats(engine_layers(module)))

The inspector's JSON layout (``Layers`` -> ``Inputs``/``Outputs`` -> ``Format/Datatype``) is
read from TensorRT's documentation, not from a run here (no GPU): the first GPU run confirms it.

``engine_layers`` reads each engine's ``IEngineInspector`` JSON (Torch-TensorRT's
``TorchTensorRTModule.get_layer_info``); inside ``detailed_layers`` the engines are built with
``ProfilingVerbosity.DETAILED`` (Torch-TensorRT's ``Debugger`` sets it), so each layer carries
its name, type and its inputs' and outputs' formats, not only its name.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from torch import fx


def _engine_kinds() -> tuple[type, ...]:
    from torch_tensorrt.dynamo.runtime import TorchTensorRTModule

    return (TorchTensorRTModule,)


def engine_modules(module: Any) -> list[Any]:
    """The TensorRT engine submodules of a module Torch-TensorRT built."""
    kinds = _engine_kinds()
    return [m for m in module.modules() if isinstance(m, kinds)]


def torch_ops_left(module: Any, targets: set[Any]) -> int:
    """Calls of ``targets`` that run in PyTorch: in the top graph or a PyTorch submodule
    (``_run_on_gpu_*``) of the partitioned module, not inside an engine."""
    kinds = _engine_kinds()
    left = 0
    for sub in module.modules():
        if isinstance(sub, fx.GraphModule) and not isinstance(sub, kinds):
            left += sum(n.op == "call_function" and n.target in targets for n in sub.graph.nodes)
    return left


def engine_layers(module: Any) -> list[dict[str, Any]]:
    """Every layer of every engine, as the engine inspector describes it (a name-only
    description becomes ``{"Name": ...}``)."""
    out: list[dict[str, Any]] = []
    for engine in engine_modules(module):
        info = json.loads(engine.get_layer_info())
        for layer in info.get("Layers", []):
            out.append(layer if isinstance(layer, dict) else {"Name": str(layer)})
    return out


def kv_cache_aliases(module: Any) -> int:
    """Engine outputs aliased to their cache input by an ``IKVCacheUpdateLayer``: the
    interpreter records each as ``aliased_io[output] = (input, "kv_cache_update")`` on the
    engine module (``compile_tensorrt`` moves them to ``KEPT_ALIASES`` where it clears them).
    This holds however TensorRT fuses the layer (a fused node keeps no layer name of ours), and
    Torch-TensorRT's scatter fallback records no such alias."""
    from torch_tensorrt_dist.conversion.engine_binding import KEPT_ALIASES

    count = 0
    for engine in engine_modules(module):
        aliases = getattr(engine, "aliased_io", None) or getattr(engine, KEPT_ALIASES, {})
        count += sum(kind == "kv_cache_update" for _, kind in aliases.values())
    return count


def tensor_formats(layers: list[dict[str, Any]]) -> set[str]:
    """Every ``Format/Datatype`` the inspector gives for a layer's inputs and outputs
    (lower case): what a tensor holds, where layer and tensor names (ours carry the op's,
    ``_weight_int8pack_mm_3``) say nothing about it."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "Format/Datatype" and isinstance(item, str):
                    found.add(item.lower())
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(layers)
    return found


@contextlib.contextmanager
def detailed_layers() -> Iterator[None]:
    """Engines built inside the block expose detailed layer information."""
    from torch_tensorrt.dynamo import Debugger

    with Debugger(log_level="info", engine_builder_monitor=False):
        yield


def assert_no_fallback(module: Any, targets: set[Any], what: str) -> None:
    assert module is not None, "the step was not built by Torch-TensorRT"
    left = torch_ops_left(module, targets)
    assert left == 0, f"{left} {what} ran in PyTorch between the engines (a fallback)"


__all__ = [
    "assert_no_fallback",
    "detailed_layers",
    "engine_layers",
    "engine_modules",
    "kv_cache_aliases",
    "tensor_formats",
    "torch_ops_left",
]
