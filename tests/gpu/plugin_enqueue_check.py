"""Run our collective plugins' ``enqueue`` on a real GPU, without TensorRT, against torch.

For a machine with one CUDA GPU and any recent torch (it may not be the 2.14 this project pins;
the script imports nothing from torch_tensorrt_dist, so a different torch is fine):

    python tests/gpu/plugin_enqueue_check.py                      # library from build-plugins
    python tests/gpu/plugin_enqueue_check.py --library PATH.so    # a library built elsewhere
    python tests/gpu/plugin_enqueue_check.py --build --tensorrt-include DIR   # build it first

It creates a one-rank NCCL process group through torch, registers torch's communicator with
the library (``ProcessGroupNCCL._comm_ptr()``), creates each plugin through its creator in
TensorRT's runtime phase and calls its ``enqueue`` on CUDA tensors (``ttd_run_plugin``), for
every op, dtype and reduce op, and compares the output with torch's own c10d collective on the
same group. Then it checks the failures: enqueue with no registered communicator, and with the
communicator of a group of another size. Prints one line per case, writes
``$OUT/plugin_enqueue_check.json`` when ``$OUT`` is set, and exits 1 on any mismatch.

This is a manual check (pytest does not collect it); it needs a GPU, so it has not run on the
CPU-only machines this project is developed on.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist

LIB_NAME = "libtorchtrt_dist_plugins.so"
OPS = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "all_to_all": 3, "broadcast": 4}
REDUCE = {"sum": 0, "product": 1, "max": 2, "min": 3, "avg": 4}
#: torch dtype name -> nvinfer1::DataType number
DTYPES = {
    "float32": 0,
    "float16": 1,
    "int8": 2,
    "int32": 3,
    "uint8": 5,
    "float8_e4m3fn": 6,
    "bfloat16": 7,
    "int64": 8,
}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _default_library() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    explicit = os.environ.get("TORCH_TENSORRT_DIST_PLUGINS_LIB")
    if explicit:
        return os.path.join(explicit, LIB_NAME) if os.path.isdir(explicit) else explicit
    return os.path.join(cache, "torch_tensorrt_dist", "plugins", LIB_NAME)


def _build(args: argparse.Namespace) -> str:
    command = [sys.executable, "-m", "torch_tensorrt_dist", "build-plugins"]
    for flag in ("tensorrt_include", "cuda_include", "nccl_include"):
        if getattr(args, flag):
            command += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "py")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"build-plugins failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def _load(path: str) -> Any:
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    lib.ttd_last_error.restype = ctypes.c_char_p
    lib.ttd_nccl_version.restype = ctypes.c_int32
    lib.ttd_register_communicator.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p]
    lib.ttd_unregister_communicator.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.ttd_run_plugin.restype = ctypes.c_int32
    lib.ttd_run_plugin.argtypes = [ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32]
    lib.ttd_run_plugin.argtypes += [ctypes.c_int32] * 3
    lib.ttd_run_plugin.argtypes += [ctypes.c_void_p, ctypes.c_int32] + [ctypes.c_void_p] * 3
    return lib


def _ranks(ranks: list[int]) -> tuple[Any, int]:
    return (ctypes.c_int32 * len(ranks))(*ranks), len(ranks)


def _run(
    lib: Any,
    op: str,
    dtype: str,
    ranks: list[int],
    x: torch.Tensor,
    out: torch.Tensor,
    reduce_op: str = "sum",
    root: int = 0,
) -> int:
    array, n = _ranks(ranks)
    dims = (ctypes.c_int64 * x.dim())(*x.shape)
    stream = torch.cuda.current_stream().cuda_stream
    return int(
        lib.ttd_run_plugin(
            OPS[op],
            array,
            n,
            DTYPES[dtype],
            REDUCE[reduce_op],
            root,
            dims,
            x.dim(),
            x.data_ptr(),
            out.data_ptr(),
            stream,
        )
    )


def _input(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, device="cuda").to(dtype)
    low, high = (0, 100) if dtype == torch.uint8 else (-50, 50)
    return torch.randint(low, high, shape, device="cuda", dtype=dtype)


def _reference(op: str, x: torch.Tensor, reduce_op: str, group: Any) -> torch.Tensor | None:
    """torch's c10d collective on the same group (None where c10d has none for this dtype)."""
    ops = {
        "sum": dist.ReduceOp.SUM,
        "product": dist.ReduceOp.PRODUCT,
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "avg": dist.ReduceOp.AVG,
    }
    n = dist.get_world_size(group)
    try:
        if op == "all_reduce":
            y = x.clone()
            dist.all_reduce(y, op=ops[reduce_op], group=group)
        elif op == "all_gather":
            y = x.new_empty((x.shape[0] * n, *x.shape[1:]))
            dist.all_gather_into_tensor(y, x, group=group)
        elif op == "reduce_scatter":
            y = x.new_empty((x.shape[0] // n, *x.shape[1:]))
            dist.reduce_scatter_tensor(y, x, op=ops[reduce_op], group=group)
        elif op == "all_to_all":
            y = torch.empty_like(x)
            dist.all_to_all_single(y, x, group=group)
        else:
            y = x.clone()
            dist.broadcast(y, src=0, group=group)
    except (RuntimeError, TypeError, ValueError):
        return None
    torch.cuda.synchronize()
    return y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", default=None, help=f"path of {LIB_NAME}")
    parser.add_argument("--build", action="store_true", help="run build-plugins first")
    parser.add_argument("--tensorrt-include")
    parser.add_argument("--cuda-include")
    parser.add_argument("--nccl-include")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check")
        return 2
    path = _build(args) if args.build else (args.library or _default_library())
    if not os.path.isfile(path):
        sys.exit(f"{path} does not exist; pass --library or --build")
    torch.cuda.set_device(0)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    lib = _load(path)
    nccl = int(lib.ttd_nccl_version())
    print(f"torch {torch.__version__}, NCCL (as the plugins resolve it) {nccl}, library {path}")
    group = dist.group.WORLD
    warm = torch.zeros(1, device="cuda")
    dist.all_reduce(warm, group=group)  # torch creates the communicator lazily
    torch.cuda.synchronize()
    backend = group._get_backend(torch.device("cuda"))
    comm = int(backend._comm_ptr())
    ranks = [0]
    array, n = _ranks(ranks)
    assert lib.ttd_register_communicator(array, n, ctypes.c_void_p(comm)) == 0
    results: list[dict[str, Any]] = []
    failures = 0
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        if dtype_name == "float8_e4m3fn" and nccl < 22400:
            print(f"skip {dtype_name}: NCCL {nccl} < 2.24 has no fp8")
            continue
        for op in OPS:
            reduces = op in ("all_reduce", "reduce_scatter")
            reduce_ops = ["sum", "product", "max", "min"] if reduces else ["-"]
            if dtype.is_floating_point and reduce_ops[0] != "-":
                reduce_ops.append("avg")
            for reduce_op in reduce_ops:
                torch.manual_seed(0)
                x = _input(dtype, (4, 6))
                expect_rows = {"all_gather": 4 * n, "reduce_scatter": 4 // n}.get(op, 4)
                out = torch.full((expect_rows, 6), 0, device="cuda", dtype=torch.float32).to(dtype)
                red = "sum" if reduce_op == "-" else reduce_op
                status = _run(lib, op, dtype_name, ranks, x, out, red)
                torch.cuda.synchronize()
                ref = _reference(op, x, red, group)
                source = "c10d"
                if ref is None:  # e.g. no fp8 collectives in c10d: one rank's result is its input
                    ref, source = x, "identity (c10d has none)"
                same = status == 0 and torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
                failures += not same
                line = {
                    "op": op,
                    "dtype": dtype_name,
                    "reduce_op": reduce_op,
                    "status": status,
                    "equal": same,
                    "reference": source,
                }
                if status:
                    line["error"] = lib.ttd_last_error().decode()
                results.append(line)
                print(("ok   " if same else "FAIL ") + json.dumps(line))
    # failures must be loud: another size's communicator, then no communicator at all
    x = _input(torch.float32, (4, 6))
    out = torch.empty_like(x)
    two, m = _ranks([0, 1])
    lib.ttd_register_communicator(two, m, ctypes.c_void_p(comm))
    status = _run(lib, "all_reduce", "float32", [0, 1], x, out)
    wrong_size = status != 0 and b"has 1 ranks" in lib.ttd_last_error()
    lib.ttd_unregister_communicator(two, m)
    lib.ttd_unregister_communicator(array, n)
    status = _run(lib, "all_reduce", "float32", ranks, x, out)
    unregistered = status != 0 and b"no NCCL communicator is registered for group [0]" in (
        lib.ttd_last_error()
    )
    for name, ok in (
        ("wrong-size communicator refused", wrong_size),
        ("enqueue without a communicator fails", unregistered),
    ):
        failures += not ok
        print(("ok   " if ok else "FAIL ") + name)
        results.append({"check": name, "ok": ok})
    dist.destroy_process_group()
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "plugin_enqueue_check.json"), "w") as fh:
            json.dump({"torch": torch.__version__, "nccl": nccl, "results": results}, fh, indent=1)
    print(f"{len(results)} checks, {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
