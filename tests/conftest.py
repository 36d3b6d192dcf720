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
# take longest go first: every file of 4 s or more, by its setup + call + teardown total in a
# --durations=0 run of the whole suite on 2 cores (2026-12-07 09:17, 10 min 25 s, one thread a
# worker: 125 s down to 4 s). The files after these keep their collected order and take under
# 4 s each.
SLOW_FIRST = (
    "test_row_products.py",  # 125 s
    "test_artifacts_inductor.py",  # 57 s
    "test_serve_watchdog.py",  # 57 s
    "test_serve_pipeline.py",  # 54 s
    "test_transformers_family.py",  # 47 s
    "test_launcher_run.py",  # 39 s
    "test_generate_tp.py",  # 38 s
    "test_serve_hostile.py",  # 36 s
    "test_pipeline_gloo.py",  # 35 s
    "test_generate_pp_cli.py",  # 35 s
    "test_clients.py",  # 35 s
    "test_faults.py",  # 34 s
    "test_serve_fields.py",  # 34 s
    "test_serve_tools.py",  # 31 s
    "test_speculative.py",  # 28 s
    "test_paged_conversion.py",  # 27 s
    "test_qwen3.py",  # 26 s
    "test_transformers_tp.py",  # 26 s
    "test_moe_cli.py",  # 24 s
    "test_example_simple.py",  # 21 s
    "test_cpu_gemm.py",  # 19 s
    "test_serve_api.py",  # 18 s
    "test_cli_explain.py",  # 15 s
    "test_core.py",  # 15 s
    "test_stream_out.py",  # 14 s
    "test_generate_example.py",  # 13 s
    "test_bench_serve.py",  # 12 s
    "test_serve_frontend.py",  # 12 s
    "test_step_dispatch.py",  # 12 s
    "test_import_without_tensorrt.py",  # 12 s
    "test_multirank_numerics.py",  # 12 s
    "test_generate_cli.py",  # 12 s
    "test_toy_family.py",  # 11 s
    "test_input_writes.py",  # 11 s
    "test_pipeline_example.py",  # 11 s
    "test_quantization_tp.py",  # 11 s
    "test_cpu_attention.py",  # 10 s
    "test_serve_failure.py",  # 10 s
    "test_fake_pg_capture.py",  # 9 s
    "test_quantization.py",  # 9 s
    "test_moe_parallel.py",  # 8 s
    "test_registration.py",  # 7 s
    "test_bench.py",  # 7 s
    "test_schedule_check.py",  # 7 s
    "test_artifacts_build.py",  # 7 s
    "test_rank_errors_cli.py",  # 7 s
    "test_pipeline_stage.py",  # 6 s
    "test_huge_pages.py",  # 5 s
    "test_moe_model.py",  # 5 s
    "test_runtime_distributed.py",  # 5 s
    "test_dynamic_conversion.py",  # 5 s
    "test_hostile_cli.py",  # 5 s
    "test_weight_only_conversion.py",  # 4 s
    "test_llama_tp.py",  # 4 s
    "test_serve_field_fuzz.py",  # 4 s
    "test_core_sampling.py",  # 4 s
    "test_serve_liveness.py",  # 4 s
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
    "transformers.models.qwen3.modeling_qwen3",
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
    # one intra-op thread in the test process, as a launched rank on a machine of few cores
    # runs: the suite's two workers on two cores each ran two OpenMP threads, and a busy
    # thread's partner spin-waits (a TP 1 generate of the demo model 0.24-0.45 s on one thread
    # against 5.8-8.6 s on two, load 6). Tests of several threads set their count themselves.
    torch.set_num_threads(1)
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
