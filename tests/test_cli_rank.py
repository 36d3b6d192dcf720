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
