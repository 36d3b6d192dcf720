"""Each rank's intra-op threads: ``--threads``, else ``OMP_NUM_THREADS``, else its share of the
cores it is given (``runtime/threads.py``); and what a command's rank reports."""

from __future__ import annotations

import json

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.runtime.threads import (
    cores_given,
    rank_thread_count,
    threads_for,
    use_threads,
)


@pytest.mark.parametrize(
    ("cores", "local", "flag", "env", "want"),
    [
        (16, 1, None, None, 16),  # one rank: every core it may run on
        (16, 2, None, None, 8),  # two ranks on the node share them
        (16, 3, None, None, 5),  # rounded down
        (2, 4, None, None, 1),  # more ranks than cores: never below 1
        (16, 2, None, "3", 3),  # OMP_NUM_THREADS overrides the share
        (16, 2, None, " 6,2 ", 6),  # a nested list: its first level
        (16, 2, None, "", 8),  # set but empty: as unset
        (16, 2, 5, "3", 5),  # --threads overrides both
        (1, 8, 12, None, 12),  # even beyond the cores given
    ],
)
def test_threads_for(cores: int, local: int, flag: int | None, env: str | None, want: int) -> None:
    assert threads_for(cores, local, flag, env) == want


@pytest.mark.parametrize(
    ("cores", "local", "flag", "env", "want"),
    [
        (2, 1, None, None, 1),  # serve on 2 cores: one for the HTTP process
        (16, 1, None, None, 15),
        (1, 1, None, None, 1),  # never below 1
        (17, 2, None, None, 8),
        (2, 1, None, "2", 2),  # OMP_NUM_THREADS and --threads as given
        (2, 1, 2, None, 2),
    ],
)
def test_a_reserved_core_is_left_out_of_the_share(
    cores: int, local: int, flag: int | None, env: str | None, want: int
) -> None:
    assert threads_for(cores, local, flag, env, reserve=1) == want


def test_serve_in_one_process_reserves_a_core_for_its_http_process() -> None:
    from torch_tensorrt_dist.cli import build_parser
    from torch_tensorrt_dist.cli._generate_job import GenerateRankJob
    from torch_tensorrt_dist.cli._options import run_config
    from torch_tensorrt_dist.cli._serve_job import ServeRankJob
    from torch_tensorrt_dist.config import GenerateJob, ServeJob

    def config(argv: list[str], job: GenerateJob | ServeJob):  # type: ignore[no-untyped-def]
        return run_config(build_parser().parse_args(argv), job)

    serve = ["serve", "--engine", "eager"]
    assert ServeRankJob().reserved_cores(config(serve, ServeJob())) == 1
    assert ServeRankJob().reserved_cores(config([*serve, "--tp", "2"], ServeJob())) == 0
    generate = config(["generate", "--prompt", "x"], GenerateJob(("x",)))
    assert GenerateRankJob().reserved_cores(generate) == 0


@pytest.mark.parametrize(
    ("flag", "env", "message"),
    [
        (0, None, "--threads must be an integer >= 1, got 0"),
        (None, "0", "OMP_NUM_THREADS='0' is not a thread count: set it to an integer >= 1, or"),
        (None, "four", "OMP_NUM_THREADS='four' is not a thread count"),
        (None, "-2", "OMP_NUM_THREADS='-2' is not a thread count"),
    ],
)
def test_bad_thread_counts_are_refused(flag: int | None, env: str | None, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        threads_for(8, 1, flag, env)
    assert str(info.value).startswith(message)


def test_a_rank_takes_its_share_of_the_cores_and_restores_the_threads() -> None:
    before = torch.get_num_threads()
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    assert rank_thread_count(None, torchrun) == max(1, cores_given() // 2)
    assert rank_thread_count(None, {**torchrun, "OMP_NUM_THREADS": "3"}) == 3
    assert rank_thread_count(5, {**torchrun, "OMP_NUM_THREADS": "3"}) == 5
    mpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}  # one node: 4 local ranks
    assert rank_thread_count(None, {**mpi, "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == max(
        1, cores_given() // 4
    )
    with use_threads(3) as n:
        assert n == 3 and torch.get_num_threads() == 3
    assert torch.get_num_threads() == before


def test_generate_reports_the_threads_it_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch_tensorrt_dist.cli import main

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    base = ["generate", "--engine", "none", "--max-new-tokens", "2", "--json", "--prompt", "a"]
    assert main([*base, "--threads", "1"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["threads"] == 1
    assert main(base) == 0  # one process: every core it is given
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["threads"] == threads_for(cores_given(), 1, None, None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as torchrun sets it
    assert main(base) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["threads"] == 1
