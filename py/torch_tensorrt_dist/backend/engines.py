"""Engines: what runs a lowered aten graph on one rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._functorch.aot_autograd import make_boxed_func
from torch._ops import OpOverload

from torch_tensorrt_dist.backend.settings import CompileSettings

__all__ = ["build_engine", "engine_decompositions"]


def engine_decompositions(settings: CompileSettings) -> dict[OpOverload, Callable[..., Any]] | None:
    """Decompositions AOTAutograd applies while tracing for this engine."""
    if settings.engine == "inductor":
        from torch._inductor.decomposition import select_decomp_table

        return dict(select_decomp_table())
    if settings.engine == "tensorrt":
        decompositions = getattr(_tensorrt_module(), "decompositions", None)
        return decompositions(settings) if decompositions is not None else None
    return None


def build_engine(
    gm: fx.GraphModule, example_inputs: list[torch.Tensor], settings: CompileSettings
) -> Callable[..., Any]:
    """A boxed callable (takes the list of inputs) that runs ``gm`` with the chosen engine."""
    if settings.engine == "eager":
        return make_boxed_func(gm.forward)
    if settings.engine == "inductor":
        from torch._inductor.compile_fx import compile_fx_inner

        from torch_tensorrt_dist.backend.kernel_gil import kernels_release_gil
        from torch_tensorrt_dist.lowering.flex_inputs import contiguous_flex_inputs

        contiguous_flex_inputs(gm)  # a torch 2.14 bug of CPU flex attention (see the module)
        with kernels_release_gil():  # other threads run while a kernel does (see the module)
            return compile_fx_inner(gm, example_inputs)
    if settings.engine == "tensorrt":
        return _tensorrt_module().compile_tensorrt(gm, example_inputs, settings)
    raise AssertionError(f"unreachable: engine {settings.engine!r} passed validation")


def _tensorrt_module() -> Any:
    """The TensorRT engine module, or an error that says what to install."""
    from torch_tensorrt_dist.conversion.availability import require_tensorrt_engine

    require_tensorrt_engine()
    from torch_tensorrt_dist.conversion import engine

    return engine
