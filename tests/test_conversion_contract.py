"""Contract: the Torch-TensorRT 2.14 and TensorRT 11 APIs our shell calls exist, with the
arguments we pass. Read from the real released files (parsed with ``ast`` / searched in the
bindings binary), never imported: neither can be installed here.

Sources, first found: an installed package; an unpacked copy under /tmp/trt; a
``pip download --no-deps`` into a temporary folder. Skipped with the reason when none works.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

TORCH_TRT = "torch-tensorrt==2.14.0"
TRT_BINDINGS = "tensorrt-cu12-bindings==11.4.0.106"


def _download(spec: str, dest: Path) -> Path | None:
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "-d",
                str(dest),
                spec,
            ],
            check=True,
            capture_output=True,
            timeout=240,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as zf:
        zf.extractall(dest / "unpacked")
    return dest / "unpacked"


@pytest.fixture(scope="module")
def torch_trt_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.find_spec("torch_tensorrt")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    local = Path("/tmp/trt/tt/torch_tensorrt")
    if (local / "dynamo").is_dir():
        return local
    root = _download(TORCH_TRT, tmp_path_factory.mktemp("torch_trt"))
    if root is None or not (root / "torch_tensorrt").is_dir():
        pytest.skip(f"cannot read {TORCH_TRT}: not installed, no local copy, download failed")
    return root / "torch_tensorrt"


@pytest.fixture(scope="module")
def trt_bindings(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    candidates = []
    spec = importlib.util.find_spec("tensorrt_bindings") or importlib.util.find_spec("tensorrt")
    if spec is not None and spec.submodule_search_locations:
        candidates += sorted(Path(next(iter(spec.submodule_search_locations))).glob("tensorrt*.so"))
    candidates += [Path("/tmp/trt/trtb/tensorrt_bindings/tensorrt.so")]
    for path in candidates:
        if path.is_file():
            return path.read_bytes()
    root = _download(TRT_BINDINGS, tmp_path_factory.mktemp("trt_bindings"))
    found = sorted(root.glob("tensorrt_bindings/tensorrt*.so")) if root else []
    if not found:
        pytest.skip(f"cannot read {TRT_BINDINGS}: not installed, no local copy, download failed")
    return found[0].read_bytes()


def _module(src: Path, rel: str) -> ast.Module:
    return ast.parse((src / rel).read_text())


def _function(tree: ast.AST, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


def _params(fn: ast.FunctionDef) -> tuple[list[str], list[str]]:
    positional = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return positional, [a.arg for a in fn.args.kwonlyargs]


def _class_names(tree: ast.AST, cls: str) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = set()
            for item in node.body:
                if isinstance(item, ast.Assign):
                    names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.FunctionDef):
                    names.add(item.name)
            return names
    raise AssertionError(f"no class {cls}")


def test_converter_registry_decorator(torch_trt_src: Path) -> None:
    # converters.register_converters: dynamo_tensorrt_converter(overload, capability_validator=,
    # priority=ConverterPriority.HIGH, supports_dynamic_shapes=, requires_native_multidevice=)
    tree = _module(torch_trt_src, "dynamo/conversion/_ConverterRegistry.py")
    positional, keyword = _params(_function(tree, "dynamo_tensorrt_converter"))
    assert positional == ["key"]
    assert {
        "capability_validator",
        "priority",
        "supports_dynamic_shapes",
        "requires_native_multidevice",
    } <= set(keyword)
    assert "HIGH" in _class_names(tree, "ConverterPriority")
    # validators are called as validator(node, compilation_settings)
    assert "capability_validator" in _class_names(tree, "ConverterSupport")


def test_lowering_pass_list(torch_trt_src: Path) -> None:
    # registration._register_pass: ATEN_POST_LOWERING_PASSES.passes, _aten_lowering_pass(p, index=)
    rel = "dynamo/lowering/passes/_aten_lowering_pass.py"
    tree = _module(torch_trt_src, rel)
    fn = _function(tree, "_aten_lowering_pass")
    assert fn.args.vararg is not None and "index" in _params(fn)[1]
    assigned = {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    assert "ATEN_POST_LOWERING_PASSES" in assigned
    source = (torch_trt_src / rel).read_text()
    assert "post_lowering_pass_list.append(fuse_distributed_ops)" in source
    manager = _module(torch_trt_src, "dynamo/lowering/passes/pass_manager.py")
    params = _params(_function(manager, "add_pass_with_index"))[0]
    assert params == ["self", "lowering_pass", "index"]
    from torch.fx.passes.pass_manager import PassManager  # DynamoPassManager's base

    assert PassManager([]).passes == []


def test_converter_utils_and_source_ir(torch_trt_src: Path) -> None:
    # converters.emit_collective: get_trt_tensor(ctx, value, name); set_layer_name(layer,
    # target, name, SourceIR.ATEN)
    utils = _module(torch_trt_src, "dynamo/conversion/converter_utils.py")
    assert _params(_function(utils, "get_trt_tensor"))[0][:3] == ["ctx", "input_val", "name"]
    assert _params(_function(utils, "set_layer_name"))[0][:4] == [
        "layer",
        "target",
        "name",
        "source_ir",
    ]
    assert "ATEN" in _class_names(_module(torch_trt_src, "dynamo/_SourceIR.py"), "SourceIR")


@pytest.mark.parametrize(
    "rel,name,params",
    [
        # layers/moe_experts.convert_moe_experts: impl.<module>.<fn>(ctx, target, source_ir,
        # name, ...)
        ("elementwise/ops.py", "sub", ["lhs_val", "rhs_val"]),
        ("elementwise/ops.py", "ge", ["lhs_val", "rhs_val"]),
        ("elementwise/ops.py", "lt", ["lhs_val", "rhs_val"]),
        ("elementwise/ops.py", "logical_and", ["lhs_val", "rhs_val"]),
        ("condition/ops.py", "where", ["input", "other", "condition"]),
        ("cast.py", "to_copy", ["input", "dtype"]),
        ("shuffle.py", "reshape", ["input", "shape"]),
        ("permutation.py", "permute", ["input", "permutation"]),
    ],
)
def test_impl_functions_the_moe_converter_calls(
    torch_trt_src: Path, rel: str, name: str, params: list[str]
) -> None:
    tree = _module(torch_trt_src, f"dynamo/conversion/impl/{rel}")
    positional = _params(_function(tree, name))[0]
    assert positional[: 4 + len(params)] == ["ctx", "target", "source_ir", "name", *params]
    package = rel.split("/")[0].removesuffix(".py")
    init = (torch_trt_src / "dynamo/conversion/impl/__init__.py").read_text()
    assert package in init


def test_distributed_runtime_hooks(torch_trt_src: Path) -> None:
    # availability.bound_communicator_ranks / engine._bound_group / set_distributed_mode
    tree = _module(torch_trt_src, "distributed/_distributed.py")
    assert _params(_function(tree, "get_active_group"))[0] == []
    assert _params(_function(tree, "distributed_context"))[0] == ["group", "module"]
    assert _params(_function(tree, "set_distributed_mode"))[0] == ["group", "module"]
    init = (torch_trt_src / "distributed/__init__.py").read_text()
    assert "distributed_context" in init and "set_distributed_mode" in init
    assert '"native_trt_collectives"' in (torch_trt_src / "_features.py").read_text()


def test_backend_entry_points(torch_trt_src: Path) -> None:
    # engine.compile_tensorrt / engine.decompositions
    backends = _module(torch_trt_src, "dynamo/backend/backends.py")
    assert _params(_function(backends, "_pretraced_backend"))[0] == [
        "gm",
        "sample_inputs",
        "settings",
        "engine_cache",
    ]
    assert _params(_function(_module(torch_trt_src, "dynamo/utils.py"), "parse_dynamo_kwargs"))[
        0
    ] == ["kwargs"]
    fields = _class_names(_module(torch_trt_src, "dynamo/_settings.py"), "CompilationSettings")
    assert {"use_distributed_mode_trace", "pass_through_build_failures", "min_block_size"} <= fields
    decomp = _params(
        _function(
            _module(torch_trt_src, "dynamo/lowering/_decompositions.py"), "get_decompositions"
        )
    )[0]
    assert {
        "enable_experimental_decompositions",
        "decompose_attention",
        "use_distributed_mode_trace",
    } <= set(decomp)
    assert "get_decompositions" in (torch_trt_src / "dynamo/lowering/__init__.py").read_text()


@pytest.mark.parametrize(
    "name",
    [
        # impl/native/emitter._native_layer
        "add_dist_collective",
        "CollectiveOperation",
        "ReduceOperation",
        "num_ranks",
        "ALL_REDUCE",
        "ALL_GATHER",
        "REDUCE_SCATTER",
        "ALL_TO_ALL",
        "BROADCAST",
        "SUM",
        "PROD",
        "MAX",
        "MIN",
        "AVG",
        "NONE",
        # impl/trtllm/emitter._plugin_layer
        "get_plugin_registry",
        "get_creator",
        "create_plugin",
        "add_plugin_v2",
        "PluginField",
        "PluginFieldCollection",
        "PluginFieldType",
        "INT32",
        "INT8",
        "FLOAT32",
        # the runtime side Torch-TensorRT uses for native layers
        "set_communicator",
        # layers/moe_experts.convert_moe_experts
        "add_moe",
        "set_gated_weights",
        "MoEActType",
        "SILU",
    ],
)
def test_tensorrt_bindings_names(trt_bindings: bytes, name: str) -> None:
    # pybind11 keeps every Python-visible name as a NUL-terminated string (short ones may be the
    # tail of a longer string, e.g. INT8 of UINT8: still present for pybind's lookups)
    assert name.encode() + b"\x00" in trt_bindings
