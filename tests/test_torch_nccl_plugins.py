"""collective_impl="torch_nccl": our plugin fields (pure), the library search, the header search
of ``build-plugins``, and the built library loaded with ctypes beside torch (its registry, its
NCCL resolution, enqueue without a communicator). Tests that need the built library skip with
the reason where it is not built; ``.ci/run`` builds it first, so there they run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from torch_tensorrt_dist.cli import main as cli_main
from torch_tensorrt_dist.conversion.dtypes import TRT_DATA_TYPE
from torch_tensorrt_dist.conversion.impl.torch_nccl.availability import torch_nccl_missing
from torch_tensorrt_dist.conversion.impl.torch_nccl.build import (
    build_commands,
    find_include_dirs,
    include_candidates,
)
from torch_tensorrt_dist.conversion.impl.torch_nccl.library import (
    ENV_PLUGINS_LIB,
    LIB_NAME,
    OP_NUMBER,
    default_build_dir,
    find_torch_nccl_library,
    load_torch_nccl_plugins,
)
from torch_tensorrt_dist.conversion.impl.torch_nccl.spec import (
    PLUGIN_NAMES,
    REDUCE_OP_NUMBER,
    torch_nccl_plugin_spec,
)
from torch_tensorrt_dist.errors import (
    ConfigError,
    EngineUnavailableError,
    UnsupportedCollectiveError,
)

ROOT = Path(__file__).resolve().parents[1]
GROUP = [6, 2, 4]  # group order, not sorted: the registry key keeps it


# ---- the plugin fields (pure) ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "kwargs", "name", "extra"),
    [
        ("all_reduce", {"reduce_op": "max"}, "TrtDistAllReduce", {"reduce_op": 2}),
        ("all_reduce", {}, "TrtDistAllReduce", {"reduce_op": 0}),  # c10d's default: sum
        (
            "reduce_scatter",
            {"reduce_op": "avg", "dim0": 6},
            "TrtDistReduceScatter",
            {"reduce_op": 4},
        ),
        ("all_gather", {}, "TrtDistAllGather", {}),
        ("all_to_all", {"dim0": 9}, "TrtDistAllToAll", {}),
        ("broadcast", {"root": 2}, "TrtDistBroadcast", {"root": 2}),
    ],
)
def test_spec_fields(op: str, kwargs: dict, name: str, extra: dict[str, int]) -> None:
    spec = torch_nccl_plugin_spec(op, torch.bfloat16, GROUP, **kwargs)
    assert (spec.name, spec.version, spec.namespace) == (name, "1", "torch_tensorrt_dist")
    assert list(spec.fields) == ["group", "type_id", *extra]
    assert all(v.dtype == np.int32 for v in spec.fields.values())
    assert spec.fields["group"].tolist() == GROUP
    assert spec.fields["type_id"].tolist() == [7]  # nvinfer1::DataType::kBF16
    for key, value in extra.items():
        assert spec.fields[key].tolist() == [value]


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64])
def test_spec_integer_dtypes(dtype: torch.dtype) -> None:
    spec = torch_nccl_plugin_spec("all_reduce", dtype, [0, 1], "min")
    assert spec.fields["type_id"].tolist() == [TRT_DATA_TYPE[dtype]]
    assert spec.fields["reduce_op"].tolist() == [3]


@pytest.mark.parametrize(
    ("op", "dtype", "kwargs", "text"),
    [
        ("all_reduce", torch.bool, {}, "not bool"),
        ("all_reduce", torch.int64, {"reduce_op": "avg"}, "would round"),
        ("broadcast", torch.float16, {}, "needs its root"),
        ("broadcast", torch.float16, {"root": 3}, "not a rank of a group of 3"),
        ("reduce_scatter", torch.float16, {"dim0": 4}, "dim 0 (4)"),
        ("all_gather", torch.float16, {"reduce_op": "bitwise_xor"}, "xor"),
        ("nope", torch.float16, {}, "unknown collective 'nope'"),
    ],
)
def test_spec_refuses(op: str, dtype: torch.dtype, kwargs: dict, text: str) -> None:
    with pytest.raises(UnsupportedCollectiveError, match=re.escape(text)):
        torch_nccl_plugin_spec(op, dtype, GROUP, **kwargs)


def test_python_numbers_match_csrc() -> None:
    """The op numbers, reduce op numbers and creator names Python uses are the C++ ones."""
    header = (ROOT / "csrc" / "collective_config.h").read_text()
    source = (ROOT / "csrc" / "collective_config.cpp").read_text()
    ops = dict(re.findall(r"k([A-Z_]+) = (\d+),", header.split("enum class ReduceOp")[0]))
    assert {op: int(ops[op.upper()]) for op in OP_NUMBER} == OP_NUMBER
    reduce = dict(re.findall(r"k([A-Z]+) = (\d+),", header.split("enum class ReduceOp")[1]))
    names = {"sum": "SUM", "product": "PROD", "max": "MAX", "min": "MIN", "avg": "AVG"}
    assert {k: int(reduce[v]) for k, v in names.items()} == REDUCE_OP_NUMBER
    cpp = dict(re.findall(r'case CollectiveOp::k([A-Z_]+): return "(\w+)";', source))
    assert {op: cpp[op.upper()] for op in PLUGIN_NAMES} == PLUGIN_NAMES


# ---- finding the library ---------------------------------------------------------------------
def test_library_search(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    assert default_build_dir(env) == str(tmp_path / "cache" / "torch_tensorrt_dist" / "plugins")
    assert find_torch_nccl_library(env=env) is None
    with pytest.raises(EngineUnavailableError, match="torchtrt-dist build-plugins"):
        load_torch_nccl_plugins(env=env)
    built = Path(default_build_dir(env)) / LIB_NAME
    built.parent.mkdir(parents=True)
    built.write_bytes(b"")
    assert find_torch_nccl_library(env=env) == (str(built), "build-plugins")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / LIB_NAME).write_bytes(b"")
    found = find_torch_nccl_library(env={**env, ENV_PLUGINS_LIB: str(folder)})
    assert found == (str(folder / LIB_NAME), ENV_PLUGINS_LIB)
    with pytest.raises(ConfigError, match="does not exist"):  # never skipped for another
        find_torch_nccl_library(env={**env, ENV_PLUGINS_LIB: str(tmp_path / "gone.so")})
    with pytest.raises(ConfigError, match="argument names"):
        find_torch_nccl_library(str(tmp_path / "gone.so"), env=env)


def test_torch_nccl_missing_says_tensorrt_first() -> None:
    if __import__("importlib.util").util.find_spec("tensorrt") is not None:
        pytest.skip("TensorRT is installed here")
    assert torch_nccl_missing() == (
        "TensorRT is not installed (pip install 'torch_tensorrt_dist[tensorrt]')"
    )


# ---- build-plugins: header search and commands -------------------------------------------------
def _header(folder: Path, name: str) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("")


def test_include_search(tmp_path: Path) -> None:
    trt, cuda, nccl = tmp_path / "trt", tmp_path / "cuda", tmp_path / "nccl"
    _header(trt, "NvInferRuntime.h")
    _header(cuda, "crt/host_defines.h")
    _header(nccl, "nccl.h")
    env = {
        "TENSORRT_INCLUDE_DIR": str(trt),
        "CUDA_INCLUDE_DIR": str(cuda),
        "NCCL_INCLUDE_DIR": str(nccl),
    }
    assert include_candidates(env)["TENSORRT_INCLUDE_DIR"][0] == str(trt)
    assert find_include_dirs(env) == env
    with pytest.raises(ConfigError, match=r"NCCL_INCLUDE_DIR=.* has no nccl\.h"):
        find_include_dirs(env, overrides={"NCCL_INCLUDE_DIR": str(trt)})
    nothing = lambda name: None  # noqa: E731  # no wheels installed
    system = include_candidates({}, nothing)["TENSORRT_INCLUDE_DIR"]
    if not any(os.path.isfile(os.path.join(d, "NvInferRuntime.h")) for d in system):
        with pytest.raises(ConfigError, match=r"TENSORRT_INCLUDE_DIR: no NvInferRuntime\.h") as err:
            find_include_dirs({"TENSORRT_INCLUDE_DIR": str(cuda)}, find_spec=nothing)
        assert "kernel-lens==2.0.1" in str(err.value)
    commands = build_commands("/src", "/b", env, werror=True, test=True, generator="Ninja")
    assert commands[0][:7] == ["cmake", "-S", "/src", "-B", "/b", "-G", "Ninja"]
    assert f"-DTENSORRT_INCLUDE_DIR={trt}" in commands[0]
    assert "-DTORCHTRT_DIST_WERROR=ON" in commands[0] and "-DTORCHTRT_DIST_TESTS=ON" in commands[0]
    assert commands[1] == ["cmake", "--build", "/b"]
    assert commands[2][:3] == ["ctest", "--test-dir", "/b"]
    assert len(build_commands("/src", "/b", env)) == 2  # no ctest unless asked


def test_a_cmake_cache_of_another_checkout_or_generator_is_stale(tmp_path: Path) -> None:
    from torch_tensorrt_dist.conversion.impl.torch_nccl.build import stale_cmake_cache

    src, other, build = tmp_path / "src", tmp_path / "other", tmp_path / "build"
    for d in (src, other, build):
        d.mkdir()
    assert stale_cmake_cache(str(build), str(src), "Ninja") is None  # nothing configured yet
    (build / "CMakeCache.txt").write_text(
        f"# comment\nCMAKE_HOME_DIRECTORY:INTERNAL={other}\nCMAKE_GENERATOR:INTERNAL=Ninja\n"
    )
    assert stale_cmake_cache(str(build), str(src), "Ninja") == (
        f"it was configured for the checkout {other}"
    )
    assert stale_cmake_cache(str(build), str(other), "Ninja") is None
    reason = stale_cmake_cache(str(build), str(other), "Unix Makefiles")
    assert reason == "it was configured with the Ninja generator"


def test_build_plugins_cli_names_the_missing_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(["build-plugins", "--tensorrt-include", str(tmp_path)])
    assert code == 2
    assert f"TENSORRT_INCLUDE_DIR={tmp_path} has no NvInferRuntime.h" in capsys.readouterr().err


# ---- the built library, loaded beside torch ------------------------------------------------------
def _built() -> str:
    found = find_torch_nccl_library()
    if found is None:
        pytest.skip(
            f"our plugin library is not built ({LIB_NAME} not in {default_build_dir()}); "
            "run `torchtrt-dist build-plugins`"
        )
    return found[0]


def test_library_resolves_torchs_nccl_without_a_gpu() -> None:
    lib = load_torch_nccl_plugins(_built())
    version = lib.nccl_version()
    assert version >= (2, 7, 0)
    if hasattr(torch.cuda, "nccl") and torch.distributed.is_nccl_available():
        assert version == tuple(torch.cuda.nccl.version())[:3]  # the very copy torch loaded
    assert os.path.basename(lib.nccl_path()) == "libnccl.so.2"
    assert load_torch_nccl_plugins(_built()) is lib  # loaded once


def test_registry_keyed_by_ordered_ranks() -> None:
    lib = load_torch_nccl_plugins(_built())
    base = lib.count()
    lib.register([0, 2], 0x1234)
    lib.register([2, 0], 0x5678)
    try:
        assert lib.lookup([0, 2]) == 0x1234 and lib.lookup([2, 0]) == 0x5678
        assert lib.lookup([0, 2, 4]) is None
        assert lib.count() == base + 2
        with pytest.raises(ConfigError, match="non-null ncclComm_t"):
            lib.register([1, 3], 0)
    finally:
        assert lib.unregister([0, 2]) and lib.unregister([2, 0])
    assert not lib.unregister([0, 2])
    assert lib.count() == base


def test_enqueue_without_communicator_fails_naming_the_group() -> None:
    lib = load_torch_nccl_plugins(_built())
    for op in OP_NUMBER:
        status = lib.run_plugin(op, [5, 1], 0, [4, 2], 0x10, 0x20, 0, root=1)
        assert status != 0, op
        assert "no NCCL communicator is registered for group [5, 1]" in lib.last_error()
    assert lib.run_plugin("all_gather", [0, 1], 4, [4], 0x10, 0x20, 0) == -1  # kBOOL
    assert "type_id 4 is not one of" in lib.last_error()


def test_register_communicator_refuses_a_group_without_nccl() -> None:
    import torch.distributed as dist

    from torch_tensorrt_dist.backend.fake_world import fake_world
    from torch_tensorrt_dist.conversion.impl.torch_nccl.comms import (
        register_communicator,
        registered_communicators,
        unregister_communicator,
    )
    from torch_tensorrt_dist.errors import DistributedSetupError

    with fake_world(1, 4):
        group = dist.new_group([1, 3])
        with pytest.raises(DistributedSetupError, match=r"ranks \[1, 3\] uses backend 'fake'"):
            register_communicator(group)
        blocked = pytest.raises(DistributedSetupError, match="backend='nccl'")
        with blocked, registered_communicators([group]):
            pass
        assert unregister_communicator(group) is False  # never registered
        assert unregister_communicator([1, 3]) is False


def test_register_communicator_refuses_non_blocking_communicators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.distributed as dist

    from torch_tensorrt_dist.backend.fake_world import fake_world
    from torch_tensorrt_dist.conversion.impl.torch_nccl.comms import register_communicator
    from torch_tensorrt_dist.errors import DistributedSetupError

    monkeypatch.setenv("TORCH_NCCL_USE_COMM_NONBLOCKING", "1")
    with fake_world(0, 2), pytest.raises(DistributedSetupError, match="ncclInProgress"):
        register_communicator(dist.new_group([0, 1]))
