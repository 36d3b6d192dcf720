"""Per-rank trampoline: run a script, module or function and, if it fails, leave a record.

    python -u _rank_entry.py [--module] TARGET ARGS...      # scripts and modules
    run_function(fn, *args)                                 # function entries (torchrun)

The launcher starts every rank through this file (by path, so nothing but the standard library
is imported before the user's program). When the program fails, the rank writes
``rank-<R>.json`` into ``$TORCH_TENSORRT_DIST_FAILURE_DIR``: its rank, exit code, wall time
(taken by the rank itself when the error reached this file), host and pid, the error in one line
(``Type: message``; for a ``SystemExit`` raised ``from`` an error, that error), its traceback,
whether it is a ``TensorRTDistError`` (a refusal, not a crash), and ``follows``: the rank
whose failure this one only repeats (an error with a ``failed_rank`` attribute naming another
rank, see ``runtime.agree``). The launcher uses the records to tell
the rank that failed first from the ranks that failed because of it, and prints that rank's
line; the rank itself prints no traceback once its record is written (the launcher shows it
under ``-v``). A rank killed by a signal, or ended by Ctrl-C, writes nothing; one that dies in
native code (a segmentation fault, an abort such as glibc's on a corrupted heap) prints every
thread's Python stack to its stderr as it dies (``faulthandler``), the one clue there is.

Each rank also connects to the launcher's exit watch (``exits.sock`` in that folder, see
``runtime/exit_watch.py``), says its rank and pid, and says ``exit <code>`` when it ends here;
the connection closes when the process dies, so the launcher sees the order in which the ranks
ended, killed ones included.

When the program has finished, a script rank runs Python's exit handlers, flushes its streams
and exits without the interpreter's final teardown (see ``_end``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

FAILURE_DIR_ENV = "TORCH_TENSORRT_DIST_FAILURE_DIR"
#: The exit watch's Unix socket, in the failure folder.
EXIT_SOCKET_NAME = "exits.sock"

#: Longest one-line error kept in a record (the traceback is kept whole, up to _MAX_TRACEBACK).
_MAX_LINE = 2000
_MAX_TRACEBACK = 64_000


def _rank() -> int:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def _cause(exc: BaseException) -> BaseException | None:
    """The error a failure is about: ``exc``, or for ``SystemExit`` the error it came from."""
    if not isinstance(exc, SystemExit):
        return exc
    inner = exc.__cause__ or exc.__context__
    return inner if isinstance(inner, Exception) else None


def _trampoline_frame(filename: str) -> bool:
    """A frame of this file or of runpy (above the program's own frames)."""
    return filename == __file__ or filename in ("<frozen runpy>", runpy.__file__)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (the type alone for an empty message)."""
    text = str(exc).strip()
    first = text.splitlines()[0].strip() if text else ""
    name = type(exc).__name__
    return (f"{name}: {first}" if first else name)[:_MAX_LINE]


def describe(exc: BaseException) -> dict[str, Any]:
    """What a record says about ``exc``: ``error``, ``traceback``, ``follows``, ``refusal``
    (pure)."""
    cause = _cause(exc)
    if cause is None:
        code = exc.code if isinstance(exc, SystemExit) else None
        message = str(code).strip() if isinstance(code, str) else ""
        return {
            "error": message.splitlines()[0][:_MAX_LINE] if message else None,
            "traceback": None,
            "follows": None,
            "refusal": False,
            "peer_lost": False,
        }
    follows = getattr(cause, "failed_rank", None)
    tb = traceback.TracebackException.from_exception(cause)
    own = [f for f in tb.stack if not _trampoline_frame(f.filename)]
    tb.stack = traceback.StackSummary.from_list(own or tb.stack)
    text = "".join(tb.format())[-_MAX_TRACEBACK:]
    return {
        "error": one_line(cause),
        "traceback": text,
        "follows": follows if isinstance(follows, int) and follows != _rank() else None,
        # a refusal this package raised on purpose (its message says what to fix), not a crash
        "refusal": any(c.__name__ == "TensorRTDistError" for c in type(cause).__mro__),
        # it failed because a peer had gone (the launcher then looks for that peer)
        "peer_lost": bool(getattr(cause, "peer_lost", False)),
    }


def write_record(code: int, exc: BaseException | None, *, when: float | None = None) -> bool:
    """Write this rank's record; False where there is no folder to write it to. The folder must
    exist already: the launcher makes it on its node, and a rank on another node (mpirun over
    several nodes), where it does not, prints its error itself instead."""
    folder = os.environ.get(FAILURE_DIR_ENV)
    if not folder or not os.path.isdir(folder):
        return False
    data: dict[str, Any] = {
        "rank": _rank(),
        "exit_code": code,
        "time": time.time() if when is None else when,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "error": None,
        "traceback": None,
        "follows": None,
        "refusal": False,
        "peer_lost": False,
    }
    if exc is not None:
        data.update(describe(exc))
    try:
        path = os.path.join(folder, f"rank-{data['rank']}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)
    except OSError:  # no space, or removed: the rank prints its error instead
        return False
    return True


_watch: socket.socket | None = None


def _forget_watch() -> None:
    """In a child forked from the rank: drop the rank's connection (only the rank's own death
    may close it)."""
    global _watch
    if _watch is not None:
        _watch.close()
        _watch = None


def announce() -> None:
    """Connect to the launcher's exit watch, if there is one, and say who this rank is (and
    have a fatal signal print the rank's Python stacks first)."""
    global _watch
    faulthandler.enable(all_threads=True)
    folder = os.environ.get(FAILURE_DIR_ENV)
    path = os.path.join(folder, EXIT_SOCKET_NAME) if folder else ""
    if _watch is not None or not path or not os.path.exists(path):
        return
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by exec'd programs
    try:
        conn.connect(path)
        conn.sendall(f"{_rank()} {os.getpid()}\n".encode())
    except OSError:  # no watch: the records and the launcher's own report decide
        conn.close()
        return
    _watch = conn
    os.register_at_fork(after_in_child=_forget_watch)


def _say_exit(code: int) -> None:
    """Tell the exit watch that this rank ends here with ``code`` (not killed)."""
    if _watch is not None:
        with contextlib.suppress(OSError):
            _watch.sendall(f"exit {code}\n".encode())


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    return 1


def _fail(exc: BaseException, code: int, when: float) -> None:
    """Record a failure; say it on stderr only where no launcher will (no record written)."""
    if write_record(code, exc, when=when):
        return
    if isinstance(exc, SystemExit):
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    else:
        traceback.print_exception(exc)


def end_now(code: int, exc: BaseException | None) -> None:
    """End this process at once, from any thread (its main thread may be stuck in a
    collective that never returns): leave ``exc`` in the rank's record (or print it where no
    launcher reads records), tell the exit watch, flush the streams, ``os._exit(code)``."""
    if exc is not None and not write_record(code, exc):
        print(f"error: {exc}", file=sys.stderr)
    _say_exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def end_by_signal(signum: int) -> None:
    """End this process by ``signum``, as the launcher that sent it waits for (a stop, not a
    cause): the standard streams flushed, the default handler restored, the signal raised."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the program
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def run_function(fn: Callable[..., Any], *args: Any) -> Any:
    """Entry of a function rank (torchrun): ``fn(*args)``, recording any failure."""
    announce()
    try:
        value = fn(*args)
    except SystemExit as exc:
        code = _exit_code(exc)
        if code:
            _fail(exc, code, time.time())
        _say_exit(code)
        if code:
            raise SystemExit(code) from None
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # any error of the rank: record it, then fail like Python
        _fail(exc, 1, time.time())
        _say_exit(1)
        raise SystemExit(1) from None
    _say_exit(0)
    return value


def main(argv: list[str]) -> int:
    module = bool(argv) and argv[0] == "--module"
    if module:
        argv = argv[1:]
    if not argv:
        print("usage: _rank_entry.py [--module] TARGET ARGS...", file=sys.stderr)
        return 2
    target, rest = argv[0], argv[1:]
    announce()
    try:
        sys.argv = [target, *rest]
        if module:
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
        if code:
            _fail(exc, code, time.time())
        return code
    except KeyboardInterrupt:
        end_by_signal(signal.SIGINT)  # as Python does on an uncaught Ctrl-C
        return 130
    except BaseException as exc:  # the rank's own error: record it, then fail like Python does
        _fail(exc, 1, time.time())
        return 1
    return 0


def _end(code: int) -> None:
    """End the rank once its program has finished: Python's exit handlers run (they destroy a
    process group left open, unregister communicators...) and the standard streams are
    flushed, then the process exits without the interpreter's final teardown. There, torch's
    gloo and store threads can still abort a rank whose work all succeeded ("terminate called
    without an active exception", SIGABRT; pytorch/pytorch#179291), which the launcher would
    report as a failed job (measured here: 1 launch in 12 of the simple example)."""
    import atexit

    atexit._run_exitfuncs()
    _say_exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the program
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _end(main(sys.argv[1:]))
