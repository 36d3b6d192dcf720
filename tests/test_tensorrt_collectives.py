"""Real TensorRT engines with collective layers, compared with the eager (c10d) reference.

Tiers: ``tensorrt`` + ``gpu`` (one GPU: every op at world size 1), ``tensorrt`` + ``multigpu``
(2 GPUs: every op in fp32/fp16/bf16; a TP MLP that must build exactly one engine per rank;
4 GPUs: TP inside DP). They skip with the reason where TensorRT or the GPUs are absent; the
collective implementation is the one ``auto`` picks (set TORCH_TENSORRT_DIST_COLLECTIVE_IMPL
to force one; ``plugin`` needs the MPI launch described in docs/conversion.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_tensorrt_dist.testing import run_on_ranks

OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
DTYPES = {
    "float32": (torch.float32, 1e-5),
    "float16": (torch.float16, 1e-2),
    "bfloat16": (torch.bfloat16, 3e-2),
}


def _collective(op: str, x: torch.Tensor, group: Any, first_rank: int) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    if op == "all_reduce":
        return funcol.all_reduce(x, "sum", group)
    if op == "all_gather":
        return funcol.all_gather_tensor(x, 0, group)
    if op == "reduce_scatter":
        return funcol.reduce_scatter_tensor(x, "sum", 0, group)
    if op == "all_to_all":
        return funcol.all_to_all_single(x, None, None, group)
    return funcol.broadcast(x, first_rank, group)


def _compile(fn: Any, settings: Any) -> tuple[Any, list[Any]]:
    """torch.compile through AOTAutograd, our lowering and ``compile_tensorrt``; also returns
    the GraphModules holding the engines (one per Dynamo graph)."""
    from torch._dynamo.backends.common import aot_autograd

    from torch_tensorrt_dist.backend import lower_graph
    from torch_tensorrt_dist.conversion.engine import compile_tensorrt, decompositions

    built: list[Any] = []

    def fw(gm: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        lower_graph(gm, settings)
        boxed = compile_tensorrt(gm, inputs, settings)
        built.append(boxed.trt_module)  # type: ignore[attr-defined]
        return boxed

    backend = aot_autograd(
        fw_compiler=fw, inference_compiler=fw, decompositions=decompositions(settings)
    )
    return torch.compile(fn, backend=backend, fullgraph=True), built


def _engines(module: Any) -> list[Any]:
    from torch_tensorrt.dynamo.runtime import TorchTensorRTModule

    kinds: tuple[type, ...] = (TorchTensorRTModule,)
    try:
        from torch_tensorrt.dynamo.runtime import PythonTorchTensorRTModule

        kinds += (PythonTorchTensorRTModule,)
    except ImportError:
        pass
    return [m for m in module.modules() if isinstance(m, kinds)]


def _typed_ops_left(module: Any) -> int:
    from torch_tensorrt_dist.ops import COLLECTIVE_OPS

    targets = set(COLLECTIVE_OPS.values())
    return sum(1 for n in module.graph.nodes if n.op == "call_function" and n.target in targets)


def _op_case(rank: int, world: int, op: str, dtype_name: str) -> dict[str, Any]:
    import torch.distributed as dist

    from torch_tensorrt_dist import CompileSettings

    torch.cuda.set_device(rank)
    dtype, tol = DTYPES[dtype_name]
    group = dist.group.WORLD

    def fn(x: torch.Tensor) -> torch.Tensor:
        return _collective(op, x * 2.0, group, 0) + 1.0

    torch.manual_seed(rank)
    x = torch.randn(4 * world, 16, device="cuda", dtype=dtype)
    expected = fn(x)
    compiled, built = _compile(fn, CompileSettings(engine="tensorrt"))
    actual = compiled(x)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
    return {
        "graphs": len(built),
        "engines": sum(len(_engines(m)) for m in built),
        "left": sum(_typed_ops_left(m) for m in built),
    }


@pytest.mark.tensorrt
@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_engine_at_world_size_one(op: str) -> None:
    (result,) = run_on_ranks(_op_case, 1, op, "float16", backend="nccl", timeout=600)
    assert result["graphs"] == 1 and result["engines"] == 1 and result["left"] == 0


@pytest.mark.tensorrt
@pytest.mark.multigpu
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
def test_engine_per_op_on_two_gpus(op: str, dtype_name: str) -> None:
    from torch_tensorrt_dist.conversion import conversion_decision

    results = run_on_ranks(_op_case, 2, op, dtype_name, backend="nccl", timeout=600)
    ok, reason = conversion_decision(op, dtype_name, [0, 1], impl="auto", reduce_op="sum", src=0)
    for result in results:
        assert result["graphs"] == 1
        # converted: the collective is inside the one engine; else it stays in PyTorch (reason)
        assert result["left"] == (0 if ok else 1), reason
        assert result["engines"] == (1 if ok else 2), reason


def _tp_mlp_case(rank: int, world: int, dp: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from torch_tensorrt_dist import CompileSettings

    torch.cuda.set_device(rank)
    tp = world // dp
    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    mlp = mlp.cuda().eval()
    torch.manual_seed(100 + rank // tp)  # each DP replica its own batch
    x = torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        expected = mlp(x)
        parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        compiled, built = _compile(mlp, CompileSettings(engine="tensorrt"))
        actual = compiled(x)
    torch.testing.assert_close(actual, expected, atol=1e-3, rtol=1e-3)
    return {
        "graphs": len(built),
        "engines": sum(len(_engines(m)) for m in built),
        "left": sum(_typed_ops_left(m) for m in built),
    }


@pytest.mark.tensorrt
@pytest.mark.multigpu
def test_tp_mlp_builds_exactly_one_engine_per_rank() -> None:
    for result in run_on_ranks(_tp_mlp_case, 2, 1, backend="nccl", timeout=600):
        assert result == {"graphs": 1, "engines": 1, "left": 0}


@pytest.mark.tensorrt
@pytest.mark.multigpu
def test_tp_inside_dp_on_four_gpus() -> None:
    if torch.cuda.device_count() < 4:
        pytest.skip(f"needs 4 CUDA GPUs, found {torch.cuda.device_count()}")
    for result in run_on_ranks(_tp_mlp_case, 4, 2, backend="nccl", timeout=600):
        assert result == {"graphs": 1, "engines": 1, "left": 0}


def _fresh_groups_case(rank: int, world: int) -> dict[str, Any]:
    """Two compiled graphs on two different groups, each created just before compiling and
    never used eagerly: nothing but our first-call binding creates their communicators, and
    compiling the second graph must not re-pin the first graph's engines."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from torch_tensorrt_dist import CompileSettings

    torch.cuda.set_device(rank)
    half = world // 2
    rows = [list(range(i * half, (i + 1) * half)) for i in range(2)]  # [[0, 1], [2, 3]]
    cols = [list(range(i, world, half)) for i in range(half)]  # [[0, 2], [1, 3]]
    row_groups = [dist.new_group(r) for r in rows]
    col_groups = [dist.new_group(c) for c in cols]
    row = row_groups[rank // half]
    col = col_groups[rank % half]

    def on_rows(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2.0, "sum", row) + 1.0

    def on_cols(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 3.0, "sum", col) - 1.0

    settings = CompileSettings(engine="tensorrt")
    first, _ = _compile(on_rows, settings)
    second, _ = _compile(on_cols, settings)
    x = torch.full((4, 8), float(rank + 1), device="cuda")
    got_rows = first(x)  # first call: binds the row group's communicator
    got_cols = second(x)
    again_rows = first(x)  # after the other graph was compiled and run
    row_sum = sum(r + 1 for r in rows[rank // half])
    col_sum = sum(r + 1 for r in cols[rank % half])
    return {
        "rows": (got_rows == 2.0 * row_sum + 1.0).all().item(),
        "cols": (got_cols == 3.0 * col_sum - 1.0).all().item(),
        "rows_again": (again_rows == 2.0 * row_sum + 1.0).all().item(),
    }


@pytest.mark.tensorrt
@pytest.mark.multigpu
def test_first_call_binds_fresh_groups_and_each_graph_keeps_its_group() -> None:
    if torch.cuda.device_count() < 4:
        pytest.skip(f"needs 4 CUDA GPUs, found {torch.cuda.device_count()}")
    for result in run_on_ranks(_fresh_groups_case, 4, backend="nccl", timeout=600):
        assert result == {"rows": True, "cols": True, "rows_again": True}
