"""The commands' shared rank entry (``cli/_rank.py``): in one process the model is planned once
(``start`` plans, then its ``rank_main`` builds from that plan)."""

from __future__ import annotations

from torch_tensorrt_dist.cli import build_parser
from torch_tensorrt_dist.cli._rank import RankJob, start
from torch_tensorrt_dist.config import GenerateJob
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.families import ModelPlan, ModelSpec, Rank


class CountingJob(RankJob[str]):
    """A job that loads nothing: it notes what it was planned and built with."""

    def __init__(self) -> None:
        self.checked: list[ModelPlan] = []
        self.ranks: list[Rank] = []

    def check(self, config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> None:
        self.checked.append(plan)

    def build(self, rank: Rank) -> str:
        self.ranks.append(rank)
        return "built"

    def run(self, rank: Rank, built: str) -> int:
        return 0 if built == "built" else 3


def test_one_process_plans_once_and_builds_from_that_plan() -> None:
    ns = build_parser().parse_args(["generate", "--engine", "none", "--tp", "1", "--prompt", "x"])
    job = CountingJob()
    assert start(ns, lambda ns: GenerateJob(("x",)), job) == 0
    assert len(job.checked) == 1  # planned (and checked) once, in start
    (rank,) = job.ranks
    assert rank.plan is job.checked[0]
    assert rank.config.parallel == rank.plan.parallel  # the config with the layout resolved


def test_the_rank_trampoline_is_reached_through_the_runtime_package_only() -> None:
    """``runtime/_rank_entry.py`` is the launcher's (run by path); the commands and the server
    use its exits by their public names (``runtime.end_now``, ``runtime.end_by_signal``)."""
    import ast
    from pathlib import Path

    import torch_tensorrt_dist
    from torch_tensorrt_dist import runtime
    from torch_tensorrt_dist.runtime import _rank_entry

    assert runtime.end_now is _rank_entry.end_now
    assert runtime.end_by_signal is _rank_entry.end_by_signal
    assert runtime.FAILURE_DIR_ENV == _rank_entry.FAILURE_DIR_ENV
    package = Path(torch_tensorrt_dist.__file__).parent
    private = []
    for path in package.rglob("*.py"):
        if path.parent.name == "runtime":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
                if "torch_tensorrt_dist.runtime._rank_entry" in names:
                    private.append(str(path.relative_to(package)))
    assert private == []
