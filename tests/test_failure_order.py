"""Which rank failed first, with controlled times: the records ranks leave, the exits the
launcher sees (``ExitEvent``), and a rank that failed only because a peer had gone. Then the
exit watch itself, over its real Unix socket, with rank processes that end in every way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from torch_tensorrt_dist.runtime import _rank_entry
from torch_tensorrt_dist.runtime.exit_watch import ExitWatch, parse_proc_stat
from torch_tensorrt_dist.runtime.failures import (
    ExitEvent,
    FailedRank,
    exit_status,
    is_peer_loss,
    pick_first_failure,
)

GLOO_RESET = (
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
    "[127.0.0.1]:64180: Connection reset by peer. This is typically caused by a remote worker "
    "hanging or bugs in the application."
)
GLOO_CLOSED = (
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed "
    "by peer [127.0.0.1]:49043. This is typically caused by a remote worker crashing."
)
AOTI_WAIT = (
    "RuntimeError: run_func_( container_handle_, ...) API call failed at aoti_runner: "
    "aoti_torch_cpu__c10d_functional_wait_tensor(buf3) API call failed"
)


def _rec(rank: int, t: float, error: str, **more: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "exit_code": 1,
        "time": t,
        "error": error,
        "host": "vm",
        "pid": 100 + rank,
        "follows": None,
        **more,
    }


def test_peer_loss_is_told_by_the_error_or_what_it_came_from() -> None:
    for error in (GLOO_RESET, GLOO_CLOSED, AOTI_WAIT, "BrokenPipeError: [Errno 32] Broken pipe"):
        assert is_peer_loss({"error": error}), error
    store = "DistNetworkError: failed to recv, got 0 bytes. Connection was likely closed."
    chained = {
        "error": "ScheduleMismatchError: could not reach the c10d store",
        "traceback": f"Traceback ...\n{store}\n\nThe above exception was the direct cause ...",
    }
    assert is_peer_loss(chained)
    assert is_peer_loss({"error": "DistributedSetupError: rank 0: ...", "peer_lost": True})
    # the rank's own errors, a collective that timed out, a frame that only calls wait_tensor
    assert not is_peer_loss({"error": "ArtifactError: rank-1/weights.safetensors: bad hash"})
    assert not is_peer_loss({"error": "RuntimeError: [gloo] Timed out waiting 3000ms for recv"})
    frame = {"error": "ValueError: bad shape", "traceback": "  y = wait_tensor(x)\nValueError"}
    assert not is_peer_loss(frame)


def test_mpirun_named_the_peer_that_lost_the_killed_rank() -> None:
    # The flaky case, replayed: rank 1 is SIGKILLed at 10.0; rank 0's all_reduce breaks and it
    # records the reset at 10.2 and exits 1 at 10.3. mpirun, slow under load, reaps both in one
    # go and names rank 0 (exit code 1) as the job's first failure.
    failed = {0: FailedRank(0, exit_code=1)}
    records = {0: _rec(0, 10.2, GLOO_RESET)}
    exits = {
        1: ExitEvent(1, 10.0, signal=9, pid=101, host="vm"),  # its zombie's status: SIGKILL
        0: ExitEvent(0, 10.3, said=True, exit_code=1, pid=100, host="vm"),
    }
    first = pick_first_failure(failed, records, exits)
    assert first == FailedRank(1, signal=9, host="vm", pid=101)
    assert exit_status(first, 1) == 137
    # the watch saw it end without a word but could not read how: still rank 1, "failed"
    unknown = {**exits, 1: ExitEvent(1, 10.0, pid=101, host="vm")}
    assert pick_first_failure(failed, records, unknown) == FailedRank(1, host="vm", pid=101)
    # the exit order alone decides, whatever order the launcher's report is in
    assert pick_first_failure({}, records, exits) == FailedRank(1, signal=9, host="vm", pid=101)
    # no watch (another node) and nothing else known: the peer's record is all there is
    assert pick_first_failure(failed, records).rank == 0  # type: ignore[union-attr]


def test_a_lost_peer_never_beats_a_refusal_even_when_recorded_earlier() -> None:
    # rank 1 refused, then closed its process group in a `finally` before its record's time
    # was taken: rank 0's "closed by peer" carries the earlier time
    records = {0: _rec(0, 10.1, GLOO_CLOSED), 1: _rec(1, 10.4, "ArtifactError: rank-1/x bad")}
    failed = {0: FailedRank(0, exit_code=1, pid=100), 1: FailedRank(1, exit_code=2, pid=101)}
    first = pick_first_failure(failed, records)
    assert first is not None and (first.rank, first.detail) == (1, "ArtifactError: rank-1/x bad")
    # a compiled graph's failed wait on rank 0 (issue 18's case) is a lost peer too
    records[0] = _rec(0, 10.1, AOTI_WAIT)
    assert pick_first_failure(failed, records).rank == 1  # type: ignore[union-attr]


def test_a_rank_aborted_after_the_refusal_is_not_the_cause() -> None:
    # rank 0 refused at 10.2 and exited at 10.3; rank 1's communicator watchdog then aborted
    # the process (SIGABRT, no record) at 10.5. torchrun lists both.
    failed = {0: FailedRank(0, exit_code=2, pid=100), 1: FailedRank(1, signal=6, pid=101)}
    records = {0: _rec(0, 10.2, "CheckpointError: model.safetensors is truncated")}
    exits = {
        0: ExitEvent(0, 10.3, said=True, exit_code=2, pid=100),
        1: ExitEvent(1, 10.5, signal=6, pid=101),
    }
    first = pick_first_failure(failed, records, exits)
    assert first is not None and (first.rank, first.exit_code) == (0, 2)
    # two abrupt deaths: the one that ended first, not the lower rank
    failed = {0: FailedRank(0, signal=6, pid=100), 1: FailedRank(1, signal=9, pid=101)}
    exits = {0: ExitEvent(0, 10.6, signal=6), 1: ExitEvent(1, 10.2, signal=9)}
    assert pick_first_failure(failed, {}, exits) == FailedRank(1, signal=9, pid=101)
    # a rank that said "exit 0" and then crashed in its last instant: the launcher's report wins
    exits = {1: ExitEvent(1, 10.2, said=True, exit_code=0, pid=101, host="vm")}
    first = pick_first_failure({1: FailedRank(1, signal=6)}, {}, exits)
    assert first == FailedRank(1, signal=6, pid=101, host="vm")


def test_exits_that_are_not_failures_are_not_causes() -> None:
    records = {1: _rec(1, 10.5, "ValueError: bad")}
    exits = {
        0: ExitEvent(0, 9.0, said=True, exit_code=0),  # finished its part early
        2: ExitEvent(2, 9.5, exit_code=0),  # os._exit(0): no word, but its status says so
        3: ExitEvent(3, 10.8, signal=15),  # stopped by the launcher
    }
    assert pick_first_failure({}, records, exits).rank == 1  # type: ignore[union-attr]
    # a record that follows rank 1 names it before a rank that ended without a word
    records = {0: _rec(0, 10.6, "RankFailedError: rank 1 failed ...", follows=1)}
    exits = {2: ExitEvent(2, 10.0)}
    assert pick_first_failure({}, records, exits).rank == 1  # type: ignore[union-attr]
    assert pick_first_failure({}, {}, {3: ExitEvent(3, 1.0, signal=15)}) is None


def test_parse_proc_stat() -> None:
    line = "4242 (python (rank) 1) Z 7 7 7 0 -1 4 " + " ".join(["0"] * 42) + " 9\n"
    assert parse_proc_stat(line) == ("Z", 9)
    assert parse_proc_stat("4242 (x) R 1 2") is None


RANK_PROGRAM = """
import os, signal, sys, time
how = sys.argv[1]
if how == "fork":  # a child that outlives the rank must not hold the watch open
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    with open(sys.argv[2], "w") as fh:
        fh.write(str(child))
    os.kill(os.getpid(), signal.SIGKILL)
if how == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if how == "raise":
    raise ValueError("bad")
if how == "exit0":
    os._exit(0)
"""


def _wait_for(watch: ExitWatch, ranks: set[int], limit_s: float = 60.0) -> dict[int, ExitEvent]:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        events = watch.events()
        if ranks <= set(events) and all(
            e.said or e.signal is not None or e.exit_code is not None for e in events.values()
        ):
            return events
        time.sleep(0.01)
    raise AssertionError(f"the watch saw {watch.events()}, not ranks {ranks}")


def test_exit_watch_sees_every_way_a_rank_ends(tmp_path: Path) -> None:
    program = tmp_path / "rank.py"
    program.write_text(RANK_PROGRAM)
    ways = ["ok", "raise", "kill", "exit0", "fork"]
    child_file = tmp_path / "child.pid"
    with ExitWatch(str(tmp_path)) as watch:
        procs = []
        for rank, how in enumerate(ways):
            env = {**os.environ, _rank_entry.FAILURE_DIR_ENV: str(tmp_path), "RANK": str(rank)}
            cmd = [sys.executable, _rank_entry.__file__, str(program), how, str(child_file)]
            procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL))
        # not reaped yet: the killed ranks stay zombies, so the watch reads their signal
        try:
            events = _wait_for(watch, set(range(len(ways))))
            child = int(child_file.read_text())
            os.kill(child, 0)  # still alive when its parent's end was seen
        finally:
            codes = [p.wait(60) for p in procs]
            if child_file.exists():
                os.kill(int(child_file.read_text()), signal.SIGKILL)
    assert codes == [0, 1, -9, 0, -9]
    assert [(e.said, e.exit_code, e.signal) for _, e in sorted(events.items())] == [
        (True, 0, None),
        (True, 1, None),
        (False, None, signal.SIGKILL),
        (False, 0, None),
        (False, None, signal.SIGKILL),  # seen at its death, while its child still sleeps
    ]
    assert events[2].pid == procs[2].pid


def test_function_ranks_say_how_they_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_rank_entry.FAILURE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(_rank_entry, "_watch", None)
    with ExitWatch(str(tmp_path)) as watch:
        assert _rank_entry.run_function(int, "7") == 7
        _rank_entry._forget_watch()  # what the process's end does
        events = _wait_for(watch, {0})
    assert (events[0].said, events[0].exit_code, events[0].pid) == (True, 0, os.getpid())


REFUSED = "OSError: [Errno 111] Connection refused"  # a checkpoint fetch, not a peer


def test_peer_loss_is_read_in_exception_lines_not_source_lines() -> None:
    fetch = (
        'Traceback (most recent call last):\n  File "load.py", line 9, in fetch\n'
        '    raise OSError("connection refused: is the hub up?")\n'
        "ConnectionRefusedError: [Errno 111] Connection refused\n\n"
        "The above exception was the direct cause of the following exception:\n"
    )
    assert not is_peer_loss({"error": "CheckpointError: could not fetch x", "traceback": fetch})
    source = '  File "run.py", line 3, in main\n    pipe.write(b"x")  # broken pipe here?\n'
    assert not is_peer_loss({"error": "ValueError: bad shape", "traceback": source})
    # a chained error of the transport still tells
    chained = f"{fetch}RuntimeError: [../gloo/transport/tcp/pair.cc:545] Connection reset by peer"
    assert is_peer_loss({"error": "ScheduleMismatchError: step 3", "traceback": chained})


def test_a_genuine_connection_refused_is_the_cause_when_it_came_first() -> None:
    # review 3, F1: rank 0 fails a fetch (Connection refused) at 100.0 and mpirun names it;
    # mpirun then stops rank 1 and reaps it before the watch reads its status (no word)
    failed = {0: FailedRank(0, exit_code=1)}
    records = {0: _rec(0, 100.0, REFUSED)}
    exits = {
        0: ExitEvent(0, 100.1, said=True, exit_code=1, pid=100, host="vm"),
        1: ExitEvent(1, 100.3, pid=11, host="h"),
    }
    first = pick_first_failure(failed, records, exits)
    assert first == FailedRank(0, exit_code=1, host="vm", pid=100, detail=REFUSED)
    # a peer's own error after it (its collective broke) does not win either
    records[1] = _rec(1, 100.5, "RuntimeError: expected 4 tokens, got 0")
    assert pick_first_failure(failed, records, exits).rank == 0  # type: ignore[union-attr]
    # the same words after another rank ended are a lost peer: that rank is named
    records = {0: _rec(0, 100.4, REFUSED)}
    exits = {0: ExitEvent(0, 100.5, said=True, exit_code=1), 1: ExitEvent(1, 100.2, pid=11)}
    assert pick_first_failure(failed, records, exits).rank == 1  # type: ignore[union-attr]
    # a transport's own words are a lost peer, but a silent rank that ended after the
    # record is a stopped one: the record is named
    records = {0: _rec(0, 100.0, GLOO_RESET)}
    exits = {1: ExitEvent(1, 100.3, pid=11)}
    assert pick_first_failure(failed, records, exits).rank == 0  # type: ignore[union-attr]


def test_an_abrupt_death_noticed_late_still_comes_first() -> None:
    # review 3, F2: rank 0 is SIGKILLed; rank 1 records a timeout 5 ms later, and the watch,
    # loaded, sees rank 0's end 20 ms after that
    records = {1: _rec(1, 10.005, "RuntimeError: [gloo] Timed out waiting 3000ms for recv")}
    exits = {
        0: ExitEvent(0, 10.025, signal=9, pid=100),
        1: ExitEvent(1, 10.03, said=True, exit_code=1, pid=101),
    }
    assert pick_first_failure({}, records, exits) == FailedRank(0, signal=9, pid=100)
    # os._exit(3): no word, no record, the same
    exits[0] = ExitEvent(0, 10.025, exit_code=3, pid=100)
    assert pick_first_failure({}, records, exits) == FailedRank(0, exit_code=3, pid=100)
    # a record well before the death (more than the grace) is the cause
    records = {1: _rec(1, 9.7, "ValueError: bad")}
    assert pick_first_failure({}, records, exits).rank == 1  # type: ignore[union-attr]


def test_a_remote_rank_named_by_its_exit_code_does_not_beat_a_local_error() -> None:
    # review 3, F7: multi-node mpirun names rank 1 on another node (exit code 1: it lost its
    # peer); local rank 0 recorded its own error
    failed = {1: FailedRank(1, exit_code=1)}
    records = {0: _rec(0, 10.2, "ValueError: bad")}
    exits = {0: ExitEvent(0, 10.3, said=True, exit_code=1, pid=100)}
    assert pick_first_failure(failed, records, exits).rank == 0  # type: ignore[union-attr]
    # a remote rank killed by a signal still comes first
    killed = {1: FailedRank(1, signal=9, host="node-b")}
    assert pick_first_failure(killed, records, exits) == killed[1]
    # and one named by its code comes before a local rank that only lost its peer
    records = {0: _rec(0, 10.2, GLOO_RESET)}
    assert pick_first_failure(failed, records, exits) == failed[1]


def test_a_death_seen_after_a_failed_rank_ended_does_not_take_the_grace() -> None:
    # rank 0 records its own error at 10.2 and ends at 10.21; rank 1's gloo thread then aborts
    # the process (SIGABRT) as its peer went, seen at 10.3: within the grace, but after rank
    # 0's end, which the watch saw first
    records = {0: _rec(0, 10.2, "ValueError: bad")}
    exits = {
        0: ExitEvent(0, 10.21, said=True, exit_code=1, pid=100),
        1: ExitEvent(1, 10.3, signal=6, pid=101),
    }
    failed = {0: FailedRank(0, exit_code=1), 1: FailedRank(1, signal=6)}
    assert pick_first_failure(failed, records, exits).rank == 0  # type: ignore[union-attr]
    # seen in the other order, the death is the cause
    exits[0] = ExitEvent(0, 10.31, said=True, exit_code=1, pid=100)
    assert pick_first_failure(failed, records, exits).rank == 1  # type: ignore[union-attr]
