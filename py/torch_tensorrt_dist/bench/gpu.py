"""GPU section: TensorRT engine against Inductor at TP 1 and 2, next to the bandwidth limit.

Runs only where CUDA and TensorRT exist; elsewhere it returns one figure saying why it was
skipped, so the table never hides a missing section.
"""

from __future__ import annotations

import importlib.util

import torch

from torch_tensorrt_dist.bench.common import Figure

__all__ = ["bandwidth_limit_ms", "gpu", "skip_reason"]

#: HBM bandwidth (bytes/s) of GPUs we know, by a substring of the device name
HBM_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L40": 0.864e12}


def skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    if (
        importlib.util.find_spec("tensorrt") is None
        or importlib.util.find_spec("torch_tensorrt") is None
    ):
        return (
            "TensorRT / Torch-TensorRT not installed (pip install 'torch_tensorrt_dist[tensorrt]')"
        )
    return None


def bandwidth_limit_ms(weight_bytes: int, tp: int, device_name: str) -> float | None:
    """Lower bound of a batch-1 decode step: every weight read once, split over tp GPUs."""
    for key, bandwidth in HBM_BYTES_PER_S.items():
        if key in device_name:
            return 1e3 * weight_bytes / tp / bandwidth
    return None


def gpu() -> list[Figure]:
    reason = skip_reason()
    if reason is not None:
        return [Figure("GPU", "TensorRT vs Inductor decode", "skipped", note=reason)]
    from torch_tensorrt_dist.bench.common import bench_args
    from torch_tensorrt_dist.bench.decode import _time_decode
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    name = torch.cuda.get_device_name()
    args = bench_args(8, dim=1024, vocab=32000)
    model = random_llama(args, dtype=torch.float16).cuda()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    figures = [Figure("GPU", "device", name)]
    prompt = [1, 17, 33, 5]
    with torch.no_grad():
        for engine in ("inductor", "tensorrt"):
            ms = _time_decode(model, engine, prompt, 64)["ms_per_token"]
            figures.append(Figure("GPU", f"TP 1 {engine}", round(ms, 3), "ms/token"))
    limit = bandwidth_limit_ms(weight_bytes, 1, name)
    figures.append(
        Figure(
            "GPU",
            "TP 1 bandwidth limit",
            round(limit, 4) if limit else "unknown GPU",
            "ms/token",
            note=f"{weight_bytes / 2**20:.0f} MiB of weights",
        )
    )
    figures.append(
        Figure("GPU", "TP 2", "not run", note="needs 2 GPUs: torchtrt-dist run --nproc-per-node 2")
    )
    return figures
