"""Test tiers: markers that skip with a reason where the hardware or software is absent."""

from __future__ import annotations

import importlib.util
import platform
import shutil
from pathlib import Path

import pytest
import torch

from torch_tensorrt_dist.testing.multiprocess import use_forkserver


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _tensorrt_reason() -> str | None:
    if not _has("tensorrt"):
        return "TensorRT (the `tensorrt` Python package with libnvinfer) is not installed"
    if not _has("torch_tensorrt"):
        return "Torch-TensorRT is not installed (pip install 'torch_tensorrt_dist[tensorrt]')"
    return None


_SKIPS = {
    "tensorrt": _tensorrt_reason,
    "gpu": lambda: None if torch.cuda.is_available() else "no CUDA GPU in this machine",
    "multigpu": lambda: (
        None
        if torch.cuda.device_count() >= 2
        else f"needs 2+ CUDA GPUs, found {torch.cuda.device_count()}"
    ),
    "mpi": lambda: (
        None
        if shutil.which("mpirun") and _has("mpi4py")
        else "needs Open MPI's mpirun and mpi4py (apt-get install openmpi-bin; pip install mpi4py)"
    ),
    "torchtitan": lambda: (
        None
        if all(_has(m) for m in ("torchtitan", "tyro", "spmd_types"))
        else "needs torchtitan 0.3.0 (pip install --no-deps torchtitan==0.3.0 && "
        "pip install -e '.[torchtitan]')"
    ),
    "transformers": lambda: (
        None
        if _has("transformers") and _has("accelerate")
        else "needs HF transformers and accelerate (pip install -e '.[dev]')"
    ),
}


# The suite runs on two workers, a file per worker at a time (`-n 2 --dist loadfile` in
# pyproject.toml, with --no-loadscope-reorder: else xdist hands out the files with the most tests
# first, whatever this order, and the slowest files, of few tests each, ran last, one worker
# alone at the end). A worker takes the next file when it is done with one, so the files that
# take longest go first. Ordered by each file's total over the 50 slowest tests of a
# --durations run on 2 cores (2026-12-06, 18 min 26 s: 96 s down to 14 s), then files that were
# listed before; the files that were not listed and start processes or compile are placed by
# -n 0 --durations runs of them (2026-12-07, at a load of 12: test_weight_layout 220 s, the
# first Inductor generator of its process, test_registration 129 s, its two interpreters
# compiling, down to test_kv_blocks 22 s): alphabetical, test_weight_* ran last, one worker
# alone. The files after these keep their collected order and take seconds each.
SLOW_FIRST = (
    "test_serve_watchdog.py",
    "test_generate_pp_cli.py",
    "test_pipeline_gloo.py",
    "test_transformers_family.py",
    "test_transformers_tp.py",
    "test_row_products.py",
    "test_clients.py",
    "test_serve_pipeline.py",
    "test_toy_family.py",
    "test_artifacts_inductor.py",
    "test_registration.py",
    "test_rank_errors_cli.py",
    "test_generate_cli.py",
    "test_weight_layout.py",
    "test_quantization.py",
    "test_artifacts_build.py",
    "test_example_simple.py",
    "test_faults.py",
    "test_import_without_tensorrt.py",
    "test_qwen3.py",
    "test_generate_tp.py",
    "test_speculative.py",
    "test_core.py",
    "test_moe_cli.py",
    "test_multirank_numerics.py",
    "test_cpu_gemm.py",
    "test_serve_hostile.py",
    "test_generate_example.py",
    "test_cpu_attention.py",
    "test_step_dispatch.py",
    "test_pipeline_example.py",
    "test_bench.py",
    "test_stream_out.py",
    "test_quantization_tp.py",
    "test_serve_tools.py",
    "test_serve_field_fuzz.py",
    "test_bench_serve.py",
    "test_serve_api.py",
    "test_cli_explain.py",
    "test_serve_fields.py",
    "test_launcher_run.py",
    "test_paged_conversion.py",
    "test_moe_parallel.py",
    "test_huge_pages.py",
    "test_weight_only_conversion.py",
    "test_serve_frontend.py",
    "test_launcher_quiet.py",
    "test_hostile_cli.py",
    "test_serve_failure.py",
    "test_serve_quantize.py",
    "test_serve_liveness.py",
    "test_kv_blocks.py",
)


def _slow_rank(item: pytest.Item) -> int:
    name = item.path.name
    return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)


#: what the rank server imports before it forks ranks (a module that is absent is skipped)
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "transformers.models.llama.modeling_llama",
    "torch_tensorrt_dist.backend",
    "torch_tensorrt_dist.generation.generate",
    "torch_tensorrt_dist.families",
)


#: the CPU features that decide which kernels torch and Inductor pick here
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def cpu_report(cpuinfo: str, thp: str | None) -> str:
    """One header line: the CPU's model, its ISA flags of :data:`ISA_FLAGS`, torch's CPU
    capability and the transparent-huge-page mode (``cpuinfo``: /proc/cpuinfo's text, ``thp``:
    /sys/kernel/mm/transparent_hugepage/enabled's, None where absent)."""
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in cpuinfo.splitlines())
        if value
    )
    model = fields.get("model name") or platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    isa = " ".join(f for f in ISA_FLAGS if f in flags) or "none listed"
    mode = (
        "absent"
        if thp is None
        else next((w.strip("[]") for w in thp.split() if w.startswith("[")), thp.strip())
    )
    capability = torch.backends.cpu.get_cpu_capability()
    return f"cpu: {model}; isa: {isa}; torch cpu capability: {capability}; thp: {mode}"


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def pytest_report_header(config: pytest.Config) -> str:
    """What the results depend on: the CPU's kernels (Inductor's C++ code, ATen's ISA) and
    whether CPU weights move into huge pages (``runtime/huge_pages.py``)."""
    return cpu_report(
        _read("/proc/cpuinfo") or "", _read("/sys/kernel/mm/transparent_hugepage/enabled")
    )


def pytest_configure(config: pytest.Config) -> None:
    # run_on_ranks forks its ranks from a server that imported torch once (started at a
    # worker's first spawn): a fresh interpreter per rank cost seconds of CPU each, about 35
    # spawns of 2-4 ranks in the suite; it also imports once what the ranks import (Dynamo,
    # Inductor, transformers' modelling, the package: about 3-5 s of CPU a rank; a spawn of 2
    # ranks at a load of 5, 21 s -> 0.3 s); a rank that must start without them asks for a
    # fresh interpreter (run_on_ranks(..., fresh=True))
    use_forkserver(PRELOAD)
    # the openai client's models build the pydantic schema of their base class at its first
    # use, and pydantic's rebuild is not thread-safe: two test threads parsing their first
    # responses together failed with "type object 'BaseModel' has no attribute
    # '__pydantic_core_schema__'" (test_qwen3's concurrent requests); built once here
    if _has("openai"):
        from openai import BaseModel

        BaseModel.model_rebuild()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a stable sort: the order inside a file, and of the files not listed, stays as collected
    items.sort(key=_slow_rank)
    reasons = {name: check() for name, check in _SKIPS.items()}
    for item in items:
        for name, reason in reasons.items():
            # the marker, not a keyword: keywords also hold folder names (a checkout in a
            # folder named "torchtitan" would match every test)
            if reason and item.get_closest_marker(name) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
