"""The Inductor engine's CPU matrix products by Inductor's C++ GEMM template
(``CompileSettings.cpu_gemm="template"``).

    also = gemm_weights(real_inputs)                       # the 2-D float parameters
    keep = freeze_inputs(aten_gm, inputs, real_inputs, also=also)   # constants of the graph
    with template_gemms(example_inputs):                   # around compile_fx_inner
        ...

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
to compile, saying to use ``cpu_gemm="aten"``.

Costs: each shape's first compile takes 3-6x longer, and the packed copy of a weight lives
beside the module's own (the module keeps its parameters for every other graph).
Parameters only: buffers (a KV cache the graph writes) stay inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["gemm_weights", "template_gemms"]

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


@contextlib.contextmanager
def template_gemms(example_inputs: Sequence[Any]) -> Iterator[None]:
    """Inductor's GEMM lowering restricted to its C++ template for the block; a graph it
    cannot take is a ConfigError that names the option. The graph's constants are real
    tensors among fake inputs: the inputs' fake mode accepts them for the block, as
    Inductor's own freezing does around the same call."""
    from unittest import mock

    from torch._guards import detect_fake_mode
    from torch._inductor import config

    fake_mode = detect_fake_mode(example_inputs)
    real_constants = (
        mock.patch.object(fake_mode, "allow_non_fake_inputs", True)
        if fake_mode is not None
        else contextlib.nullcontext()
    )
    try:
        changes: dict[str, Any] = {
            "max_autotune_gemm": True,
            "max_autotune_gemm_backends": "CPP",
            "cpp.weight_prepack": True,
        }
        with config.patch(changes), real_constants:
            yield
    except Exception as exc:
        if not _no_choice(exc):
            raise
        raise ConfigError(
            "cpu_gemm='template': Inductor's C++ GEMM template cannot take a matrix product "
            "of this graph (its second operand is not a constant weight, or N or K is "
            "dynamic); compile it with cpu_gemm='aten'"
        ) from exc


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
