"""The ``torch_tensorrt_dist`` Dynamo backend: AOTAutograd capture, lowering, checks, engine.

    torch.compile(model, backend="torch_tensorrt_dist", options={"engine": "inductor"})

Every graph Dynamo hands over is traced to aten by AOTAutograd (DTensor redistributions become
``_c10d_functional`` collectives there), lowered by :func:`fuse_collectives`, recorded for
reports, and handed to the engine. Inference only: the typed collectives have no autograd.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import fx
from torch._dynamo.backends.common import aot_autograd

from torch_tensorrt_dist._registration import BACKEND_NAME
from torch_tensorrt_dist.backend.engines import build_engine, engine_decompositions
from torch_tensorrt_dist.backend.report import GraphReport, collectives_in, torch_ops_in
from torch_tensorrt_dist.backend.schedule_check import with_schedule_check
from torch_tensorrt_dist.backend.settings import CompileSettings
from torch_tensorrt_dist.backend.verify import reference_graph, with_verification
from torch_tensorrt_dist.errors import UnsupportedCollectiveError
from torch_tensorrt_dist.lowering import fuse_collectives, fusion_report
from torch_tensorrt_dist.lowering.input_writes import input_writes, reinplace_input_writes

__all__ = ["BACKEND_NAME", "lower_graph", "recording", "torch_tensorrt_dist_backend"]

logger = logging.getLogger(__name__)


_recorders: list[list[GraphReport]] = []


@contextlib.contextmanager
def recording() -> Iterator[list[GraphReport]]:
    """Collect a :class:`GraphReport` for every graph the backend lowers inside the block."""
    reports: list[GraphReport] = []
    _recorders.append(reports)
    try:
        yield reports
    finally:
        _recorders.remove(reports)


def lower_graph(gm: fx.GraphModule, settings: CompileSettings) -> GraphReport:
    """Lower an aten graph in place and describe it (shared by the backend and ``explain``)."""
    start = time.perf_counter()
    fuse_collectives(gm, strict=settings.strict)
    report = GraphReport(
        index=0,
        collectives=collectives_in(gm),
        unfused=list(fusion_report(gm).unfused),
        num_nodes=len(gm.graph.nodes),
        input_writes=input_writes(gm),
        torch_ops=torch_ops_in(gm),
    )
    report.lowering_s = time.perf_counter() - start
    if report.unfused and settings.engine == "tensorrt":
        raise UnsupportedCollectiveError(
            "collectives the TensorRT engine cannot take were left in the graph: "
            + "; ".join(reason for _, reason in report.unfused)
        )
    for reports in _recorders:
        report.index = len(reports)
        reports.append(report)
    return report


def _verifies(settings: CompileSettings) -> bool:
    if not settings.verify_enabled:
        return False
    if dist.is_initialized() and dist.get_backend() == "fake":
        logger.debug("verify skipped: the fake process group runs no collectives to compare")
        return False
    return True


def _engine_name(settings: CompileSettings) -> str:
    if settings.engine == "tensorrt":
        return f"tensorrt, collective_impl={settings.collective_impl}"
    return settings.engine


def torch_tensorrt_dist_backend(
    gm: fx.GraphModule,
    example_inputs: list[torch.Tensor],
    *,
    options: Mapping[str, Any] | None = None,
) -> Callable[..., Any]:
    """Dynamo backend entry point (registered as ``"torch_tensorrt_dist"``)."""
    settings = CompileSettings.from_options(options)

    def fw_compiler(aten_gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., Any]:
        report = lower_graph(aten_gm, settings)
        logger.info(
            "graph %d: %d nodes, %d collectives, %d unfused",
            report.index,
            report.num_nodes,
            len(report.collectives),
            len(report.unfused),
        )
        if settings.engine == "eager":
            reinplace_input_writes(aten_gm)  # Inductor does this itself
        reference = reference_graph(aten_gm) if _verifies(settings) else None
        engine = build_engine(aten_gm, inputs, settings)
        if reference is not None:  # inside the schedule check: that runs first
            engine = with_verification(
                engine,
                reference,
                collectives=report.collectives,
                engine=_engine_name(settings),
                timeout_s=settings.schedule_timeout_s,
                tolerance=settings.verify_tolerance,
            )
        if settings.check_schedule:
            # a verified first call issues the graph's collectives twice (reference, engine):
            # ranks that disagree on verify are then a schedule mismatch, not a hang
            issued = report.collectives * (2 if reference is not None else 1)
            engine = with_schedule_check(engine, issued, settings.schedule_timeout_s)
        return engine

    compiler = aot_autograd(
        fw_compiler=fw_compiler,
        inference_compiler=fw_compiler,
        decompositions=engine_decompositions(settings) or {},
        # input writes (a KV cache) stay in the graph as copy_ into the input, which the eager
        # and Inductor engines do in place; Torch-TensorRT traces with AOTAutograd's default
        # (writes returned as outputs), where its KV-cache layer aliases the output to the input
        keep_inference_input_mutations=settings.engine != "tensorrt",
    )
    return compiler(gm, example_inputs)
