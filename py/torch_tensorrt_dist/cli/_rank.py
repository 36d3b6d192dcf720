"""One way to build a rank, for every command that runs a model (``generate``, ``serve``,
``eval``, ``compile``).

    return start(ns, generate_job_of, GenerateRankJob())   # a command's run(): plan, then run
                                                           # here or launch the ranks

:func:`start` reads the options into a :class:`RunConfig` and has the model's family plan it
(bad input is one line, before any rank starts); then it runs :func:`rank_main` in this process
(one rank, or a rank of another launcher) or launches the ranks, each of which runs
:func:`rank_main`: set its threads, join the world, plan (a rank started by this process; in one
process, the plan of :func:`start`) and load its shard (one verdict of all ranks,
``runtime.agree``), then the command's :class:`RankJob` (``_generate_job``,
``_serve_job``, ``_eval_job``, ``_compile_job``: ``check``, ``build``, ``run``), which the
command names.
"""

from __future__ import annotations

import argparse
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, TypeVar

from torch_tensorrt_dist.cli._failures import (
    alike_on_every_rank,
    check_world,
    print_launch_failure,
    rank_entry,
    refuse,
)
from torch_tensorrt_dist.cli._options import run_config
from torch_tensorrt_dist.config.jobs import Job
from torch_tensorrt_dist.config.run import RunConfig
from torch_tensorrt_dist.errors import TensorRTDistError, VerificationError
from torch_tensorrt_dist.families import ModelPlan, ModelSpec, Rank, checkpoint_spec

__all__ = ["RankJob", "plan_run", "rank_main", "spec_for", "start"]

logger = logging.getLogger(__name__)

B = TypeVar("B")


class RankJob(ABC, Generic[B]):
    """What a command does in each rank once the model is planned: :meth:`check` (also in the
    launching process, before any rank starts), :meth:`build` (with the model, inside the
    loading verdict: what :meth:`run` takes), :meth:`run` (-> the exit code). Each command
    names its own (``cli/_<command>_job.py``); it holds no state, so a launched rank gets it
    with its :meth:`rank_main`."""

    #: cores the job's rank leaves to another process of its command when it is the only rank
    #: (``serve``: its HTTP process, ``runtime/threads.py``)
    reserve_cores: int = 0

    def reserved_cores(self, config: RunConfig) -> int:
        """The cores this rank leaves out of its threads: :attr:`reserve_cores` in one
        process; launched ranks share what the launcher gives them."""
        return self.reserve_cores if config.parallel.world == 1 else 0

    @abstractmethod
    def check(self, config: RunConfig, spec: ModelSpec, plan: ModelPlan) -> None:
        """Refuse what this job cannot run with the planned model (ConfigError)."""

    @abstractmethod
    def build(self, rank: Rank) -> B:
        """What the job runs with: this rank's shard, or its generator."""

    @abstractmethod
    def run(self, rank: Rank, built: B) -> int:
        """The job: the exit code."""

    def rank_main(self, config: RunConfig) -> int:
        """One rank of this job (:func:`rank_main`)."""
        return rank_main(config, self)


def spec_for(config: RunConfig) -> ModelSpec:
    """The spec of the model's family: compiled artifacts, or what ``--model`` is."""
    if config.model.artifacts is not None:
        from torch_tensorrt_dist.families.artifacts import ArtifactsSpec

        return ArtifactsSpec(config.model.artifacts)
    return checkpoint_spec(config)


def plan_run(config: RunConfig, job: RankJob[B]) -> tuple[RunConfig, ModelSpec, ModelPlan]:
    """The model's plan and the job's checks; the config with the layout resolved."""
    spec = spec_for(config)
    plan = spec.plan(config)
    config = config.with_(parallel=plan.parallel)
    job.check(config, spec, plan)
    if config.speculative is not None:  # --draft-model: its config.json, before any weight
        from torch_tensorrt_dist.families.draft import check_draft_plan

        check_draft_plan(config, plan)
    return config, spec, plan


def rank_main(
    config: RunConfig, job: RankJob[B], planned: tuple[ModelSpec, ModelPlan] | None = None
) -> int:
    """One rank of any command: its threads, the world, its shard, the job; the exit code.
    ``planned``: the model's spec and plan where this process has them (:func:`start`, with
    ``config`` as :func:`plan_run` gave it); else the rank plans."""
    import torch.distributed as dist

    from torch_tensorrt_dist.runtime import agreed
    from torch_tensorrt_dist.runtime.distributed import join_world
    from torch_tensorrt_dist.runtime.huge_pages import use_huge_pages
    from torch_tensorrt_dist.runtime.threads import rank_thread_count, use_threads

    # a launched rank's first tensor is yet to come (runtime/huge_pages.py)
    logger.info(use_huge_pages().describe())
    reserve = job.reserved_cores(config)  # cores left to another process of the command
    with alike_on_every_rank():
        threads = rank_thread_count(config.threads, reserve=reserve)
    with use_threads(threads):
        world = check_world(config.parallel.sizes(), note=f"{config.command} uses every rank: ")
        index, device, group = join_world(world)
        # every rank plans and loads its own shard; no rank goes on (echoes a prompt, compiles,
        # runs a collective) until all have (runtime.agree: one rank's error stops every rank)
        what = "artifacts" if config.model.artifacts is not None else "checkpoint"
        with agreed(f"loading the {what}"):
            if planned is None:  # a rank our launcher started
                config, spec, plan = plan_run(config, job)
            else:
                spec, plan = planned
            rank = Rank(config, spec, plan, index, world, device, group, threads)
            built = job.build(rank)
        code = job.run(rank, built)
    if code == 0 and world > 1 and dist.is_initialized():
        dist.destroy_process_group()  # a normal end; after an error the launcher stops the ranks
    return code


def start(
    ns: argparse.Namespace,
    job_of: Callable[[argparse.Namespace], Job],
    job: RankJob[B],
    *,
    launch_ranks: Callable[[RunConfig], int] | None = None,
) -> int:
    """A command's run: its options as a :class:`RunConfig` (``job_of`` reads the command's
    own), planned before any rank starts; then ``job`` in :func:`rank_main` here, or the ranks
    launched (``launch_ranks``: the command's own way to launch them)."""
    from torch_tensorrt_dist.runtime import is_launched, launch
    from torch_tensorrt_dist.runtime.threads import rank_thread_count

    launched = is_launched(os.environ)
    try:
        with alike_on_every_rank():  # options and files: every rank refuses them alike
            config = run_config(ns, job_of(ns))
            config, spec, plan = plan_run(config, job)
            rank_thread_count(config.threads)  # a bad OMP_NUM_THREADS too
        single = config.parallel.world == 1 or launched
        if config.engine == "tensorrt":  # what to install, before any rank starts
            from torch_tensorrt_dist.conversion.availability import require_tensorrt_engine

            require_tensorrt_engine(isolated=not single)  # the launcher stays free of CUDA
        if single:
            return rank_main(config, job, (spec, plan))
    except VerificationError as exc:  # a wrong engine, not bad input
        return refuse(exc, 1)
    except TensorRTDistError as exc:
        return refuse(exc, 2)
    if launch_ranks is not None:
        return launch_ranks(config)
    from torch_tensorrt_dist.runtime.huge_pages import rank_env

    level = logging.getLogger().getEffectiveLevel()  # -v reaches the ranks
    result = launch(
        rank_entry, config.parallel.world, [job.rank_main, config, level], env=rank_env(os.environ)
    )
    print_launch_failure(result, verbose=ns.verbose)
    return int(result.returncode)
