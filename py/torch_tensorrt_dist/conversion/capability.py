"""Which collectives become TensorRT layers, with which implementation, and why not. Pure.

A collective that a TensorRT implementation cannot do exactly (a reduce op the plugins do not
have, a dtype they do not take, uneven all_to_all splits, a group the engine's communicator
cannot route...) is *rejected*: the op stays in PyTorch (its eager kernel runs the real c10d
collective) and the reason is reported. Nothing is ever converted approximately.

    conversion_decision("all_reduce", torch.float16, [2, 3], impl="plugin", reduce_op="max")
    # Decision(convertible=False, reason="the TensorRT-LLM plugins reduce with sum only ...")
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from torch_tensorrt_dist.conversion.dtypes import (
    NATIVE_DTYPES,
    PLUGIN_DTYPES,
    TORCH_NCCL_DTYPES,
    as_torch_dtype,
    dtype_name,
)
from torch_tensorrt_dist.conversion.table import COLLECTIVES, IMPLS, NATIVE_REDUCE_OPERATION
from torch_tensorrt_dist.errors import ConfigError, TensorRTDistError

__all__ = [
    "ENV_COLLECTIVE_IMPL",
    "REQUESTABLE_IMPLS",
    "Decision",
    "ImplChoice",
    "conversion_decision",
    "requested_impl",
    "select_impl",
]

#: environment variable read when the settings leave ``collective_impl`` at "auto"
ENV_COLLECTIVE_IMPL = "TORCH_TENSORRT_DIST_COLLECTIVE_IMPL"
REQUESTABLE_IMPLS: tuple[str, ...] = ("auto", *IMPLS)


class Decision(NamedTuple):
    """Whether one collective converts to a TensorRT layer, and why (or why not)."""

    convertible: bool
    reason: str


class ImplChoice(NamedTuple):
    """The implementation the converters use (None: none can be used), and why."""

    impl: str | None
    reason: str


def requested_impl(setting: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The requested implementation: the setting unless it is "auto"/None, else the env var."""
    env = os.environ if env is None else env
    value = (setting or "auto").strip().lower()
    source = "collective_impl"
    if value == "auto" and env.get(ENV_COLLECTIVE_IMPL, "").strip():
        value = env[ENV_COLLECTIVE_IMPL].strip().lower()
        source = ENV_COLLECTIVE_IMPL
    if value not in REQUESTABLE_IMPLS:
        raise ConfigError(
            f"{source}={value!r} is not one of {', '.join(REQUESTABLE_IMPLS)}; "
            f"set it to 'native' (TensorRT DistCollective), 'plugin' (TensorRT-LLM plugins), "
            "'torch_nccl' (our plugins on torch's NCCL communicators) or 'auto'"
        )
    return value


def select_impl(
    requested: str,
    *,
    native_missing: str | None,
    plugin_missing: str | None,
    torch_nccl_missing: str | None = "not checked",
    native_takes_all: bool = True,
) -> ImplChoice:
    """Pick the implementation: for "auto", native where the installed TensorRT has it and it
    can take the whole engine, then our torch_nccl plugins where their library is built, then
    the TensorRT-LLM plugins (then native for the collectives it can take).

    ``*_missing`` are None when that implementation is usable, else the reason it is not
    (from ``availability.py``). ``native_takes_all`` is False when the engine's collectives use
    more than one group (native binds one communicator per engine). An explicit request is
    never swapped for another implementation.
    """
    if requested == "torch_nccl":
        if torch_nccl_missing is None:
            return ImplChoice("torch_nccl", "collective_impl='torch_nccl' (requested)")
        return ImplChoice(
            None, f"collective_impl='torch_nccl' was requested but {torch_nccl_missing}"
        )
    if requested == "auto" and torch_nccl_missing is None:
        if native_missing is None and native_takes_all:
            return ImplChoice("native", "TensorRT DistCollective is available (auto)")
        why = native_missing or "the engine's collectives use more than one group"
        return ImplChoice(
            "torch_nccl",
            f"our plugins on torch's NCCL communicators (auto; native DistCollective: {why})",
        )
    if requested == "native":
        if native_missing is None:
            return ImplChoice("native", "collective_impl='native' (requested)")
        return ImplChoice(None, f"collective_impl='native' was requested but {native_missing}")
    if requested == "plugin":
        if plugin_missing is None:
            return ImplChoice("plugin", "collective_impl='plugin' (requested)")
        return ImplChoice(None, f"collective_impl='plugin' was requested but {plugin_missing}")
    if requested != "auto":
        raise ConfigError(f"collective_impl={requested!r} is not one of {REQUESTABLE_IMPLS}")
    if native_missing is None:
        return ImplChoice("native", "TensorRT DistCollective is available (auto)")
    if plugin_missing is None:
        return ImplChoice(
            "plugin", f"TensorRT-LLM plugins (auto; native DistCollective: {native_missing})"
        )
    ours = "" if torch_nccl_missing == "not checked" else f"; torch_nccl: {torch_nccl_missing}"
    return ImplChoice(
        None,
        "no TensorRT collective implementation is usable: native DistCollective: "
        f"{native_missing}; TensorRT-LLM plugins: {plugin_missing}{ours}",
    )


def _check_group(group_ranks: Sequence[int]) -> str | None:
    ranks = list(group_ranks)
    if not ranks:
        return "the group has no ranks"
    if any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
        return f"group ranks must be non-negative ints, got {ranks}"
    if len(set(ranks)) != len(ranks):
        return f"group ranks {ranks} repeat a rank"
    return None


def _uniform_splits(
    n: int, dim0: int | None, outs: Sequence[int] | None, ins: Sequence[int] | None
) -> str | None:
    for what, sizes in (("output", outs), ("input", ins)):
        if sizes and len(set(sizes)) != 1:
            return (
                f"all_to_all with uneven {what} split sizes {list(sizes)}: TensorRT's ALL_TO_ALL "
                "exchanges equal blocks only"
            )
        if sizes and len(sizes) != n:
            return f"all_to_all over {n} ranks got {len(sizes)} {what} split sizes"
    if dim0 is not None and dim0 % n:
        return f"all_to_all over {n} ranks needs dim 0 ({dim0}) divisible by {n}"
    return None


def conversion_decision(
    op: str,
    dtype: object,
    group_ranks: Sequence[int],
    *,
    impl: str,
    reduce_op: str | None = None,
    src: int | None = None,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    dim0: int | None = None,
    comm_ranks: Sequence[int] | None = None,
    native_members: frozenset[str] | None = None,
) -> Decision:
    """Would this collective become a TensorRT layer with ``impl``? ``(convertible, reason)``.

    ``impl`` is "native", "plugin" or "torch_nccl" (ask about one implementation), or "auto"
    (the one the converters would use in this process: settings/env var, then what is
    installed). ``src`` is the broadcast source as a rank within the group (None: not known,
    not checked); ``reduce_op`` None means "sum"; split sizes None or empty mean even splits.
    ``dim0`` is the input's dim 0 when known. ``comm_ranks`` are the global ranks of the NCCL
    communicator the engine binds for native layers (Torch-TensorRT binds one per engine);
    None means the op's own group. ``native_members`` are the ``CollectiveOperation.X`` /
    ``ReduceOperation.X`` members the installed TensorRT has (``availability.native_members``;
    None: not checked), so a member a release lacks is refused by name, never by version.
    """
    row = COLLECTIVES.get(op)
    if row is None:
        return Decision(False, f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")
    bad_group = _check_group(group_ranks)
    if bad_group:
        return Decision(False, bad_group)
    ranks = [int(r) for r in group_ranks]
    n = len(ranks)
    if row.rooted and src is not None and not 0 <= src < n:
        return Decision(False, f"broadcast source {src} is not a rank of a group of {n}")
    try:
        torch_dtype = as_torch_dtype(dtype)
        reduce_name = None if reduce_op is None else _normalize_reduce(reduce_op)
    except TensorRTDistError as exc:
        return Decision(False, str(exc))
    if row.reduces and reduce_name is None:
        reduce_name = "sum"  # c10d's default
    if n == 1:
        return Decision(True, "a group of one rank: the identity, no collective layer")
    if impl == "auto":
        from torch_tensorrt_dist.conversion.availability import current_impl

        choice = current_impl()
        if choice.impl is None:
            return Decision(False, choice.reason)
        impl = choice.impl
    if impl == "native":
        return _native_decision(
            op,
            torch_dtype,
            ranks,
            reduce_name,
            dim0,
            comm_ranks,
            output_split_sizes,
            input_split_sizes,
            native_members,
        )
    if impl == "plugin":
        return _plugin_decision(op, torch_dtype, ranks, reduce_name, dim0)
    if impl == "torch_nccl":
        return _torch_nccl_decision(
            op, torch_dtype, ranks, reduce_name, dim0, output_split_sizes, input_split_sizes
        )
    return Decision(False, f"unknown collective implementation {impl!r}; use {REQUESTABLE_IMPLS}")


def _normalize_reduce(reduce_op: str) -> str:
    from torch_tensorrt_dist.ops.collectives import normalize_reduce_op

    return normalize_reduce_op(reduce_op)


def _nccl_shape_checks(
    op: str,
    dtype: torch.dtype,
    n: int,
    reduce_name: str | None,
    dim0: int | None,
    outs: Sequence[int] | None,
    ins: Sequence[int] | None,
    who: str,
) -> str | None:
    """Why an NCCL-backed layer (native or ours) cannot do this collective exactly, or None:
    a reduce op NCCL lacks, avg of integers, uneven all_to_all splits, an indivisible dim 0."""
    if reduce_name is not None and reduce_name not in NATIVE_REDUCE_OPERATION:
        return f"{who} has no {reduce_name!r} reduce operation"
    if reduce_name == "avg" and not dtype.is_floating_point:
        return f"avg of {dtype_name(dtype)} would round; cast to a floating dtype first"
    if COLLECTIVES[op].splits:
        uneven = _uniform_splits(n, dim0, outs, ins)
        if uneven:
            return uneven
    if op == "reduce_scatter" and dim0 is not None and dim0 % n:
        return f"reduce_scatter over {n} ranks needs dim 0 ({dim0}) divisible"
    return None


def _native_decision(
    op: str,
    dtype: torch.dtype,
    ranks: list[int],
    reduce_name: str | None,
    dim0: int | None,
    comm_ranks: Sequence[int] | None,
    outs: Sequence[int] | None,
    ins: Sequence[int] | None,
    members: frozenset[str] | None = None,
) -> Decision:
    row = COLLECTIVES[op]
    n = len(ranks)
    if members is not None:
        wanted = [f"CollectiveOperation.{row.native_operation}"]
        if reduce_name is not None and reduce_name in NATIVE_REDUCE_OPERATION:
            wanted.append(f"ReduceOperation.{NATIVE_REDUCE_OPERATION[reduce_name]}")
        lacking = [m for m in wanted if m not in members]
        if lacking:
            since = " (ALL_TO_ALL arrives in TensorRT 11.0)" if "ALL_TO_ALL" in lacking[0] else ""
            return Decision(False, f"the installed TensorRT has no {lacking[0]}{since}")
    if dtype not in NATIVE_DTYPES:
        names = ", ".join(sorted(dtype_name(d) for d in NATIVE_DTYPES))
        return Decision(
            False, f"native DistCollective is used for {names} only, not {dtype_name(dtype)}"
        )
    refused = _nccl_shape_checks(op, dtype, n, reduce_name, dim0, outs, ins, "TensorRT")
    if refused:
        return Decision(False, refused)
    if comm_ranks is not None and [int(r) for r in comm_ranks] != ranks:
        return Decision(
            False,
            f"the engine binds the NCCL communicator of ranks {list(comm_ranks)}, but this "
            f"collective runs on ranks {ranks}; routing another group through it is not "
            "verified, so it stays in PyTorch. Compile and run inside "
            "torch_tensorrt.distributed.distributed_context(<that group>) or use "
            "collective_impl='plugin'",
        )
    what = row.native_operation
    if reduce_name:
        what += f"/{NATIVE_REDUCE_OPERATION[reduce_name]}"
    return Decision(True, f"native DistCollective {what} over ranks {ranks}")


def _plugin_decision(
    op: str, dtype: torch.dtype, ranks: list[int], reduce_name: str | None, dim0: int | None
) -> Decision:
    row = COLLECTIVES[op]
    n = len(ranks)
    if row.plugin_name is None:
        return Decision(
            False,
            f"TensorRT-LLM has no {op} plugin; use collective_impl='native' (TensorRT >= 10.16)",
        )
    if dtype not in PLUGIN_DTYPES:
        names = ", ".join(sorted(dtype_name(d) for d in PLUGIN_DTYPES))
        return Decision(
            False, f"the TensorRT-LLM plugins take {names} only, not {dtype_name(dtype)}"
        )
    if reduce_name is not None and reduce_name != "sum":
        return Decision(
            False, f"the TensorRT-LLM plugins reduce with sum only, not {reduce_name!r}"
        )
    if ranks != sorted(ranks):
        return Decision(
            False,
            f"group ranks {ranks} are not ascending: the plugins order NCCL ranks ascending, so "
            "gathered/scattered blocks would land in the wrong place",
        )
    if op == "reduce_scatter" and dim0 is not None and dim0 % n:
        return Decision(False, f"reduce_scatter over {n} ranks needs dim 0 ({dim0}) divisible")
    return Decision(True, f"TensorRT-LLM {row.plugin_name} plugin over MPI ranks {ranks}")


def _torch_nccl_decision(
    op: str,
    dtype: torch.dtype,
    ranks: list[int],
    reduce_name: str | None,
    dim0: int | None,
    outs: Sequence[int] | None,
    ins: Sequence[int] | None,
) -> Decision:
    n = len(ranks)
    if dtype not in TORCH_NCCL_DTYPES:
        names = ", ".join(sorted(dtype_name(d) for d in TORCH_NCCL_DTYPES))
        return Decision(
            False, f"our torch_nccl plugins carry {names} only, not {dtype_name(dtype)}"
        )
    refused = _nccl_shape_checks(op, dtype, n, reduce_name, dim0, outs, ins, "NCCL")
    if refused:
        return Decision(False, refused.replace("TensorRT's ALL_TO_ALL", "the plugin"))
    what = f"{op}/{reduce_name}" if reduce_name else op
    return Decision(True, f"torch_nccl plugin {what} on the NCCL communicator of ranks {ranks}")
