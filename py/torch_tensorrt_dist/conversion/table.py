"""One row per typed collective: everything a converter needs to know about it.

Adding a collective is adding a row here, and one to each implementation's own tables
(``impl/<folder>/rules.py``); the binding (``node_args.py``), the shared rules (``rules.py``)
and every implementation read this table.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLLECTIVES", "CollectiveRow"]


@dataclass(frozen=True)
class CollectiveRow:
    op: str  # torch.ops.tensorrt_dist.<op>
    args: tuple[str, ...]  # schema argument names after the input tensor, in order
    reduces: bool  # takes a reduce op
    rooted: bool  # takes a source / root rank
    splits: bool = False  # takes split sizes (all_to_all)


COLLECTIVES: dict[str, CollectiveRow] = {
    row.op: row
    for row in (
        CollectiveRow(
            "all_reduce",
            ("reduce_op", "group_name", "group_ranks"),
            reduces=True,
            rooted=False,
        ),
        CollectiveRow(
            "all_gather",
            ("group_name", "group_ranks"),
            reduces=False,
            rooted=False,
        ),
        CollectiveRow(
            "reduce_scatter",
            ("reduce_op", "group_name", "group_ranks"),
            reduces=True,
            rooted=False,
        ),
        CollectiveRow(
            "all_to_all",
            ("output_split_sizes", "input_split_sizes", "group_name", "group_ranks"),
            reduces=False,
            rooted=False,
            splits=True,
        ),
        CollectiveRow(
            "broadcast",
            ("src", "group_name", "group_ranks"),
            reduces=False,
            rooted=True,
        ),
    )
}
