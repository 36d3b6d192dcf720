"""How a rank's failure reaches the user, without launching ranks: the record a rank writes,
the choice of the rank that failed first, the two lines printed, mpirun's banners, ``agree``
over a real c10d store (threads as ranks), and the parent-side ``compile --out`` checks."""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from torch_tensorrt_dist.artifacts.build import check_output_dir
from torch_tensorrt_dist.artifacts.checks import describe_run
from torch_tensorrt_dist.errors import ArtifactError, CheckpointError, RankFailedError
from torch_tensorrt_dist.runtime import _rank_entry
from torch_tensorrt_dist.runtime.agree import agree
from torch_tensorrt_dist.runtime.failures import (
    FailedRank,
    cause_record,
    format_failure,
    pick_first_failure,
    read_failure_records,
)
from torch_tensorrt_dist.runtime.launcher import LaunchOptions, rendezvous_problem
from torch_tensorrt_dist.runtime.mpi import BannerFilter


def _raise_inside() -> None:
    raise CheckpointError("model.safetensors is truncated: tensor 'w' ends at byte 9")


def test_record_of_an_exit_raised_from_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_rank_entry.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    try:
        try:
            _raise_inside()
        except CheckpointError as exc:
            raise SystemExit(2) from exc
    except SystemExit as exit_:
        assert _rank_entry.write_record(2, exit_, when=12.5)
    rec = read_failure_records(str(tmp_path))[1]
    assert rec["error"] == (
        "CheckpointError: model.safetensors is truncated: tensor 'w' ends at byte 9"
    )
    assert (rec["exit_code"], rec["time"], rec["pid"], rec["follows"]) == (
        2,
        12.5,
        os.getpid(),
        None,
    )
    assert rec["traceback"].startswith("Traceback (most recent call last)")
    assert "in _raise_inside" in rec["traceback"]


def test_record_follows_the_rank_that_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(_rank_entry.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    err = RankFailedError("rank 1 failed the artifact check: ...", failed_rank=1)
    assert _rank_entry.describe(err)["follows"] == 1
    assert _rank_entry.describe(ValueError("a\nb"))["error"] == "ValueError: a"  # one line
    assert _rank_entry.describe(SystemExit("bad option"))["error"] == "bad option"
    monkeypatch.delenv(_rank_entry.FAILURE_DIR_ENV)
    assert not _rank_entry.write_record(1, err)  # no folder: the rank prints instead


def test_function_rank_records_and_exits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_rank_entry.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    assert _rank_entry.run_function(lambda x: x + 1, 1) == 2
    assert read_failure_records(str(tmp_path)) == {}
    with pytest.raises(SystemExit) as ended:
        _rank_entry.run_function(int, "x")
    assert ended.value.code == 1
    rec = read_failure_records(str(tmp_path))[3]
    assert rec["error"] == "ValueError: invalid literal for int() with base 10: 'x'"


def test_script_rank_traceback_starts_at_the_program(tmp_path: Path) -> None:
    import subprocess

    script = tmp_path / "app.py"
    script.write_text("def main():\n    raise KeyError('k')\n\nmain()\n")
    folder = tmp_path / "f"
    folder.mkdir()
    env = {**os.environ, _rank_entry.FAILURE_DIR_ENV: str(folder), "RANK": "0"}
    cmd = [sys.executable, _rank_entry.__file__, str(script)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr == ""  # recorded, not printed
    rec = read_failure_records(str(folder))[0]
    assert rec["error"] == "KeyError: 'k'" and rec["refusal"] is False
    frames = [ln for ln in rec["traceback"].splitlines() if ln.strip().startswith("File ")]
    assert len(frames) == 2 and all(str(script) in f for f in frames), rec["traceback"]
    # no folder here (a rank on another node than the launcher): the rank prints it itself
    env[_rank_entry.FAILURE_DIR_ENV] = str(tmp_path / "elsewhere")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip().endswith("KeyError: 'k'")
    assert not (tmp_path / "elsewhere").exists()


def test_cause_is_the_earliest_rank_failing_on_its_own_account() -> None:
    # rank 1 refused its files; rank 0 repeats it (agree) and happens to record first
    failed = {0: FailedRank(0, exit_code=2, pid=7)}  # torchrun's function entries: one rank
    records = {
        0: {
            "rank": 0,
            "exit_code": 2,
            "time": 1.0,
            "error": "RankFailedError: rank 1 ...",
            "follows": 1,
            "host": "h",
            "pid": 7,
        },
        1: {
            "rank": 1,
            "exit_code": 2,
            "time": 1.2,
            "error": "ArtifactError: rank-1/x bad",
            "follows": None,
            "host": "h",
            "pid": 8,
            "traceback": "Traceback ...",
        },
    }
    first = pick_first_failure(failed, records)
    assert first == FailedRank(
        1, exit_code=2, host="h", pid=8, detail="ArtifactError: rank-1/x bad"
    )
    assert cause_record(first, records) is records[1]
    # rank 1's own record lost (another node): the follower names it
    only = {0: records[0]}
    assert pick_first_failure(failed, only) == FailedRank(
        1, exit_code=2, detail="RankFailedError: rank 1 ..."
    )
    assert cause_record(pick_first_failure(failed, only), only) is None


def test_two_lines_error_first() -> None:
    first = FailedRank(1, exit_code=2, host="vm", pid=8, detail="ArtifactError: rank-1/x bad")
    assert format_failure("torchrun", first, 2) == (
        "rank 1: ArtifactError: rank-1/x bad\n"
        "torchtrt-dist run (torchrun): rank 1 of 2 (on vm, pid 8) exited with code 2; the other "
        "ranks were stopped."
    )


def test_mpirun_failure_banners_are_dropped_other_blocks_kept() -> None:
    rule = "-" * 74 + "\n"
    banner = [rule, "Primary job  terminated normally, but 1 process returned\n", rule]
    other = [rule, "a table the program printed\n", rule]
    f = BannerFilter()
    shown: list[str] = []
    for line in ["rank output\n", *banner, *other, "last\n", rule, "unclosed\n"]:
        shown += f.feed(line)
    shown += f.flush()
    assert shown == ["rank output\n", *other, "last\n", rule, "unclosed\n"]
    assert BannerFilter(keep=True).feed(banner[1]) == [banner[1]]
    long = BannerFilter(max_block=3)
    assert [x for line in [rule, "a\n", "b\n", "c\n"] for x in long.feed(line)] == [
        rule,
        "a\n",
        "b\n",
        "c\n",
    ]


def test_busy_rendezvous_port_in_one_line() -> None:
    exc = RuntimeError(
        "The server socket has failed to listen on any local network address. port: 29777, "
        "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
    )
    text = rendezvous_problem(LaunchOptions(nproc_per_node=2, master_port=29777), exc)
    assert text.startswith("the rendezvous port 127.0.0.1:29777 is already in use")
    assert "choose another --master-port" in text and "\n" not in text
    other = rendezvous_problem(LaunchOptions(nproc_per_node=2, rdzv_endpoint="a:1"), OSError("x"))
    assert other.startswith("the rendezvous at a:1 failed (OSError: x)")


def _agree_on_threads(verdicts: list[BaseException | None], step: str) -> list[str]:
    """Each thread is a rank; they share one real c10d store (a TCPStore). Each call agrees on
    its own ``step`` (the rounds of a step are counted per process and rank)."""
    world = len(verdicts)
    server = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    out: list[str] = [""] * world

    def rank(r: int) -> None:
        store = dist.TCPStore("127.0.0.1", server.port, world, is_master=False)
        try:
            agree(
                verdicts[r],
                step=step,
                store=store,
                rank=r,
                world_size=world,
                timeout=timedelta(seconds=30),
            )
            out[r] = "ok"
        except Exception as exc:
            out[r] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_agree_every_rank_raises_when_one_failed() -> None:
    assert _agree_on_threads([None, None], "step a") == ["ok", "ok"]
    bad = ArtifactError("rank-1/weights.safetensors is corrupt")
    out = _agree_on_threads([None, bad, None], "step b")
    assert out[1] == "ArtifactError: rank-1/weights.safetensors is corrupt"
    expected = "RankFailedError: rank 1 failed step b: ArtifactError: rank-1/weights"
    assert out[0].startswith(expected) and out[2].startswith(expected)
    both = _agree_on_threads([ValueError("a"), ValueError("b")], "step c")
    assert both == ["ValueError: a", "ValueError: b"]  # each its own error


def test_agree_in_one_process_raises_the_error_itself() -> None:
    agree(None, step="nothing")
    with pytest.raises(ValueError, match="mine"):
        agree(ValueError("mine"), step="nothing")


def test_compile_out_checked_before_any_rank(tmp_path: Path) -> None:
    check_output_dir(tmp_path / "new" / "dir")  # created later
    (tmp_path / "art").mkdir()
    for name in ("manifest.json", "rank-0", "tokenizer", ".manifest.json.x.tmp"):
        (tmp_path / "art" / name).write_text("") if "." in name else (
            tmp_path / "art" / name
        ).mkdir()
    check_output_dir(tmp_path / "art")  # an artifact directory: overwritten
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match=r"the output path .*file is a file, not a directory"):
        check_output_dir(tmp_path / "file")
    with pytest.raises(ArtifactError, match=r"cannot be created: .*file is a file"):
        check_output_dir(tmp_path / "file" / "sub")
    (tmp_path / "art" / "notes.txt").write_text("mine")
    with pytest.raises(
        ArtifactError,
        match=r"not empty and is not an artifact directory \(it "
        r"holds notes.txt\)",
    ):
        check_output_dir(tmp_path / "art")


def test_run_described_as_it_is() -> None:
    assert describe_run(1, None, None) == "world size 1 (pp 1 x tp 1)"
    assert describe_run(2, 1, None) == "world size 2 (pp 2 x tp 1)"
    assert describe_run(4, 2, None) == "world size 4 (pp 2 x tp 2)"
    assert describe_run(3, 2, None) == "world size 3, which --tp 2 does not divide"
    assert describe_run(2, 1, 1) == "world size 2, which --tp 1 --pp 1 does not divide"


def test_records_are_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_rank_entry.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    monkeypatch.delenv("RANK", raising=False)
    assert _rank_entry.write_record(3, None)
    data: dict[str, Any] = json.loads((tmp_path / "rank-5.json").read_text())
    assert data["rank"] == 5 and data["error"] is None and data["exit_code"] == 3
