"""The ``torch_tensorrt_dist`` Dynamo backend: AOTAutograd capture, lowering, checks, engine.

    torch.compile(model, backend="torch_tensorrt_dist", options={"engine": "inductor"})

Every graph Dynamo hands over is traced to aten by AOTAutograd (DTensor redistributions become
``_c10d_functional`` collectives there), lowered by :func:`fuse_collectives`, recorded for
reports, and handed to the engine. Inference only: the typed collectives have no autograd.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import fx
from torch._dynamo.backends.common import aot_autograd

from torch_tensorrt_dist._registration import BACKEND_NAME
from torch_tensorrt_dist.backend.engines import build_engine, engine_decompositions
from torch_tensorrt_dist.backend.module_names import ModuleNamer
from torch_tensorrt_dist.backend.report import (
    GraphReport,
    ModuleResolver,
    collectives_in,
    engines_in,
    paged_ops_in,
    torch_ops_in,
)
from torch_tensorrt_dist.backend.schedule_check import with_schedule_check
from torch_tensorrt_dist.backend.settings import CompileSettings
from torch_tensorrt_dist.backend.verify import reference_graph, with_verification
from torch_tensorrt_dist.errors import UnsupportedCollectiveError
from torch_tensorrt_dist.lowering import fuse_collectives, fusion_report
from torch_tensorrt_dist.lowering.freeze_constants import (
    drop_frozen,
    freeze_inputs,
    frozen_indices,
)
from torch_tensorrt_dist.lowering.input_writes import input_writes, reinplace_input_writes

__all__ = [
    "BACKEND_NAME",
    "lower_graph",
    "recording",
    "running_unit",
    "torch_tensorrt_dist_backend",
]

logger = logging.getLogger(__name__)


@dataclass
class _Recorder:
    reports: list[GraphReport] = field(default_factory=list)
    namer: ModuleNamer | None = None


_recorders: list[_Recorder] = []

#: the compile unit running now (``explain`` sets it around each per-block unit)
_unit: contextvars.ContextVar[str] = contextvars.ContextVar("torch_tensorrt_dist_unit", default="")


@contextlib.contextmanager
def recording(namer: ModuleNamer | None = None) -> Iterator[list[GraphReport]]:
    """Collect a :class:`GraphReport` for every graph the backend lowers inside the block.

    Each recorded graph counts its runs (``GraphReport.runs``, per unit in ``units``). With a
    ``namer``, collectives name their modules as ``namer.root.named_modules()`` does.
    """
    recorder = _Recorder(namer=namer)
    _recorders.append(recorder)
    try:
        yield recorder.reports
    finally:
        _recorders.remove(recorder)


@contextlib.contextmanager
def running_unit(name: str) -> Iterator[None]:
    """Attribute the graph runs inside the block to the compile unit ``name``."""
    token = _unit.set(name)
    try:
        yield
    finally:
        _unit.reset(token)


def _resolver(gm: fx.GraphModule) -> ModuleResolver | None:
    """How to name modules in a Dynamo graph, where a recording asked for names."""
    namer = next((r.namer for r in reversed(_recorders) if r.namer is not None), None)
    if namer is None:
        return None
    roots = namer.roots(gm)
    return lambda path: namer.resolve(path, roots)


def _counting(run: Callable[..., Any], report: GraphReport) -> Callable[..., Any]:
    """Wrap a boxed engine callable so each run is counted in ``report`` (and its unit)."""

    def counted_run(args: list[Any]) -> Any:
        report.runs += 1
        unit = _unit.get()
        report.units[unit] = report.units.get(unit, 0) + 1
        return run(args)

    counted_run._boxed_call = True  # type: ignore[attr-defined]
    return counted_run


def lower_graph(
    gm: fx.GraphModule, settings: CompileSettings, resolve: ModuleResolver | None = None
) -> GraphReport:
    """Lower an aten graph in place and describe it (shared by the backend and ``explain``)."""
    start = time.perf_counter()
    fuse_collectives(gm, strict=settings.strict)
    report = GraphReport(
        index=0,
        collectives=collectives_in(gm, resolve),
        unfused=list(fusion_report(gm).unfused),
        num_nodes=len(gm.graph.nodes),
        input_writes=input_writes(gm),
        torch_ops=_torch_ops(gm, settings, resolve),
    )
    if settings.engine == "tensorrt" or _recorders:  # what a TensorRT build makes of it
        report.engines = engines_in(gm, report.torch_ops)
        report.paged = paged_ops_in(gm)
    report.lowering_s = time.perf_counter() - start
    if report.unfused and settings.engine == "tensorrt":
        raise UnsupportedCollectiveError(
            "collectives the TensorRT engine cannot take were left in the graph: "
            + "; ".join(reason for _, reason in report.unfused)
        )
    for recorder in _recorders:
        report.index = len(recorder.reports)
        recorder.reports.append(report)
    return report


def _torch_ops(
    gm: fx.GraphModule, settings: CompileSettings, resolve: ModuleResolver | None
) -> list[Any]:
    """The ops a TensorRT engine leaves to PyTorch. This asks the installed TensorRT and GPU
    (``moe_layer_environment``), so only for a TensorRT engine or a recorded report (explain,
    which traces with the eager engine and asks what TensorRT would do, weights frozen); never
    on a plain inductor or eager compile."""
    tensorrt = settings.engine == "tensorrt"
    if not (tensorrt or _recorders):
        return []
    return torch_ops_in(gm, resolve, require_constants=tensorrt)


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
    resolve = _resolver(gm)
    recorded = bool(_recorders)
    trt_freeze = settings.engine == "tensorrt"

    def fw_compiler(aten_gm: fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., Any]:
        # TensorRT dequantizes constant weights only, and IMoELayer takes constant experts:
        # quantized codes and scales, and the weights of experts that become IMoELayer, turn
        # into constants of the graph; the callable drops those inputs (lowering/freeze_constants)
        also: list[int] | None = None
        if trt_freeze:
            from torch_tensorrt_dist.conversion.layers.moe_experts import frozen_expert_inputs

            also = frozen_expert_inputs(aten_gm)
        if also is not None:  # and the quantized codes and scales marked for freezing
            also = sorted(set(also) | set(frozen_indices(example_inputs)))
        if not also:
            engine, _, report = build(aten_gm, inputs, example_inputs, None)
            return _counted(engine, report)
        spare = fx.GraphModule(aten_gm, copy.deepcopy(aten_gm.graph))  # before any pass
        # a rebuild runs inside a later call: in this compile's tracing context (what
        # AOTAutograd knows of the graph: its input mutations, paged_kv.mutation_outputs)
        # and grad modes, as this build does
        context = torch._guards.TracingContext.try_get()
        modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        engine, keep, report = build(aten_gm, inputs, example_inputs, also)
        if keep is None:
            return _counted(engine, report)

        def rebuild(real: list[Any]) -> Callable[..., Any]:  # other weights, the same code
            gm = fx.GraphModule(spare, copy.deepcopy(spare.graph))
            with (
                torch._guards.tracing(context),
                torch.inference_mode(modes[0]),
                torch.set_grad_enabled(modes[1]),
            ):
                engine, again, _ = build(gm, inputs, real, also)
            if again != keep:
                raise RuntimeError("a graph built again for other weights froze other inputs")
            return engine

        return _counted(drop_frozen(engine, keep, example_inputs, rebuild), report)

    def build(
        aten_gm: fx.GraphModule, inputs: list[Any], real: list[Any], also: list[int] | None
    ) -> tuple[Callable[..., Any], list[int] | None, GraphReport]:
        """The engine of ``aten_gm`` over the inputs that stay inputs (their indices: None
        for all) and its report, the inputs at ``also`` frozen with the tensors of ``real``."""
        keep = None if also is None else freeze_inputs(aten_gm, inputs, real, also=also)
        inputs = inputs if keep is None else [inputs[i] for i in keep]
        report = lower_graph(aten_gm, settings, resolve)
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
        if settings.cpu_gemm == "reduce":  # after the reference: verify checks the rewrite
            from torch_tensorrt_dist.backend.row_products import (
                gemm_weights,
                products_as_reductions,
            )

            products_as_reductions(aten_gm, gemm_weights(real), len(real))
        engine = build_engine(aten_gm, inputs, settings)
        report.engine_module = getattr(engine, "trt_module", None)
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
        return engine, keep, report

    def _counted(engine: Callable[..., Any], report: GraphReport) -> Callable[..., Any]:
        return _counting(engine, report) if recorded else engine

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
