"""A command started on every rank by another launcher (plain torchrun, mpirun) prints what
every rank refuses alike once per node, and a rank's own refusal where it happened."""

from __future__ import annotations

import pytest

from torch_tensorrt_dist.cli._failures import mark_alike, prints_refusal
from torch_tensorrt_dist.errors import ConfigError, DistributedSetupError, RankFailedError


def _torchrun(rank: int, world: int = 4, local: int = 2) -> dict[str, str]:
    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank % local}
    env |= {"LOCAL_WORLD_SIZE": local, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": 1}
    return {name: str(value) for name, value in env.items()}


def test_who_prints_a_refusal() -> None:
    same = mark_alike(ConfigError("--pp 1 x --tp 1 needs 1 ranks, but the launcher started 4"))
    # before joining the world every rank refuses alike: the lowest local rank of each node
    assert [prints_refusal(same, _torchrun(r), joined=False) for r in range(4)] == [
        True,
        False,
        True,
        False,
    ]
    # after joining, a rank's own error is its own
    own = ConfigError("rank-3/weights.safetensors is corrupt")
    assert prints_refusal(own, _torchrun(3), joined=True)
    # ranks repeating rank 3's failure (runtime.agree): quiet on rank 3's node (node 1),
    # said once on the other node
    repeat = RankFailedError("rank 3 failed the artifact check: ...", failed_rank=3)
    assert [prints_refusal(repeat, _torchrun(r), joined=True) for r in range(3)] == [
        True,
        False,
        False,
    ]
    # Open MPI's names, one node
    mpi = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    assert not prints_refusal(same, mpi, joined=False)
    assert prints_refusal(
        same, {**mpi, "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_RANK": "0"}, joined=False
    )
    # one process, or variables that do not fit: always said
    assert prints_refusal(same, {}, joined=False)
    assert prints_refusal(same, {**_torchrun(1), "LOCAL_RANK": "9"}, joined=False)


def test_a_refusal_not_known_alike_is_printed_by_every_rank() -> None:
    # review 3, F6: `torchrun --nproc-per-node 4` on a node with 2 GPUs; only local ranks 2
    # and 3 refuse, before joining, and ranks 0 and 1 would only time out in the rendezvous
    no_gpu = DistributedSetupError(
        "local rank 2 has no GPU: 2 visible on this node (CUDA_VISIBLE_DEVICES=<unset>). "
        "Start at most 2 processes per node (--nproc-per-node 2)"
    )
    assert prints_refusal(no_gpu, _torchrun(2, world=4, local=4), joined=False)
    # a ConfigError that no option or world check marked is said where it was raised, too
    own = ConfigError("rank-2/weights.safetensors is corrupt")
    assert prints_refusal(own, _torchrun(2, world=4, local=4), joined=False)
    # the world check marks its refusal
    assert not prints_refusal(_world_refusal(), _torchrun(1), joined=False)


def _world_refusal() -> ConfigError:
    from torch_tensorrt_dist.cli._failures import check_world

    with pytest.MonkeyPatch.context() as mp:
        for name, value in _torchrun(1).items():
            mp.setenv(name, value)
        with pytest.raises(ConfigError) as err:
            check_world({"tp": 2})
    return err.value


#: what each rank of `torchrun --nproc-per-node 2 -m torch_tensorrt_dist generate ...` refuses
#: alike: the world check and an option check (``cli._failures.alike_on_every_rank``)
ALIKE = [
    (
        ["--tp", "1", "--max-new-tokens", "2"],
        "error: --pp 1 x --tp 1 needs 1 ranks, but the launcher started 2; generate uses every",
    ),
    (["--tp", "2", "--max-new-tokens", "0"], "error: --max-new-tokens must be"),
]


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize(("argv", "said"), ALIKE, ids=["world", "option"])
def test_a_refusal_alike_on_every_rank_is_said_once_under_plain_torchrun(
    rank: int,
    argv: list[str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torch_tensorrt_dist.cli import main
    from torch_tensorrt_dist.runtime._rank_entry import FAILURE_DIR_ENV

    monkeypatch.delenv(FAILURE_DIR_ENV, raising=False)
    for name, value in _torchrun(rank, world=2).items():
        monkeypatch.setenv(name, value)
    assert main(["generate", "--engine", "none", *argv, "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) if rank == 0 else err == ""


def test_the_world_must_be_the_product_of_the_parallel_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torch_tensorrt_dist.cli._failures import check_world

    for name, value in _torchrun(0, world=4).items():
        monkeypatch.setenv(name, value)
    assert check_world({"ep": 2, "tp": 2}) == 4
    with pytest.raises(ConfigError) as err:
        check_world({"pp": 1, "tp": 2}, note="generate uses every rank: ")
    assert str(err.value) == (
        "--pp 1 x --tp 2 needs 2 ranks, but the launcher started 4; generate uses every rank: "
        "start 2 or change --pp/--tp"
    )
