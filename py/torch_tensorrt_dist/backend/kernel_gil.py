"""Inductor's CPU kernels, called without Python's interpreter lock (GIL).

    with kernels_release_gil():            # around compile_fx_inner (engines.py)
        compiled = compile_fx_inner(gm, example_inputs)
    released()                             # whether this torch's bindings could be changed

Inductor calls each C++ kernel it generates through a small Python binding
(``CppPythonBindingsCodeCache``) that keeps the GIL for the whole kernel; ``aten`` ops (its
matmuls) release it. Within one process that serializes every other Python thread with the
kernels: in ``serve``, rank 0's HTTP thread could run only while the step was inside a matmul,
and the step waited for the HTTP thread at each return. Measured (docs/performance.md, servers
alternated): eight streaming clients got 1.01-1.10x the tokens/s with the kernels releasing it
(five runs, none below), one client the same (0.92-1.04x); the step alone is not slower.

The binding's call is built from two class attributes at the moment a kernel is loaded (the
code is compiled, or found in the cache by the hash of that code): here the arguments are still
read from the Python tuple with the GIL held, then the kernel runs with it released (RAII: it is
taken back on every exit, an exception included). The kernels touch raw pointers only and call
nothing in Python. The change lasts for the ``with`` block only (other compiles in the process
are left as torch makes them), and is made only where torch's attributes are exactly those this
was written against (torch 2.14's ``codecache.py``); elsewhere the kernels keep the GIL, as
before, and :func:`released` says so.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["kernels_release_gil", "released"]

logger = logging.getLogger(__name__)

#: torch 2.14's ``CppPythonBindingsCodeCache`` (``torch/_inductor/codecache.py``)
UPSTREAM_CALL = "kernel({}); Py_RETURN_NONE;"
UPSTREAM_EXTRA = ""

#: the call with the GIL released around the kernel (the argument list is evaluated, with the
#: GIL, before ``_ttd_call_nogil`` runs); doubled braces: the upstream code ``str.format``s it
CALL = "_ttd_call_nogil(kernel, {}); Py_RETURN_NONE;"
EXTRA = """
struct _TTDNoGil {{
    PyThreadState* saved;
    _TTDNoGil() : saved(PyEval_SaveThread()) {{}}
    ~_TTDNoGil() {{ PyEval_RestoreThread(saved); }}
}};
template <typename F, typename... A> static inline void _ttd_call_nogil(F f, A... a) {{
    _TTDNoGil released;
    f(a...);
}}
"""

_lock = threading.RLock()  # a compile inside a compile: the same thread again
_state: dict[str, bool] = {}


def _bindings() -> Any:
    try:
        from torch._inductor.codecache import CppPythonBindingsCodeCache
    except ImportError:
        return None
    return CppPythonBindingsCodeCache


def released() -> bool:
    """Whether this torch's kernel bindings are ones :func:`kernels_release_gil` can change."""
    cls = _bindings()
    if cls is None:
        return False
    call = cls.__dict__.get("call_entry_function")
    extra = cls.__dict__.get("extra_parse_arg")
    return (call, extra) in ((UPSTREAM_CALL, UPSTREAM_EXTRA), (CALL, EXTRA))


@contextlib.contextmanager
def kernels_release_gil() -> Iterator[bool]:
    """Kernels that Inductor loads inside the block release the GIL while they run; yields
    whether they do (False: this torch's bindings are not the ones expected; nothing changed)."""
    cls = _bindings()
    with _lock:
        if cls is None or not released():
            if not _state.get("warned"):
                _state["warned"] = True
                logger.info(
                    "Inductor's kernel bindings are not torch 2.14's: its CPU kernels keep "
                    "the interpreter lock while they run"
                )
            yield False
            return
        saved = cls.call_entry_function, cls.extra_parse_arg
        cls.call_entry_function, cls.extra_parse_arg = CALL, EXTRA
        try:
            yield True
        finally:
            cls.call_entry_function, cls.extra_parse_arg = saved
