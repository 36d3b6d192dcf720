"""Bind the NCCL communicator of the right group to the engines of one compiled graph, and
refuse to run an engine whose collectives have no communicator.

Torch-TensorRT's runtime binds a communicator lazily and only if torch already created it:
``TRTEngine::bind_nccl_comm`` returns quietly when the comm pointer is null, and the engine then
runs with collectives that do nothing (its own docs: the all-reduce result is then incorrect).
NCCL communicators are created lazily too, so when every collective of a TP group lives inside
an engine nothing ever creates that group's communicator. And ``set_distributed_mode`` pins
*every* multi-device engine of the thread, so a second compiled graph on another group would
move the first graph's engines. Here, per compiled graph:

* :func:`bound_communicator_ranks` names the group Torch-TensorRT would bind now (what an
  implementation that binds one communicator per engine decides against);
* :func:`multidevice_engines` finds the engines of this module only, and :func:`pin_engines`
  pins those to the group (``set_group_name``);
* :func:`with_bound_communicator` wraps the graph's first call (all ranks are in step there):
  one small collective on the group creates its communicator (:func:`ensure_communicator`),
  then every engine is bound and checked (``nccl_initialized``); an engine left unbound is a
  :class:`DistributedSetupError` naming the engine and the group, never a silent no-op.

The engine objects are duck-typed on the attributes Torch-TensorRT 2.14 exposes: the C++
runtime's ``torch.classes.tensorrt.Engine`` (``requires_native_multidevice``,
``set_group_name``, ``bind_nccl_comm``, ``nccl_initialized``) and the Python runtime's
``TRTEngine`` (``requires_native_multidevice``, ``setup_nccl_comm``, ``_nccl_comm``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from torch_tensorrt_dist.errors import DistributedSetupError

__all__ = [
    "KEPT_ALIASES",
    "bind_engines",
    "bound_communicator_ranks",
    "ensure_communicator",
    "keep_aliased_outputs",
    "multidevice_engines",
    "pin_engines",
    "returned_outputs",
    "with_bound_communicator",
]

logger = logging.getLogger(__name__)


def bound_communicator_ranks() -> list[int] | None:
    """Global ranks of the process group Torch-TensorRT binds to engines here (its active
    ``distributed_context`` group, else the world); None where none is active."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from torch_tensorrt.distributed._distributed import get_active_group
    except ImportError:
        return None
    group = get_active_group()
    return None if group is None else list(dist.get_process_group_ranks(group))


def _is_multidevice(engine: Any) -> bool:
    # both runtimes set it at build from the engine's collective layers (the Python runtime's
    # ``is_distributed`` is true for every engine of a multi-rank job: not a test)
    return bool(getattr(engine, "requires_native_multidevice", False))


def multidevice_engines(module: nn.Module) -> list[tuple[str, Any]]:
    """``(submodule name, engine)`` for every engine with collectives inside ``module`` (and
    nowhere else: never the thread's other compiled graphs)."""
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for name, sub in module.named_modules():
        engine = getattr(sub, "engine", None)
        if engine is not None and id(engine) not in seen and _is_multidevice(engine):
            seen.add(id(engine))
            found.append((name or "<root>", engine))
    return found


#: where ``keep_aliased_outputs`` keeps the aliases it clears from an engine module
KEPT_ALIASES = "tensorrt_dist_aliased_io"


def keep_aliased_outputs(compiled: nn.Module) -> int:
    """Make every engine module of ``compiled`` return all its outputs; returns how many
    modules it changed.

    Torch-TensorRT's module drops the trailing outputs it finds in ``aliased_io`` (outputs it
    appended for an in-place KV-cache layer) and returns a bare tensor when one output is
    left. On our path every aliased output is a real graph output (AOTAutograd returns the
    written cache), and when the graph is split into several engines the partitioner orders an
    engine's outputs so that those only the final output reads come last: cutting them would
    hand the parent graph the wrong values. The engine still writes the cache in place and
    returns the cache tensor itself, so AOTAutograd's copy-back is a no-op. What the engine
    writes in place stays readable as ``module.<KEPT_ALIASES>`` (reports, the TensorRT tests).
    """
    changed = 0
    for sub in compiled.modules():
        aliased = getattr(sub, "aliased_io", None)
        names = list(getattr(sub, "output_binding_names", None) or ())
        if aliased and names and returned_outputs(names, aliased) < len(names):
            setattr(sub, KEPT_ALIASES, dict(aliased))
            sub.aliased_io = {}  # type: ignore[assignment]  # a Torch-TensorRT module attribute
            changed += 1
    return changed


def returned_outputs(output_names: list[str], aliased: Any) -> int:
    """How many outputs Torch-TensorRT 2.14's engine module returns (its
    ``user_output_count``): up to the last output *not* in ``aliased``, or all of them when
    none or every one is aliased."""
    for i in range(len(output_names) - 1, -1, -1):
        if output_names[i] not in aliased:
            return i + 1
    return len(output_names)


def pin_engines(engines: list[tuple[str, Any]], group_name: str) -> None:
    """Pin these engines (only) to the c10d group ``group_name``."""
    for _, engine in engines:
        if hasattr(engine, "set_group_name"):  # the C++ runtime; Python: the active group
            engine.set_group_name(group_name)


def _group_text(pg: dist.ProcessGroup) -> str:
    return f"group {pg.group_name!r} (ranks {dist.get_process_group_ranks(pg)})"


def ensure_communicator(pg: dist.ProcessGroup, device: torch.device) -> None:
    """Make sure ``pg`` has its communicator on ``device``: one small all-reduce on it (every
    rank of the group must call this at the same point). For NCCL, also checks that torch
    now holds a communicator pointer to hand to TensorRT."""
    dist.all_reduce(torch.zeros(1, device=device), group=pg)
    if device.type != "cuda":
        return
    backend = pg._get_backend(device)
    comm_ptr = getattr(backend, "_comm_ptr", None)
    if comm_ptr is not None and not comm_ptr():
        raise DistributedSetupError(
            f"torch created no NCCL communicator for {_group_text(pg)} after a collective on "
            f"it; TensorRT's collectives would have nothing to run on. Check that the group "
            "uses the nccl backend on this device"
        )


def bind_engines(engines: list[tuple[str, Any]], pg: dist.ProcessGroup) -> None:
    """Bind the group's communicator to every engine now, and check each one is bound."""
    unbound = []
    for name, engine in engines:
        if hasattr(engine, "bind_nccl_comm"):  # C++ runtime: returns nothing, sets the flag
            engine.bind_nccl_comm()
            ok = bool(getattr(engine, "nccl_initialized", False))
        else:  # Python runtime: raises on failure
            engine.setup_nccl_comm()
            ok = bool(getattr(engine, "_nccl_comm", None))
        if not ok:
            unbound.append(name)
    if unbound:
        raise DistributedSetupError(
            f"TensorRT engine(s) {', '.join(unbound)} hold collectives but no NCCL communicator "
            f"of {_group_text(pg)} could be bound to them; running them would give wrong "
            "results. Is the installed Torch-TensorRT runtime built with NCCL collectives "
            "(ENABLED_FEATURES.native_trt_collectives), and does the group use nccl?"
        )


@contextlib.contextmanager
def _active_group(pg: dist.ProcessGroup) -> Iterator[None]:
    """The group Torch-TensorRT's Python runtime binds (its ``distributed_context``)."""
    try:
        from torch_tensorrt.distributed import distributed_context
    except ImportError:
        yield
        return
    with distributed_context(pg):
        yield


def with_bound_communicator(
    run: Callable[[list[Any]], Any],
    engines: list[tuple[str, Any]],
    pg: dist.ProcessGroup,
    device: torch.device,
) -> Callable[[list[Any]], Any]:
    """Wrap a boxed engine callable: before its first run, create the group's communicator
    and bind it to ``engines`` (an error if one stays unbound); later calls run as they are."""
    if not engines:
        return run
    done = threading.Event()
    failed: list[BaseException] = []

    def bound_run(args: list[Any]) -> Any:
        if done.is_set():
            if failed:  # never retried: a retry's collective could meet no peer and hang
                raise failed[0]
            return run(args)
        try:
            ensure_communicator(pg, device)
            with _active_group(pg):
                bind_engines(engines, pg)
        except BaseException as exc:
            failed.append(exc)
            raise
        finally:
            done.set()
        logger.info("bound %s to %d engine(s)", _group_text(pg), len(engines))
        with _active_group(pg):
            return run(args)

    bound_run._boxed_call = True  # type: ignore[attr-defined]
    return bound_run
