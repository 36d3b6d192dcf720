"""Per-rank trampoline: run a script or module and, if it fails, leave a short record.

    python -u _rank_entry.py [--module] TARGET ARGS...

The launcher starts every rank through this file (by path, so nothing but the standard library
is imported before the user's program). On a non-zero exit or an uncaught exception it writes
``rank-<R>.json`` (rank, exit code, wall time as a float, the error's first line) into
``$TORCH_TENSORRT_DIST_FAILURE_DIR``. The launcher uses those records to tell the rank that
failed first from the ranks that failed because a peer went away. A rank killed by a signal
writes nothing; the launcher sees its signal instead. When the program has finished, the rank
runs Python's exit handlers, flushes its streams and exits without the interpreter's final
teardown (see ``_end``).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback

FAILURE_DIR_ENV = "TORCH_TENSORRT_DIST_FAILURE_DIR"


def _rank() -> str:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(name):
            return os.environ[name]
    return "0"


def _record(code: int, error: str | None) -> None:
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder:
        return
    data = {"rank": int(_rank()), "exit_code": code, "time": time.time(), "error": error}
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank-{_rank()}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)
    except OSError:  # another node's folder, or no space: the exit code still tells
        pass


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main(argv: list[str]) -> int:
    module = bool(argv) and argv[0] == "--module"
    if module:
        argv = argv[1:]
    if not argv:
        print("usage: _rank_entry.py [--module] TARGET ARGS...", file=sys.stderr)
        return 2
    target, rest = argv[0], argv[1:]
    code, error = 0, None
    try:
        if module:
            sys.argv = [target, *rest]
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [target, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:  # the rank's own error: report it, then fail like Python does
        traceback.print_exc()
        code = 1
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error = f"{type(exc).__name__}: {first}"[:300]
    if code != 0:
        _record(code, error)
    return code


def _end(code: int) -> None:
    """End the rank once its program has finished: Python's exit handlers run (they destroy a
    process group left open, unregister communicators...) and the standard streams are
    flushed, then the process exits without the interpreter's final teardown. There, torch's
    gloo and store threads can still abort a rank whose work all succeeded ("terminate called
    without an active exception", SIGABRT; pytorch/pytorch#179291), which the launcher would
    report as a failed job (measured here: 1 launch in 12 of the simple example)."""
    import atexit
    import contextlib

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the program
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _end(main(sys.argv[1:]))
