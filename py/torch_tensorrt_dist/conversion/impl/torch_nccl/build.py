"""How ``torchtrt-dist build-plugins`` builds our plugin library: header folders and commands.

    dirs = find_include_dirs()   # {"TENSORRT_INCLUDE_DIR": ..., "CUDA_INCLUDE_DIR": ...}
    for cmd in build_commands(source_dir(), default_build_dir(), dirs): subprocess.run(cmd)

Each header folder comes from its environment variable (``TENSORRT_INCLUDE_DIR``,
``CUDA_INCLUDE_DIR``, ``NCCL_INCLUDE_DIR``) or the first of the usual places that has the
header: a TensorRT install (``/usr/include/x86_64-linux-gnu`` for the Debian packages,
``/usr/local/tensorrt/include``, ``/opt/tensorrt/include``) or the ``kernel-lens`` wheel's copy
of TensorRT 10.14's public headers; CUDA's toolkit (``$CUDA_HOME``, ``/usr/local/cuda*``) or the
``nvidia-cuda-runtime`` + ``nvidia-cuda-crt`` + ``nvidia-cuda-cccl`` (``nv/target``) wheels;
the ``nvidia-nccl`` wheel torch installs.
Pure apart from file-system checks, so tests call it with made-up folders.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["HEADERS", "build_commands", "find_include_dirs", "include_candidates", "source_dir"]

#: CMake variable -> (a header it must hold, what to install when none is found)
HEADERS: dict[str, tuple[str, str]] = {
    "TENSORRT_INCLUDE_DIR": (
        "NvInferRuntime.h",
        "TensorRT's headers (a TensorRT install, or `pip install kernel-lens==2.0.1` for "
        "TensorRT 10.14's public headers)",
    ),
    "CUDA_INCLUDE_DIR": (
        "crt/host_defines.h",
        "CUDA's runtime headers (a CUDA toolkit, or `pip install --no-deps nvidia-cuda-runtime "
        "nvidia-cuda-crt nvidia-cuda-cccl` matching torch's CUDA)",
    ),
    "NCCL_INCLUDE_DIR": ("nccl.h", "nccl.h (the nvidia-nccl wheel torch installs)"),
}


def _package_dirs(name: str, find_spec: Callable[[str], Any]) -> list[str]:
    try:
        spec = find_spec(name)
    except (ImportError, ValueError):
        return []
    return list(getattr(spec, "submodule_search_locations", None) or []) if spec else []


def include_candidates(
    env: Mapping[str, str] | None = None,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
) -> dict[str, list[str]]:
    """Every folder searched for each variable, in order (the variable's own value first)."""
    env = os.environ if env is None else env
    cuda_homes = [env.get("CUDA_HOME", ""), env.get("CUDA_PATH", ""), "/usr/local/cuda"]
    cuda_homes += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    nvidia = _package_dirs("nvidia", find_spec)
    out: dict[str, list[str]] = {
        "TENSORRT_INCLUDE_DIR": [
            "/usr/include/x86_64-linux-gnu",
            "/usr/include/aarch64-linux-gnu",
            "/usr/include",
            "/usr/local/tensorrt/include",
            "/opt/tensorrt/include",
        ]
        + [os.path.join(d, "include", "tensorrt") for d in _package_dirs("kernel_lens", find_spec)],
        "CUDA_INCLUDE_DIR": [os.path.join(h, "include") for h in cuda_homes if h]
        + [os.path.join(d, sub, "include") for d in nvidia for sub in ("cu13", "cu12")]
        + [os.path.join(d, "cuda_runtime", "include") for d in nvidia],
        "NCCL_INCLUDE_DIR": [os.path.join(d, "nccl", "include") for d in nvidia]
        + ["/usr/include", "/usr/local/include"],
    }
    for var in out:
        if env.get(var):
            out[var].insert(0, env[var])
    return out


def find_include_dirs(
    env: Mapping[str, str] | None = None,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    overrides: Mapping[str, str | None] | None = None,
) -> dict[str, str]:
    """The folder for each CMake variable; :class:`ConfigError` names what is missing.

    ``overrides`` (command-line values) win and must hold their header."""
    env = os.environ if env is None else env
    found: dict[str, str] = {}
    missing: list[str] = []
    candidates = include_candidates(env, find_spec)
    for var, (header, install) in HEADERS.items():
        chosen = (overrides or {}).get(var)
        if chosen:
            if not os.path.isfile(os.path.join(chosen, header)):
                raise ConfigError(f"{var}={chosen} has no {header}; point it at {install}")
            found[var] = chosen
            continue
        pick = next((d for d in candidates[var] if os.path.isfile(os.path.join(d, header))), None)
        if pick is None:
            missing.append(f"{var}: no {header} in {', '.join(candidates[var])}; need {install}")
        else:
            found[var] = pick
    if missing:
        raise ConfigError(
            "cannot build the plugin library, headers not found (set the variable to the "
            "folder):\n  " + "\n  ".join(missing)
        )
    return found


def source_dir() -> str:
    """The source checkout holding ``CMakeLists.txt`` and ``csrc/`` (an editable install)."""
    here = os.path.dirname(__file__)  # <root>/py/torch_tensorrt_dist/conversion/impl/torch_nccl
    root = os.path.abspath(os.path.join(here, *[os.pardir] * 5))
    if not os.path.isfile(os.path.join(root, "CMakeLists.txt")) or not os.path.isdir(
        os.path.join(root, "csrc")
    ):
        raise ConfigError(
            f"{root} has no CMakeLists.txt and csrc/: building the plugins needs a source "
            "checkout (pip install -e .); or pass --source"
        )
    return root


def stale_cmake_cache(build_dir: str, source: str, generator: str) -> str | None:
    """Why the CMake cache in ``build_dir`` cannot be reused for ``source`` (it was configured
    for another checkout, or another generator: CMake would refuse), else None."""
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if not os.path.isfile(cache):
        return None
    values: dict[str, str] = {}
    with open(cache, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            key, sep, value = line.strip().partition("=")
            if sep and key.split(":")[0] in ("CMAKE_HOME_DIRECTORY", "CMAKE_GENERATOR"):
                values[key.split(":")[0]] = value
    home = values.get("CMAKE_HOME_DIRECTORY")
    if home is not None and os.path.realpath(home) != os.path.realpath(source):
        return f"it was configured for the checkout {home}"
    if values.get("CMAKE_GENERATOR", generator) != generator:
        return f"it was configured with the {values['CMAKE_GENERATOR']} generator"
    return None


def default_generator() -> str:
    """Ninja where it is installed, else Makefiles."""
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def build_commands(
    source: str,
    build_dir: str,
    include_dirs: Mapping[str, str],
    *,
    werror: bool = False,
    test: bool = False,
    generator: str | None = None,
) -> list[list[str]]:
    """The cmake (and ctest) command lines; the library lands in ``build_dir``."""
    if generator is None:
        generator = default_generator()
    configure = ["cmake", "-S", source, "-B", build_dir, "-G", generator]
    configure += [f"-D{var}={path}" for var, path in sorted(include_dirs.items())]
    if test:
        from torch_tensorrt_dist.conversion.nccl_library import find_torch_nccl

        nccl = find_torch_nccl()  # for the host test's ncclGetVersion (never linked)
        if nccl:
            configure.append(f"-DNCCL_LIBRARY={nccl}")
    configure += [
        f"-DTORCHTRT_DIST_WERROR={'ON' if werror else 'OFF'}",
        f"-DTORCHTRT_DIST_TESTS={'ON' if test else 'OFF'}",
    ]
    commands = [configure, ["cmake", "--build", build_dir]]
    if test:
        commands.append(["ctest", "--test-dir", build_dir, "--output-on-failure"])
    return commands
