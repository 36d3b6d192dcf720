"""The communicator binding around a compiled graph's engines (``conversion/engine_binding``).

The engines here are stand-ins with the attributes Torch-TensorRT 2.14's runtime exposes
(``requires_native_multidevice``, ``set_group_name``, ``bind_nccl_comm``, ``nccl_initialized``):
the tests check our traversal, pinning and refusal logic; the real engines are exercised by the
``multigpu`` tests in ``test_tensorrt_collectives.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from torch_tensorrt_dist.conversion.engine_binding import (
    multidevice_engines,
    pin_engines,
    with_bound_communicator,
)
from torch_tensorrt_dist.errors import DistributedSetupError
from torch_tensorrt_dist.testing import run_on_ranks


class StandInEngine:
    """Models the C++ runtime's engine: binding works only where ``bindable``."""

    def __init__(self, multidevice: bool = True, bindable: bool = True) -> None:
        self.requires_native_multidevice = multidevice
        self.bindable = bindable
        self.group_name = ""
        self.nccl_initialized = False
        self.binds = 0

    def set_group_name(self, name: str) -> None:
        self.group_name = name

    def bind_nccl_comm(self) -> None:  # like upstream: returns nothing, quietly fails
        self.binds += 1
        self.nccl_initialized = self.bindable


class Holder(nn.Module):
    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine


def test_only_this_modules_multidevice_engines_are_found_and_pinned() -> None:
    shared, single = StandInEngine(), StandInEngine(multidevice=False)
    compiled = nn.Sequential(Holder(shared), Holder(single), nn.Sequential(Holder(shared)))
    other = StandInEngine()  # another compiled graph's engine (another group)
    other.set_group_name("other-group")
    engines = multidevice_engines(compiled)
    assert [(name, e) for name, e in engines] == [("0", shared)]  # once, and only ours
    pin_engines(engines, "tp-group")
    assert shared.group_name == "tp-group" and other.group_name == "other-group"


def _first_call_binds(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    pg = dist.new_group([0, 1])
    calls: list[int] = []

    def run(args: list[Any]) -> Any:
        calls.append(len(args))
        return args[0] + 1

    good = StandInEngine()
    wrapped = with_bound_communicator(run, [("_run_on_acc_0", good)], pg, torch.device("cpu"))
    first = wrapped([torch.ones(1)])
    wrapped([torch.ones(1)])
    bad = with_bound_communicator(
        run, [("_run_on_acc_1", StandInEngine(bindable=False))], pg, torch.device("cpu")
    )
    try:
        bad([torch.ones(1)])
        refused = ""
    except DistributedSetupError as exc:
        refused = str(exc)
    return {
        "first": first.item(),
        "binds": good.binds,
        "calls": len(calls),
        "refused": refused,
        "group": pg.group_name,
    }


def test_first_call_creates_the_communicator_binds_once_and_refuses_an_unbound_engine() -> None:
    results = run_on_ranks(_first_call_binds, 2, timeout=120)
    for r in results:
        assert r["first"] == 2.0 and r["binds"] == 1 and r["calls"] == 2  # bound once
        assert "_run_on_acc_1 hold collectives but no NCCL communicator" in r["refused"]
        assert f"group {r['group']!r} (ranks [0, 1])" in r["refused"]


def test_no_engine_with_collectives_means_no_wrapper() -> None:
    def run(args: list[Any]) -> Any:
        return args

    assert with_bound_communicator(run, [], None, torch.device("cpu")) is run  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("backend", "device", "expected"),
    [
        ("nccl", "cuda:1", torch.device("cuda:1")),
        ("cpu:gloo,cuda:nccl", "cuda:0", torch.device("cuda:0")),
        ("gloo", "cpu", None),
    ],
)
def test_nccl_groups_bind_their_device_at_init(backend: str, device: str, expected: Any) -> None:
    from torch_tensorrt_dist.runtime.distributed import bound_device

    assert bound_device(backend, device) == expected


class StandInEngineModule(nn.Module):
    """Models Torch-TensorRT's engine module: outputs and the aliased ones it would cut."""

    def __init__(self, names: list[str], aliased: dict[str, tuple[str, str]]) -> None:
        super().__init__()
        self.output_binding_names = names
        self.aliased_io = aliased


def test_engine_modules_keep_every_output_when_a_cut_would_drop_a_graph_output() -> None:
    from torch_tensorrt_dist.conversion.engine_binding import (
        KEPT_ALIASES,
        keep_aliased_outputs,
        returned_outputs,
    )

    kv = ("k_cache", "kv_cache_update")
    # a split engine whose cache write came last: upstream would return 1 of 2 outputs
    split = StandInEngineModule(["hidden", "k_new"], {"k_new": kv})
    # one engine, logits last: nothing would be cut, nothing to change
    whole = StandInEngineModule(["k_new", "logits"], {"k_new": kv})
    assert returned_outputs(split.output_binding_names, split.aliased_io) == 1
    assert returned_outputs(whole.output_binding_names, whole.aliased_io) == 2
    assert returned_outputs(["a"], {"a": kv}) == 1  # all aliased: all returned
    assert keep_aliased_outputs(nn.Sequential(split, whole)) == 1
    assert split.aliased_io == {} and whole.aliased_io == {"k_new": kv}
    assert getattr(split, KEPT_ALIASES) == {"k_new": kv}  # what it writes in place, still known
    assert not hasattr(whole, KEPT_ALIASES)


def test_a_failed_first_call_is_not_retried_with_a_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch_tensorrt_dist.conversion.engine_binding as binding

    class Group:  # never used for a collective: ensure_communicator is recorded instead
        group_name = "g"

    calls: list[int] = []
    seen: list[int] = []

    def run(args: list[Any]) -> Any:
        calls.append(1)
        return args

    monkeypatch.setattr(binding, "ensure_communicator", lambda pg, device: seen.append(1))
    monkeypatch.setattr(binding.dist, "get_process_group_ranks", lambda pg: [0, 1])
    engine = StandInEngine(bindable=False)
    wrapped = with_bound_communicator(run, [("e", engine)], Group(), torch.device("cpu"))  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(DistributedSetupError, match="hold collectives but no NCCL"):
            wrapped([1])
    assert seen == [1] and engine.binds == 1 and calls == []  # one attempt, no retry
