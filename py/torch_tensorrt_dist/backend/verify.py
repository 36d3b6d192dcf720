"""First-call self-check: the engine's outputs against the eager run of the same lowered graph.

An engine can be wrong without failing: a collective layer whose communicator was never bound
does nothing, one bound to the wrong group sums the wrong ranks, a converter miscompiles a
layer. With ``verify`` on, the first call of each compiled graph also runs the lowered aten
graph itself (the reference: aten kernels, collectives through c10d by the typed ops' eager
kernels) on the same inputs, then compares every output within a dtype-aware tolerance. The
verdict is exchanged with the ranks of every group the graph communicates on (through the c10d
store, like the schedule check), so a mismatch on one rank raises :class:`VerificationError`
on all of them instead of leaving the others to run on alone.

Order on every rank: the reference, then the engine (their collectives line up across ranks).
Inputs the graph writes in place (``aten.copy_``/``index_copy_`` into a placeholder, e.g. a KV
cache) are cloned for the reference, so the state is written once, by the engine; their final
values are compared too. Cost: one extra eager run, the clones, and the verdict exchange on the
first call; afterwards the wrapper only reads a flag.

The comparison and its dtype-aware tolerances: ``compare.py``.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import fx
from torch._ops import OpOverload
from torch.utils._pytree import tree_flatten

from torch_tensorrt_dist.backend.compare import compare_outputs
from torch_tensorrt_dist.backend.report import CollectiveInfo
from torch_tensorrt_dist.errors import VerificationError
from torch_tensorrt_dist.runtime.store_exchange import PeersMissing, StoreExchange

__all__ = ["exchange_verdicts", "mutated_inputs", "reference_graph", "with_verification"]

logger = logging.getLogger(__name__)

_KEY_PREFIX = "torch_tensorrt_dist/verify"
_graph_ids = itertools.count()  # compiled graphs verified by this process, in compile order


def _written_placeholder(node: Any) -> fx.Node | None:
    """The placeholder ``node`` is, or is a view of (through ops whose result aliases arg 0)."""
    while isinstance(node, fx.Node):
        if node.op == "placeholder":
            return node
        target = node.target
        if node.op != "call_function" or not isinstance(target, OpOverload):
            return None
        returns = target._schema.returns
        if not returns or returns[0].alias_info is None or not node.args:
            return None
        node = node.args[0]
    return None


def mutated_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the graph inputs the graph writes in place (``copy_``, ``index_copy_``...)."""
    placeholders = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    written: set[int] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, OpOverload):
            continue
        for i, arg in enumerate(node.target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = (
                node.kwargs.get(arg.name)
                if arg.kwarg_only
                else (node.args[i] if i < len(node.args) else node.kwargs.get(arg.name))
            )
            base = _written_placeholder(value)
            if base is not None:
                written.add(placeholders[base])
    return sorted(written)


def reference_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of the lowered graph for the reference run, taken before an engine alters it.

    The graph is copied (engines such as Inductor rewrite it in place); attributes and
    constants are shared with ``gm``, not copied.
    """
    return fx.GraphModule(gm, copy.deepcopy(gm.graph))


def _output_names(gm: fx.GraphModule) -> list[str]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves, _ = tree_flatten(out.args[0])
    return [
        f"output {i} (node {leaf.name!r})" if isinstance(leaf, fx.Node) else f"output {i}"
        for i, leaf in enumerate(leaves)
    ]


def exchange_verdicts(
    verdict: str | None,
    groups: Sequence[tuple[int, ...]],
    *,
    timeout_s: float,
    store: Any = None,
    rank: int | None = None,
) -> list[tuple[int, str]]:
    """Publish this rank's verdict (None: passed) to each group; return the peers' failures.

    Waits for every peer's verdict (up to ``timeout_s``); a peer that never answers is an error.
    """
    if not groups:
        return []
    rank = dist.get_rank() if rank is None else rank
    failures: dict[int, str] = {}
    try:
        rounds = {
            ranks: StoreExchange.next_round(store, _KEY_PREFIX, ranks, rank=rank)
            for ranks in sorted(groups)
        }
        for exchange in rounds.values():
            exchange.publish({"failure": verdict})
        for ranks, exchange in rounds.items():
            try:
                peers = exchange.gather(
                    [r for r in ranks if r != rank], timedelta(seconds=timeout_s)
                )
            except PeersMissing as exc:
                cause = exc.__cause__
                raise VerificationError(
                    f"rank {rank}: ranks {exc.missing} of group {list(ranks)} did not "
                    f"report their verification verdict within {timeout_s:g} s: they failed, "
                    "are much slower, or compiled a different graph; look at their logs "
                    f"({type(cause).__name__}: {cause})"
                ) from cause
            for peer, value in peers.items():
                if value["failure"] is not None:
                    failures.setdefault(peer, value["failure"])
    except (RuntimeError, OSError) as exc:
        if isinstance(exc, VerificationError):
            raise
        raise VerificationError(
            f"rank {rank}: could not reach the c10d store to exchange the verification "
            f"verdict ({type(exc).__name__}: {exc}); the rank that hosts it (usually rank 0) "
            "has probably failed or exited: look at its log"
        ) from exc
    return sorted(failures.items())


def _describe_collectives(collectives: Sequence[CollectiveInfo]) -> str:
    if not collectives:
        return "none"
    parts = []
    for c in collectives:
        reduce = f"({c.reduce_op})" if c.reduce_op else ""
        module = f" in {c.module}" if c.module else ""
        parts.append(
            f"{c.op}{reduce} {c.dtype}{list(c.shape)} on ranks {list(c.group_ranks)}{module}"
        )
    return "; ".join(parts)


_FIX = (
    "The engine computed something other than the same graph run eagerly with c10d "
    "collectives: a collective that did nothing or reduced over the wrong ranks (an unbound "
    "communicator, engines pinned to another group), or a miscompiled layer. Compare with "
    "engine='eager' or 'inductor', and see docs/troubleshooting.md; if the difference is only "
    "precision (reduced-precision kernels), raise verify_tolerance"
)


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


@dataclass
class _State:
    done: bool = False  # the first call passed: run the engine alone
    error: VerificationError | None = None  # the first call failed: never run it again


def with_verification(
    run: Callable[..., Any],
    reference: fx.GraphModule,
    *,
    collectives: Sequence[CollectiveInfo],
    engine: str,
    timeout_s: float,
    tolerance: float | None = None,
) -> Callable[..., Any]:
    """Wrap a boxed engine callable so its first call is checked against ``reference``.

    ``reference`` is :func:`reference_graph` of the lowered graph, taken before the engine
    was built. After a passing first call the wrapper only calls ``run``; after a failing
    one every later call raises the same error (the engine is never trusted again).
    """
    graph_id = next(_graph_ids)
    mutated = mutated_inputs(reference)
    placeholders = [n.name for n in reference.graph.nodes if n.op == "placeholder"]
    names = _output_names(reference) + [
        f"input {i} (placeholder {placeholders[i]!r}, written in place)" for i in mutated
    ]
    groups = sorted({tuple(c.group_ranks) for c in collectives if len(c.group_ranks) > 1})
    distributed = dist.is_initialized()
    state = _State()

    def first_call(args: list[Any]) -> Any:
        if state.error is not None:
            raise state.error
        ref_args = [a.clone() if i in mutated else a for i, a in enumerate(args)]
        written = [args[i] for i in mutated]  # the engine may clear ``args`` (boxed call)
        with torch.no_grad():
            expected = reference(*ref_args)
        actual = run(args)
        mismatch = compare_outputs(
            [_as_list(expected), [ref_args[i] for i in mutated]],
            [_as_list(actual), written],
            tolerance=tolerance,
            names=names,
        )
        rank = dist.get_rank() if distributed else 0
        where = f"rank {rank}: graph #{graph_id} (engine {engine})"
        mine = None if mismatch is None else f"{where}: {mismatch.describe()}"
        peers = exchange_verdicts(mine, groups, timeout_s=timeout_s) if distributed else []
        if mine is None and not peers:
            state.done = True
            logger.info("%s matches the eager reference on its first call", where)
            return actual
        if mine is None:
            peer, message = peers[0]
            text = f"{where}: rank {peer} found its result wrong: {message}"
        else:
            others = f" (also on ranks {[p for p, _ in peers]})" if peers else ""
            text = mine + others
        state.error = VerificationError(
            f"{text}. Collectives of the graph: {_describe_collectives(collectives)}. {_FIX}"
        )
        raise state.error

    def verified_run(args: list[Any]) -> Any:
        if state.done:
            return run(args)
        return first_call(args)

    verified_run._boxed_call = True  # type: ignore[attr-defined]
    if hasattr(run, "trt_module"):  # the GraphModule holding TensorRT engines (for checks)
        verified_run.trt_module = run.trt_module  # type: ignore[attr-defined]
    return verified_run
