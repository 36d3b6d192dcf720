"""The engines' and the CPU product forms' names, in one leaf module: the backend, the runner and
the CLI's settings take them from here (the backend imports Dynamo, seconds, which a runner of
the ``none`` engine never needs)."""

from __future__ import annotations

__all__ = ["BACKEND_ENGINES", "CPU_GEMMS", "ENGINES"]

#: what runs a graph the ``torch_tensorrt_dist`` backend lowered: ``tensorrt`` (one engine per
#: rank), ``inductor``, ``eager`` (the lowered FX graph as is: the reference)
BACKEND_ENGINES = ("tensorrt", "inductor", "eager")
#: a runner's and a job's engines: the backend's, and ``none`` (the model as plain PyTorch, no
#: torch.compile)
ENGINES = (*BACKEND_ENGINES, "none")
#: the Inductor engine's CPU products (``CompileSettings.cpu_gemm``; the generator picks one)
CPU_GEMMS = ("aten", "reduce")
