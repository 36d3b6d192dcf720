"""TensorRT engines whose collectives are our torch_nccl plugins, compared with c10d.

Tiers: ``tensorrt`` + ``multigpu``: every op in every dtype at world size 2 and 4, every reduce
op, and one engine holding collectives on two groups (TP all_reduce, then DP all_gather on a
2 x 2 mesh) at world size 4. They also need our plugin library (``torchtrt-dist
build-plugins``). They skip with the reason where TensorRT, the GPUs or the library are absent:
on the machines this project is developed on (no GPU, no TensorRT) they have not run.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.testing import run_on_ranks

from .test_tensorrt_collectives import _collective, _compile, _engines, _typed_ops_left

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
DTYPES = {
    "float32": 1e-5,
    "float16": 1e-2,
    "bfloat16": 3e-2,
    "int8": 0,
    "int32": 0,
    "int64": 0,
}

pytestmark = [pytest.mark.tensorrt, pytest.mark.multigpu]


def _need(world: int) -> None:
    from torch_tensorrt_dist.conversion.impl.torch_nccl.library import find_torch_nccl_library

    if find_torch_nccl_library() is None:
        pytest.skip("our plugin library is not built; run `torchtrt-dist build-plugins`")
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs, found {torch.cuda.device_count()}")


def _settings() -> Any:
    from torch_tensorrt_dist import CompileSettings

    return CompileSettings(engine="tensorrt", collective_impl="torch_nccl")


def _summary(built: list[Any]) -> dict[str, int]:
    return {
        "graphs": len(built),
        "engines": sum(len(_engines(m)) for m in built),
        "left": sum(_typed_ops_left(m) for m in built),
    }


def _op_case(rank: int, world: int, op: str, dtype_name: str, reduce_op: str) -> dict[str, int]:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    torch.cuda.set_device(rank)
    dtype, tol = getattr(torch, dtype_name), DTYPES.get(dtype_name, 1e-5)
    group = dist.group.WORLD

    def fn(x: torch.Tensor) -> torch.Tensor:
        if op in ("all_reduce", "reduce_scatter") and reduce_op != "sum":
            if op == "all_reduce":
                return funcol.all_reduce(x * 2, reduce_op, group) + 1
            return funcol.reduce_scatter_tensor(x * 2, reduce_op, 0, group) + 1
        return _collective(op, x * 2, group, 0) + 1

    torch.manual_seed(rank)
    shape = (4 * world, 16)
    if dtype.is_floating_point:
        x = torch.randn(shape, device="cuda", dtype=dtype)
    else:
        x = torch.randint(-3, 4, shape, device="cuda", dtype=dtype)
    expected = fn(x)
    compiled, built = _compile(fn, _settings())
    actual = compiled(x)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
    return _summary(built)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_every_op_and_dtype(op: str, dtype_name: str, world: int) -> None:
    _need(world)
    for result in run_on_ranks(_op_case, world, op, dtype_name, "sum", backend="nccl", timeout=600):
        assert result == {"graphs": 1, "engines": 1, "left": 0}


@pytest.mark.parametrize("reduce_op", ["product", "max", "min", "avg"])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter"])
def test_every_reduce_op(op: str, reduce_op: str) -> None:
    _need(2)
    for result in run_on_ranks(_op_case, 2, op, "float32", reduce_op, backend="nccl", timeout=600):
        assert result == {"graphs": 1, "engines": 1, "left": 0}


def _two_groups_case(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    from torch_tensorrt_dist.conversion.impl.torch_nccl.library import load_torch_nccl_plugins

    torch.cuda.set_device(rank)
    mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh["tp"].get_group(), mesh["dp"].get_group()

    def fn(x: torch.Tensor) -> torch.Tensor:
        y = funcol.all_reduce(x * 2, "sum", tp)  # the TP group: [0, 1] or [2, 3]
        return funcol.all_gather_tensor(y + 1, 0, dp)  # the DP group: [0, 2] or [1, 3]

    torch.manual_seed(rank)
    x = torch.randn(4, 16, device="cuda")
    expected = fn(x)
    compiled, built = _compile(fn, _settings())
    actual = compiled(x)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    return {**_summary(built), "registered": load_torch_nccl_plugins().count()}


def test_two_groups_in_one_engine() -> None:
    _need(4)
    for result in run_on_ranks(_two_groups_case, 4, backend="nccl", timeout=600):
        # one engine holds both groups' collectives (native DistCollective cannot)
        assert result == {"graphs": 1, "engines": 1, "left": 0, "registered": 2}
