"""Guards for the private torch names this package relies on (fail loudly on a torch upgrade).

- ``torch.distributed.distributed_c10d._resolve_process_group``: group name -> ProcessGroup
- ``torch.distributed.distributed_c10d._get_default_store``: the schedule check's store
- ``torch.ops._c10d_functional.*`` / ``_c10d_functional_autograd.*`` schemas the pass binds
- ``torch.testing._internal.distributed.fake_pg.FakeStore``: the fake process group
- ``torch._dynamo.utils.counters["graph_break"]``: graph-break reasons for ``explain``
- ``torch._inductor.compile_fx.compile_fx_inner`` / ``decomposition.select_decomp_table``
"""

from __future__ import annotations

import torch

from torch_tensorrt_dist.lowering.fuse_collectives import SOURCE_COLLECTIVES

F = torch.ops._c10d_functional


def test_resolve_process_group_and_default_store_exist() -> None:
    from torch.distributed import distributed_c10d

    assert callable(distributed_c10d._resolve_process_group)
    assert callable(distributed_c10d._get_default_store)  # the schedule check's store


def test_functional_collective_schemas_have_the_arguments_we_bind() -> None:
    expected = {
        "all_reduce": ["input", "reduce_op", "group_name"],
        "all_reduce_": ["input", "reduce_op", "group_name"],
        "all_reduce_coalesced": ["inputs", "reduce_op", "group_name"],
        "all_gather_into_tensor": ["input", "group_size", "group_name"],
        "all_gather_into_tensor_out": ["input", "group_size", "group_name", "out"],
        "reduce_scatter_tensor": ["input", "reduce_op", "group_size", "group_name"],
        "all_to_all_single": ["input", "output_split_sizes", "input_split_sizes", "group_name"],
        "broadcast": ["input", "src", "group_name"],
        "broadcast_": ["input", "src", "group_name"],
        "wait_tensor": ["tensor"],
    }
    for name, args in expected.items():
        schema = getattr(F, name).default._schema
        assert [a.name for a in schema.arguments] == args, (name, schema)
    names = {str(op) for op in SOURCE_COLLECTIVES}
    assert "_c10d_functional_autograd.all_gather_into_tensor.default" in names
    assert len(SOURCE_COLLECTIVES) >= 13


def test_fake_process_group_and_compile_helpers_exist() -> None:
    from torch._dynamo.utils import counters
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.testing._internal.distributed.fake_pg import FakeStore

    assert callable(FakeStore) and callable(compile_fx_inner) and select_decomp_table()
    assert isinstance(counters["graph_break"], dict)
