"""Compile settings of the ``torch_tensorrt_dist`` backend: one dataclass, defaults in one place."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from torch_tensorrt_dist.engines import BACKEND_ENGINES, CPU_GEMMS
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.validation import check_known_options

__all__ = [
    "COLLECTIVE_IMPLS",
    "CPU_GEMMS",
    "ENGINES",
    "ENV_COLLECTIVE_IMPL",
    "CompileSettings",
]


ENGINES = BACKEND_ENGINES
COLLECTIVE_IMPLS = ("auto", "native", "plugin", "torch_nccl")
#: overrides ``collective_impl`` when set (the settings value wins if given explicitly)
ENV_COLLECTIVE_IMPL = "TORCH_TENSORRT_DIST_COLLECTIVE_IMPL"


@dataclass(frozen=True)
class CompileSettings:
    """Options of ``torch.compile(..., backend="torch_tensorrt_dist", options={...})``."""

    #: what runs the lowered graph: ``tensorrt`` (Torch-TensorRT, one engine per rank; an error
    #: where it is not installed), ``inductor`` (Inductor; collectives through c10d) or
    #: ``eager`` (the lowered FX graph as is: the reference)
    engine: str = "tensorrt"
    #: TensorRT collective layers: ``native`` DistCollective (TensorRT >= 10.16), ``plugin``
    #: (TensorRT-LLM NCCL plugins, needs an MPI launch), ``torch_nccl`` (our plugins, csrc/, on
    #: torch's NCCL communicators) or ``auto`` (native, then torch_nccl, then plugin)
    collective_impl: str = "auto"
    #: explicit path of ``libnvinfer_plugin_tensorrt_llm.so`` (else searched)
    plugin_path: str | None = None
    #: raise if a collective cannot be fused into a typed op (instead of leaving it and warning)
    strict: bool = False
    #: compare the collective sequence of the ranks of each group before the first run
    check_schedule: bool = True
    #: seconds the schedule check (and the ``verify`` verdict exchange) waits for the other ranks
    schedule_timeout_s: float = 120.0
    #: check each compiled graph's first call against the eager run of the same lowered graph
    #: (collectives through c10d) and raise ``VerificationError`` on every rank of its groups
    #: on a mismatch; ``None``: on for ``engine="tensorrt"``, off for the others. Costs one
    #: eager run (and a copy of the inputs the graph writes in place) on the first call only
    verify: bool | None = None
    #: relative tolerance of floating outputs for ``verify`` (default: per dtype, see
    #: ``backend/compare.py``; integer and bool outputs are always compared exactly)
    verify_tolerance: float | None = None
    #: Torch-TensorRT ``CompilationSettings`` fields (e.g. ``use_fp32_acc``, ``workspace_size``,
    #: ``cache_built_engines``); an unknown key is a ConfigError listing the valid ones
    torch_tensorrt_options: Mapping[str, Any] = field(default_factory=dict)
    #: the Inductor engine's matrix products on CPU: ``aten`` (ATen's, MKL) or ``reduce``: each
    #: product with a row-major float32 weight as a vectorized reduction
    #: (``backend/row_products.py``: for steps of few rows, bound by reading the weights)
    cpu_gemm: str = "aten"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"engine={self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.collective_impl not in COLLECTIVE_IMPLS:
            raise ConfigError(
                f"collective_impl={self.collective_impl!r} is not one of "
                f"{', '.join(COLLECTIVE_IMPLS)}"
            )
        if self.cpu_gemm not in CPU_GEMMS:
            raise ConfigError(f"cpu_gemm={self.cpu_gemm!r} is not one of {', '.join(CPU_GEMMS)}")
        if self.cpu_gemm != "aten" and self.engine != "inductor":
            raise ConfigError(
                f"cpu_gemm={self.cpu_gemm!r} applies to engine='inductor' only (engine="
                f"{self.engine!r}); leave it at 'aten'"
            )
        if self.schedule_timeout_s <= 0:
            raise ConfigError(f"schedule_timeout_s must be > 0, got {self.schedule_timeout_s}")
        if self.verify_tolerance is not None and not 0 < self.verify_tolerance < 1:
            raise ConfigError(
                f"verify_tolerance must be in (0, 1) (a relative tolerance), got "
                f"{self.verify_tolerance}"
            )

    @property
    def verify_enabled(self) -> bool:
        """Whether ``verify`` applies: its value, or (``None``) whether the engine is TensorRT."""
        return self.engine == "tensorrt" if self.verify is None else bool(self.verify)

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None) -> CompileSettings:
        """Settings from a ``torch.compile`` options dict; unknown keys are an error."""
        options = dict(options or {})
        check_known_options(options, {f.name for f in fields(cls)}, "torch_tensorrt_dist option")
        if "collective_impl" not in options and os.environ.get(ENV_COLLECTIVE_IMPL):
            options["collective_impl"] = os.environ[ENV_COLLECTIVE_IMPL].strip().lower()
        return cls(**options)

    def with_(self, **changes: Any) -> CompileSettings:
        return replace(self, **changes)
