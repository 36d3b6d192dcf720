"""``torchtrt-dist build-plugins``: build our TensorRT collective plugins (``csrc/``) with CMake.

    torchtrt-dist build-plugins                  # headers found where TensorRT/CUDA/torch put them
    TENSORRT_INCLUDE_DIR=/opt/trt/include torchtrt-dist build-plugins --test

Builds into the folder the loader searches (``default_build_dir()``), so the library is found
afterwards without any setting; the last line printed is the library's path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from torch_tensorrt_dist.cli._options import add_command
from torch_tensorrt_dist.errors import ConfigError

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from torch_tensorrt_dist.conversion.impl.torch_nccl.build import (
        build_commands,
        default_generator,
        find_include_dirs,
        source_dir,
        stale_cmake_cache,
    )
    from torch_tensorrt_dist.conversion.impl.torch_nccl.library import LIB_NAME, default_build_dir

    if shutil.which("cmake") is None:
        raise ConfigError("cmake is not on PATH (apt-get install cmake, or pip install cmake)")
    dirs = find_include_dirs(
        overrides={
            "TENSORRT_INCLUDE_DIR": args.tensorrt_include,
            "CUDA_INCLUDE_DIR": args.cuda_include,
            "NCCL_INCLUDE_DIR": args.nccl_include,
        }
    )
    source = args.source or source_dir()
    build_dir = os.path.abspath(args.build_dir or default_build_dir())
    for var, path in sorted(dirs.items()):
        print(f"{var}={path}")
    stale = stale_cmake_cache(build_dir, source, default_generator())
    if stale:  # e.g. another checkout built into the same cache folder: configure afresh
        print(f"removing the CMake cache in {build_dir}: {stale}", flush=True)
        os.remove(os.path.join(build_dir, "CMakeCache.txt"))
        shutil.rmtree(os.path.join(build_dir, "CMakeFiles"), ignore_errors=True)
    started = time.perf_counter()
    for command in build_commands(source, build_dir, dirs, werror=args.werror, test=args.test):
        print("+ " + " ".join(command), flush=True)
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            print(f"torchtrt-dist build-plugins: {command[0]} failed", file=sys.stderr)
            return done.returncode
    library = os.path.join(build_dir, LIB_NAME)
    if not os.path.isfile(library):
        raise ConfigError(f"the build finished but {library} does not exist")
    print(f"built in {time.perf_counter() - started:.1f} s")
    print(library)
    return 0


def register(sub: Any) -> None:
    p = add_command(
        sub, "build-plugins", "build our TensorRT collective plugins (csrc/) with CMake", __doc__
    )
    p.add_argument("--build-dir", help="where to build (default: the folder the loader searches)")
    p.add_argument("--source", help="the source checkout (default: this package's)")
    p.add_argument("--tensorrt-include", help="folder with NvInferRuntime.h")
    p.add_argument("--cuda-include", help="folder with cuda_runtime_api.h and crt/")
    p.add_argument("--nccl-include", help="folder with nccl.h")
    p.add_argument("--werror", action="store_true", help="treat compiler warnings as errors")
    p.add_argument("--test", action="store_true", help="also build and run the C++ host test")
    p.set_defaults(func=_run)
