"""What really went into the TensorRT engines of a compiled step (GPU + TensorRT tests only).

A fallback passes a numeric check too (an op left to PyTorch, or Torch-TensorRT's own generic
converter instead of ours), so the TensorRT tests also look at the built module:

    with recording() as graphs, detailed_layers():
        out = compile_step(step, "tensorrt")(*inputs)
    module = graphs[-1].engine_module
    assert torch_ops_left(module, {torch.ops.aten.index_put.default}) == 0
    names = [layer["Name"] for layer in engine_layers(module)]

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


def layers_matching(
    layers: list[dict[str, Any]], *words: str, names: bool = True
) -> list[dict[str, Any]]:
    """Layers whose description mentions every word (case-insensitive). ``names=False``
    leaves the layer's name out (our names carry the op's, ``_weight_int8pack_mm_3``): then
    only its type, formats and parameters count, which a name-only description lacks."""
    found = []
    for layer in layers:
        described = layer if names else {k: v for k, v in layer.items() if k != "Name"}
        text = json.dumps(described).lower()
        if all(w.lower() in text for w in words):
            found.append(layer)
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
    "layers_matching",
    "torch_ops_left",
]
