"""The paged KV cache's block writes in a TensorRT engine: they stay in PyTorch, in place.

The step (``models/paged.py``) writes each token's K/V into its block of the layer's pool
``k_pool, v_pool: [N, bs, H_kv, D]`` (module buffers, so graph inputs):

    index_put(pool, [blk [T], off [T]], k [T, H_kv, D])      # pool[blk, off] = k

For ``engine="tensorrt"`` the graph is traced with AOTAutograd's default, so the write is
functional and its result is returned as the pool's new value, which AOTAutograd copies back
into the buffer after the call. What TensorRT can do with it (Torch-TensorRT 2.14, TensorRT 11.1):

* **Torch-TensorRT's own converter** (``aten_ops_index_put``, ``impl/select.py``
  ``index_put_converter``) is an ``IScatterLayer`` in ND mode: a new tensor, the whole pool
  copied and the T tokens scattered into it. The engine then returns a new pool per layer per
  call (an output Torch-TensorRT allocates: ``_TRTEngine.create_output_tensors``) and AOTAutograd
  copies it back: the whole reserved cache read and written twice per layer per step, and a
  second pool's memory while the outputs live. That is the cost the paged cache removes.
* **IKVCacheUpdateLayer** (``NvInfer.h``, ``addKVCacheUpdate``) is the one layer TensorRT runs
  in place (its output aliases the cache, ``ICudaEngine::getAliasedInputTensor``). It updates a
  *linear* cache ``[batch, heads, max_seq, dim]``: ``kLINEAR`` is its only mode, each batch
  element ``i`` written from ``writeIndices[i]`` on along dim 2, and the cache must be the network
  input itself (Torch-TensorRT aliases only a direct input: ``impl/slice_scatter.py``
  ``input_binding_name``), so no reshape may sit between. The pool ``[N, bs, H, D]`` is written
  at (block, offset) pairs on dims 0 and 1, with the heads after the offsets: no view of it is
  such a cache. (With the pool laid out ``[N, H, bs, D]`` it would be one: N "sequences" of bs
  slots; a step's tokens would then need sorting by block and a per-block count, ``[N + 1]``
  cumulative, for the packed form, ``AttentionIOForm.PACKED_NHD``, whose lengths must end in the
  token count, padding included. Not built: nothing here can run it.)
* **An in-place plugin** (``IPluginV3OneBuildV2::getAliasedInput`` with
  ``PreviewFeature::kALIASED_PLUGIN_IO_10_03``): the header says TensorRT "may insert copies",
  it does not say whether a network input is written in place, Torch-TensorRT 2.14 sets no such
  preview feature and records no alias for a plugin (its ``AliasKind.USER`` is declared but
  unused). Not built.

So the write stays in PyTorch, **in place**: :func:`keep_pool_writes_in_pytorch` rewrites each
pool write that is the pool's new value, with no reader of the pool after it, into
``index_put_`` on the buffer (T tokens written, nothing copied; AOTAutograd's copy-back then
copies the buffer onto itself, which ``copy_`` skips). Torch-TensorRT has no converter for
``index_put_``, so the partitioner leaves it to PyTorch. The model writes a step's K/V only
after its last layer (``models/paged.py``: each layer attends over its past blocks and its own
chunk's K/V), so the writes are one tail after all of the computation: **one engine** per graph,
then the writes. The block reads and the attention stay in the engine (``paged_forms.py``).

:func:`pool_write` and :func:`keep_pool_writes_in_pytorch` are pure FX (tested on CPU on
graphs captured from the paged step); :func:`pool_write_pass` is the Torch-TensorRT lowering
pass around them (``registration.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from torch_tensorrt_dist.lowering.sizes import numel_hint, size_hint

__all__ = [
    "POOL_WRITE_REASON",
    "PoolWrite",
    "keep_pool_writes_in_pytorch",
    "mutation_outputs",
    "pool_write",
    "pool_write_pass",
    "pool_writes",
]

logger = logging.getLogger(__name__)

_aten = torch.ops.aten
_WRITES = (_aten.index_put.default, _aten.index_put_.default)
_INDEX_DTYPES = (torch.int64, torch.int32)

#: why a block write is not a TensorRT layer (the module docstring has the evidence)
POOL_WRITE_REASON = (
    "a KV block write has no in-place TensorRT form: IKVCacheUpdateLayer updates a linear "
    "cache [batch, heads, seq, dim] along dim 2, not a block pool [blocks, block_size, heads, "
    "dim] at (block, offset) pairs, and Torch-TensorRT's index_put converter scatters into a "
    "new pool (a copy of the whole pool per call); it runs in PyTorch, in place, after the "
    "engine (the model writes a step's K/V after its last layer)"
)


@dataclass(frozen=True)
class PoolWrite:
    """One KV block write of a graph, and where it runs under TensorRT."""

    node: str
    """The ``index_put`` node."""
    pool: str
    """The graph input it writes (a layer's ``k_pool`` or ``v_pool``)."""
    pool_shape: tuple[int, ...]
    """``[N, bs, H_kv, D]``."""
    tokens: int
    """T, the tokens written (a dynamic T at its example size)."""
    write_bytes: int
    """Bytes of the T tokens' K (or V): what an in-place write moves."""
    pool_bytes: int
    """Bytes of the whole pool: what a copy moves."""
    in_place: bool
    """True: PyTorch writes the T tokens into the buffer. False: another op reads the pool
    after the write, so it is left to Torch-TensorRT's scatter (a copy of the pool)."""
    reason: str


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _static(shape: Any) -> bool:
    return all(isinstance(s, int) for s in shape)


def _same(a: Any, b: Any) -> bool:
    """Two sizes that are equal for every value of their symbols (no guard added)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(a == b))


def _block_write(node: fx.Node) -> tuple[fx.Node, torch.Tensor, torch.Tensor] | None:
    """``(pool, pool value, values value)`` if ``node`` is ``index_put(pool, [blk, off], v)``
    into a 4-D graph input with 1-D integer ``blk``, ``off`` of one length T and v ``[T, H, D]``
    of the pool's dtype; else None."""
    if node.op != "call_function" or node.target not in _WRITES or len(node.args) < 3:
        return None
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    pool, indices, values = node.args[:3]
    if accumulate or not isinstance(pool, fx.Node) or pool.op != "placeholder":
        return None
    idx = list(indices) if isinstance(indices, (list, tuple)) else []
    while idx and idx[-1] is None:
        idx.pop()
    pv, vv = _val(pool), _val(values)
    iv = [_val(i) for i in idx]
    if pv is None or vv is None or len(iv) != 2 or any(i is None for i in iv):
        return None
    blk, off = iv
    assert blk is not None and off is not None
    if pv.dim() != 4 or not _static(pv.shape) or vv.dim() != 3 or vv.dtype != pv.dtype:
        return None
    if any(i.dim() != 1 or i.dtype not in _INDEX_DTYPES for i in (blk, off)):
        return None
    t = blk.shape[0]
    if not (_same(off.shape[0], t) and _same(vv.shape[0], t)):
        return None
    if tuple(vv.shape[1:]) != tuple(pv.shape[2:]):
        return None
    return pool, pv, vv


def _is_copy_into(user: fx.Node, pool: fx.Node, node: fx.Node) -> bool:
    return user.target is _aten.copy_.default and user.args[0] is pool and user.args[1] is node


def _copied_back(node: fx.Node) -> bool:
    """The eager/Inductor form: ``copy_(pool, node)`` writes the result back (those engines do
    it in place: ``lowering/input_writes.py``)."""
    pool = node.args[0]
    return isinstance(pool, fx.Node) and any(_is_copy_into(u, pool, node) for u in node.users)


def pool_write(node: fx.Node, mutation_outputs: Collection[fx.Node] = ()) -> PoolWrite | None:
    """The KV block write ``node`` is, or None.

    A block write is an ``index_put`` of the shape above that writes the pool *as the graph's
    input mutation*: ``index_put_`` on it, ``copy_(pool, node)`` after it (the eager/Inductor
    form), or ``node`` among ``mutation_outputs`` (AOTAutograd's default, which Torch-TensorRT
    gets: :func:`mutation_outputs`). A functional ``index_put`` whose result is not the pool's
    new value is not one (the copy is then what the program asks for).
    """
    found = _block_write(node)
    if found is None:
        return None
    pool, pv, vv = found
    writeback = _copied_back(node)
    if node.target is _aten.index_put.default and not writeback and node not in mutation_outputs:
        return None
    # a reader of the pool before the write (the step's gathers of past blocks) reads it as it
    # was, in place or not; one after it would see the tokens written
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    readers = [
        u
        for u in pool.users
        if u is not node and not _is_copy_into(u, pool, node) and order[u] > order[node]
    ]
    item = pv.dtype.itemsize
    write_bytes, pool_bytes = numel_hint(vv) * item, numel_hint(pv) * item
    if readers:
        reason = (
            f"{', '.join(r.name for r in readers)} also read(s) the pool {pool.name}, so it "
            "cannot be written in place: left to Torch-TensorRT's scatter, a copy of the "
            f"whole pool ({pool_bytes:,} B) per call"
        )
    else:
        reason = POOL_WRITE_REASON
    return PoolWrite(
        node=node.name,
        pool=pool.name,
        pool_shape=tuple(int(s) for s in pv.shape),
        tokens=size_hint(vv.shape[0]),
        write_bytes=write_bytes,
        pool_bytes=pool_bytes,
        in_place=not readers,
        reason=reason,
    )


def mutation_outputs(gm: fx.GraphModule) -> frozenset[fx.Node]:
    """The graph outputs AOTAutograd returns as new values of mutated inputs (the first
    ``num_mutated_inp_runtime_indices`` outputs), read from the tracing context of the
    compile running now; empty outside one, or where the mutations stay in the graph
    (``keep_inference_input_mutations``: ``copy_`` nodes, read by :func:`pool_write`)."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    count = int(getattr(meta, "num_mutated_inp_runtime_indices", 0) or 0)
    output = next(iter(reversed(gm.graph.nodes)), None)
    if not count or output is None or output.op != "output":
        return frozenset()
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    return frozenset(v for v in list(values)[:count] if isinstance(v, fx.Node))


def pool_writes(gm: fx.GraphModule, outputs: Collection[fx.Node] | None = None) -> list[PoolWrite]:
    """Every KV block write of ``gm``, in graph order (``outputs``: the mutation outputs,
    default :func:`mutation_outputs`)."""
    outputs = mutation_outputs(gm) if outputs is None else outputs
    found = (pool_write(n, outputs) for n in gm.graph.nodes if n.op == "call_function")
    return [w for w in found if w is not None]


def keep_pool_writes_in_pytorch(
    gm: fx.GraphModule, outputs: Collection[fx.Node] | None = None
) -> list[PoolWrite]:
    """Rewrite every functional block write that can run in place into ``index_put_`` on its
    pool (same arguments; it returns the pool, now holding the tokens). Returns those rewritten.

    Exact: no reader of the pool comes after the write (readers before it see the pool as it
    was either way) and its result is the pool's new value, so the value returned for the pool
    is the pool.
    """
    rewritten = []
    for write in pool_writes(gm, outputs):
        node = next(n for n in gm.graph.nodes if n.name == write.node)
        if write.in_place and node.target is _aten.index_put.default:
            if _copied_back(node):
                continue  # the eager form: reinplace_input_writes (lowering) does it
            node.target = _aten.index_put_.default
            rewritten.append(write)
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten


def pool_write_pass(gm: fx.GraphModule, settings: Any = None) -> fx.GraphModule:
    """Torch-TensorRT lowering-pass signature ``(gm, settings) -> gm`` around
    :func:`keep_pool_writes_in_pytorch`; the writes it leaves to Torch-TensorRT's scatter are
    logged with the reason."""
    writes = pool_writes(gm)
    done = keep_pool_writes_in_pytorch(gm, mutation_outputs(gm))
    if done:
        logger.info(
            "%d KV block write(s) run in PyTorch, in place (%s B per call): %s",
            len(done),
            f"{sum(w.write_bytes for w in done):,}",
            POOL_WRITE_REASON,
        )
    for w in writes:
        if not w.in_place:
            logger.warning("%s: %s", w.node, w.reason)
    return gm


pool_write_pass.__name__ = "torch_tensorrt_dist_pool_writes"
