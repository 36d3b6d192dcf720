"""The Inductor engine's CPU matrix products by Inductor's C++ GEMM template
(``CompileSettings.cpu_gemm="template"``, or ``"auto"``: the template where a graph's products
all take it, ATen's elsewhere).

    also = gemm_weights(real_inputs)                       # the 2-D float parameters
    keep = freeze_inputs(aten_gm, inputs, real_inputs, also=also)   # constants of the graph
    compiled = compile_gemms(compile_fx_inner, aten_gm, inputs, fallback=auto)

Why: on the bench checkpoint's decode step (one thread, this AMD EPYC) ATen's matmuls (MKL)
read the weights at about 9 GB/s at one row, and an 8-row product costs 2.5x a 1-row one; the
template packs each weight at compile time and runs its own vectorized micro-kernels: the step
took 1.84-2.17 ms against 3.15-4.06 at 1 row and 4.12-4.32 against 4.67-5.03 at 8, the same
greedy tokens. Where many rows or long prompt chunks run it is slower than ATen (prefill about
1.4x, 32 streaming clients 0.7x the tokens/s): an option, not the default
(docs/performance.md).

How: the template applies only to a constant second operand (a "module buffer" of the graph).
The weights Dynamo hands the backend as inputs are made constants of the aten graph
(``lowering/freeze_constants.py``: the module's own tensors, no copy; the compiled callable
drops those inputs), and the compile runs with Inductor's GEMM autotuning restricted to the
template. Offered ATen's kernel too, the autotuner (timing each choice with the weights in
cache) picks ATen's, and the gain is lost; so the template is chosen, not autotuned, and a
graph with a product it cannot take (a non-constant or dynamically sized N or K operand) fails
to compile, saying to use ``cpu_gemm="aten"``; with ``"auto"`` that graph compiles with ATen's
products instead (a product of two activations, a weight computed in the graph).
Which graphs get the template is the caller's choice: the generator gives it to the decode
steps of few rows only (``generation/generate.py``, ``TEMPLATE_ROWS``).

Costs: each shape's first compile takes 3-6x longer, and the packed copy of a weight lives
beside the module's own (the module keeps its parameters for every other graph).
Parameters only: buffers (a KV cache the graph writes) stay inputs.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["compile_gemms", "gemm_weights"]

logger = logging.getLogger(__name__)

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def gemm_weights(real_inputs: Sequence[Any]) -> list[int]:
    """Positions of the graph inputs the template can take as constant weights: 2-D floating
    ``nn.Parameter``s on the CPU."""
    return [
        i
        for i, t in enumerate(real_inputs)
        if isinstance(t, torch.nn.Parameter)
        and t.dim() == 2
        and t.dtype in _FLOATS
        and t.device.type == "cpu"
    ]


def compile_gemms(
    compile_graph: Callable[[fx.GraphModule, Sequence[Any]], Any],
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fallback: bool,
) -> Any:
    """``compile_graph(gm, example_inputs)`` (Inductor's ``compile_fx_inner``) with the graph's
    matrix products on the C++ GEMM template. A product the template cannot take: with
    ``fallback`` (``cpu_gemm="auto"``) the graph is compiled with ATen's products instead (one
    log line says so); without, a ConfigError naming ``aten``."""
    # Inductor's post-grad passes rewrite the graph they compile: a trial that may fall back
    # gets a copy of the graph (the module's constants are shared, not copied)
    trial = fx.GraphModule(gm, copy.deepcopy(gm.graph)) if fallback else gm
    with _real_constants(example_inputs):
        try:
            with _template_only():
                return compile_graph(trial, example_inputs)
        except Exception as exc:
            if not _no_choice(exc):
                raise
            if not fallback:
                raise ConfigError(
                    "cpu_gemm='template': Inductor's C++ GEMM template cannot take a matrix "
                    "product of this graph (its second operand is not a constant weight, or N "
                    "or K is dynamic); compile it with cpu_gemm='aten' (or 'auto': the template "
                    "where it applies)"
                ) from exc
        logger.info(
            "cpu_gemm='auto': the C++ GEMM template cannot take a matrix product of this graph "
            "(a non-constant operand, or N or K dynamic); its products run on ATen's"
        )
        return compile_graph(gm, example_inputs)


def _real_constants(example_inputs: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
    """The graph's constants are real tensors among fake inputs: the inputs' fake mode
    accepts them for the block, as Inductor's own freezing does around the same call."""
    from unittest import mock

    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(example_inputs)
    if fake_mode is None:
        return contextlib.nullcontext()
    return mock.patch.object(fake_mode, "allow_non_fake_inputs", True)


def _template_only() -> contextlib.AbstractContextManager[Any]:
    """Inductor's GEMM lowering restricted to its C++ template (chosen, not autotuned
    against ATen's: see the module)."""
    from torch._inductor import config

    changes: dict[str, Any] = {
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": "CPP",
        "cpp.weight_prepack": True,
    }
    return config.patch(changes)


def _no_choice(exc: BaseException) -> bool:
    """Whether Inductor's "no GEMM choice" error is ``exc`` or what it wraps (Inductor raises
    it inside a lowering, wrapped in ``LoweringException`` and ``InductorError``)."""
    from torch._inductor.select_algorithm import NoValidChoicesError

    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, NoValidChoicesError):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return "NoValidChoicesError" in str(exc)  # the wrappers keep its name in their message
