"""The TensorRT-LLM plugin library loader: search order, one initialisation, every error path.

Real shared libraries are built with the system C compiler: one whose ``initTrtLlmPlugins``
counts its calls and checks the namespace argument, one that returns false, one without the
symbol. Nothing here pretends to be TensorRT: the loader's job ends at that C call.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from torch_tensorrt_dist.conversion.impl.trtllm.loader import (
    ENV_PLUGINS_PATH,
    LIB_NAME,
    PluginLoader,
    plugin_candidates,
)
from torch_tensorrt_dist.conversion.nccl_library import (
    NCCL_SONAME,
    find_torch_nccl,
    preload_torch_nccl,
)
from torch_tensorrt_dist.errors import ConfigError, EngineUnavailableError

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")

SOURCES = {
    "ok": """
        #include <string.h>
        int calls = 0;
        int init_ok = 0;
        _Bool initTrtLlmPlugins(void* logger, const char* ns) {
            calls++;
            init_ok = (logger == 0 && ns != 0 && strcmp(ns, "tensorrt_llm") == 0);
            return init_ok;
        }
    """,
    "false": """
        _Bool initTrtLlmPlugins(void* logger, const char* ns) { return 0; }
    """,
    "nosym": """
        int someOtherFunction(void) { return 1; }
    """,
}


def _build(root: Path, kind: str, folder: str) -> Path:
    out_dir = root / folder
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / f"{kind}.c"
    src.write_text(textwrap.dedent(SOURCES[kind]))
    lib = out_dir / LIB_NAME
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plugins")
    return {
        "ok": _build(root, "ok", "ok"),
        "ok2": _build(root, "ok", "ok2"),
        "ok3": _build(root, "ok", "ok3"),
        "ok4": _build(root, "ok", "ok4"),
        "false": _build(root, "false", "false"),
        "nosym": _build(root, "nosym", "nosym"),
    }


def _calls(handle: object) -> int:
    return ctypes.c_int.in_dll(handle, "calls").value  # type: ignore[arg-type]


def test_explicit_path_loads_and_initialises_once(libs: dict[str, Path]) -> None:
    loader = PluginLoader(preload_nccl=False)
    first = loader.load(str(libs["ok"]), env={})
    assert first.found_by == "argument" and first.path == str(libs["ok"])
    assert _calls(first.handle) == 1
    assert ctypes.c_int.in_dll(first.handle, "init_ok").value == 1  # (NULL, "tensorrt_llm")
    again = loader.load(env={})
    assert again is first and _calls(first.handle) == 1
    with pytest.raises(ConfigError, match="already loaded"):
        loader.load(str(libs["ok2"]), env={})


def test_concurrent_loads_initialise_once(libs: dict[str, Path]) -> None:
    loader = PluginLoader(preload_nccl=False)
    results: list[object] = []
    threads = [
        threading.Thread(target=lambda: results.append(loader.load(str(libs["ok3"]), env={})))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r is results[0] for r in results)
    assert _calls(results[0].handle) == 1  # type: ignore[attr-defined]


def test_argument_beats_env_and_env_may_name_a_folder(libs: dict[str, Path]) -> None:
    env = {ENV_PLUGINS_PATH: str(libs["false"].parent)}
    loaded = PluginLoader(preload_nccl=False).load(str(libs["ok"]), env=env)
    assert loaded.found_by == "argument"
    env = {ENV_PLUGINS_PATH: str(libs["ok2"].parent)}  # a folder: the library inside it
    loaded = PluginLoader(preload_nccl=False).load(env=env)
    assert loaded.found_by == ENV_PLUGINS_PATH and loaded.path == str(libs["ok2"])


def test_installed_package_is_searched_after_env(
    libs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "site" / "tensorrt_llm"
    (pkg / "libs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(libs["ok"], pkg / "libs" / LIB_NAME)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cands = plugin_candidates(None, env={})
    assert [c.found_by for c in cands] == [
        "argument",
        ENV_PLUGINS_PATH,
        "tensorrt_llm package",
        "system loader",
    ]
    loaded = PluginLoader(preload_nccl=False).load(env={})
    assert loaded.found_by == "tensorrt_llm package"
    assert loaded.path == str(pkg / "libs" / LIB_NAME)


def test_not_found_lists_every_place_looked() -> None:
    with pytest.raises(EngineUnavailableError) as info:
        PluginLoader(preload_nccl=False).load(env={})
    text = str(info.value)
    assert f"{LIB_NAME} (the TensorRT-LLM NCCL plugins) was not found" in text
    assert "argument: - (not given)" in text
    assert f"{ENV_PLUGINS_PATH}: - (not set)" in text
    assert "tensorrt_llm package: - (not installed)" in text
    assert f"system loader: {LIB_NAME} (not on the loader path)" in text
    assert "pip install tensorrt_llm" in text


def test_explicit_missing_path_is_an_error_not_skipped(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / LIB_NAME
    with pytest.raises(EngineUnavailableError, match=r"names .* which does not exist"):
        PluginLoader(preload_nccl=False).load(str(missing), env={})
    # a variable naming a missing file is not skipped in favour of a later place either
    with pytest.raises(EngineUnavailableError, match=f"{ENV_PLUGINS_PATH} names"):
        PluginLoader(preload_nccl=False).load(env={ENV_PLUGINS_PATH: str(missing)})


def test_missing_symbol(libs: dict[str, Path]) -> None:
    with pytest.raises(EngineUnavailableError, match="has no symbol initTrtLlmPlugins"):
        PluginLoader(preload_nccl=False).load(str(libs["nosym"]), env={})


def test_initialisation_returning_false(libs: dict[str, Path]) -> None:
    loader = PluginLoader(preload_nccl=False)
    with pytest.raises(EngineUnavailableError, match="returned false"):
        loader.load(str(libs["false"]), env={})
    assert loader.loaded is None


def test_not_a_shared_library(tmp_path: Path) -> None:
    junk = tmp_path / LIB_NAME
    junk.write_bytes(b"not an ELF file")
    with pytest.raises(EngineUnavailableError, match="could not be loaded"):
        PluginLoader(preload_nccl=False).load(str(junk), env={})


def test_system_loader_path_is_searched_last(libs: dict[str, Path]) -> None:
    # LD_LIBRARY_PATH is read by the dynamic loader at process start: use a fresh process
    code = (
        "from torch_tensorrt_dist.conversion.impl.trtllm.loader import PluginLoader;"
        "r = PluginLoader(preload_nccl=False).load(env={}); print(r.found_by, '|', r.path)"
    )
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(libs["ok"].parent)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "py"), *sys.path])
    env.pop(ENV_PLUGINS_PATH, None)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"system loader | {LIB_NAME}"


def test_find_torch_nccl(tmp_path: Path) -> None:
    maps = [f"7f00-7f10 r-xp 00000000 08:01 123 /opt/nccl/lib/{NCCL_SONAME}\n"]
    assert find_torch_nccl(maps, find_spec=lambda name: None) == f"/opt/nccl/lib/{NCCL_SONAME}"
    lib = tmp_path / "nvidia" / "nccl" / "lib" / NCCL_SONAME
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")

    class Spec:
        submodule_search_locations = [str(tmp_path / "nvidia" / "nccl")]

    assert find_torch_nccl([], find_spec=lambda name: Spec()) == str(lib)
    assert find_torch_nccl([], find_spec=lambda name: None) is None


def test_torch_nccl_is_the_one_mapped_in_this_process() -> None:
    import torch

    if not torch.cuda.is_available() and "nccl" not in torch.__config__.show().lower():
        pytest.skip("this torch build has no NCCL")
    path = find_torch_nccl()
    if path is None:
        pytest.skip("no libnccl.so.2 next to this torch (a system NCCL)")
    assert os.path.basename(path) == NCCL_SONAME and os.path.isfile(path)
    # preloading it globally is idempotent and leaves exactly that copy mapped
    assert preload_torch_nccl() == path == preload_torch_nccl()
    maps = Path("/proc/self/maps").read_text().splitlines()
    mapped = {line.rsplit(" ", 1)[-1] for line in maps if line.endswith(NCCL_SONAME)}
    assert {os.path.realpath(p) for p in mapped} == {os.path.realpath(path)}


def test_default_loader_preloads_torch_nccl_first(libs: dict[str, Path]) -> None:
    loaded = PluginLoader().load(str(libs["ok4"]), env={})
    assert loaded.found_by == "argument" and _calls(loaded.handle) == 1


def test_package_without_the_library_is_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "site" / "tensorrt_llm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(EngineUnavailableError) as info:
        PluginLoader(preload_nccl=False).load(env={})
    assert f"tensorrt_llm package: {pkg / 'libs' / LIB_NAME} (no such file)" in str(info.value)


def test_missing_mpi_dependency_gets_the_mpi_hint(tmp_path: Path) -> None:
    # a plugin library linked against an MPI library that is not there (as on a box without MPI)
    (tmp_path / "mpi.c").write_text("int MPI_Stub(void) { return 0; }\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-Wl,-soname,libmpi_stub.so",
            "-o",
            str(tmp_path / "libmpi_stub.so"),
            str(tmp_path / "mpi.c"),
        ],
        check=True,
    )
    (tmp_path / "plugin.c").write_text(
        "int MPI_Stub(void);\n_Bool initTrtLlmPlugins(void* l, const char* n) "
        "{ return MPI_Stub() == 0; }\n"
    )
    lib = tmp_path / LIB_NAME
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(lib),
            str(tmp_path / "plugin.c"),
            f"-L{tmp_path}",
            "-lmpi_stub",
        ],
        check=True,
    )
    (tmp_path / "libmpi_stub.so").unlink()
    with pytest.raises(EngineUnavailableError, match="It needs MPI: install Open MPI"):
        PluginLoader(preload_nccl=False).load(str(lib), env={})


def _linked_to_nvinfer(root: Path, major: int) -> Path:
    """A plugin-like library whose DT_NEEDED names libnvinfer.so.<major> (a stub built here)."""
    folder = root / f"trt{major}"
    folder.mkdir()
    (folder / "stub.c").write_text("int nvinfer_stub(void) { return 0; }\n")
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            f"-Wl,-soname,libnvinfer.so.{major}",
            "-o",
            str(folder / "libnvinfer.so"),
            str(folder / "stub.c"),
        ],
        check=True,
    )
    (folder / "plugin.c").write_text(textwrap.dedent(SOURCES["ok"]))
    lib = folder / LIB_NAME
    subprocess.run(
        [
            "cc",
            "-shared",
            "-fPIC",
            "-o",
            str(lib),
            str(folder / "plugin.c"),
            "-Wl,--no-as-needed",
            f"-L{folder}",
            "-lnvinfer",
        ],
        check=True,
    )
    return lib


def test_elf_reader_lists_what_readelf_lists(tmp_path: Path) -> None:
    from torch_tensorrt_dist.conversion.impl.trtllm.elf import (
        ElfError,
        needed_libraries,
        nvinfer_major,
    )

    lib = _linked_to_nvinfer(tmp_path, 10)
    needed = needed_libraries(lib)
    assert "libnvinfer.so.10" in needed and nvinfer_major(needed) == 10
    if shutil.which("readelf"):
        for path in (lib, Path(ctypes.__file__).parent.parent / "lib-dynload"):
            files = [path] if path.is_file() else sorted(path.glob("_ctypes*.so"))[:1]
            for file in files:
                out = subprocess.run(["readelf", "-d", str(file)], capture_output=True, text=True)
                lines = out.stdout.splitlines()
                ref = [ln.split("[")[1].split("]")[0] for ln in lines if "(NEEDED)" in ln]
                assert needed_libraries(file) == ref
    (tmp_path / "text.so").write_text("not a library")
    with pytest.raises(ElfError, match="not an ELF file"):
        needed_libraries(tmp_path / "text.so")


def test_a_plugin_library_built_for_another_tensorrt_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch_tensorrt_dist.conversion.impl.trtllm import loader as plugin_loader

    lib = _linked_to_nvinfer(tmp_path, 10)
    assert plugin_loader.tensorrt_abi_mismatch(str(lib), 10) is None
    reason = plugin_loader.tensorrt_abi_mismatch(str(lib), 11)
    assert reason is not None and "built for TensorRT 10" in reason
    assert "this process runs TensorRT 11" in reason
    # the loader reads the running TensorRT's major; here we say it is 11
    monkeypatch.setattr(plugin_loader, "loaded_tensorrt_major", lambda: 11)
    with pytest.raises(EngineUnavailableError, match="built for TensorRT 10") as info:
        PluginLoader(preload_nccl=False).load(str(lib), env={})
    assert str(lib) in str(info.value)
    assert not any(str(lib) in line for line in Path("/proc/self/maps").read_text().splitlines())
