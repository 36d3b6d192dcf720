"""Rank 0's per-thread CPU metric (``serving/metrics.py``): read from ``/proc/self/task``."""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest

pytest.importorskip("prometheus_client")

from torch_tensorrt_dist.serving.metrics import Metrics, thread_cpu_seconds

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread CPU time is read from Linux's /proc"
)


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _value(metrics: Metrics, thread: str) -> float | None:
    text = metrics.render().decode()
    name = f'torchtrt_thread_cpu_seconds_total{{thread="{thread}"}}'
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def test_a_busy_thread_counts_its_cpu_and_a_sleeping_one_does_not() -> None:
    ids: dict[str, int] = {}
    go, done = threading.Event(), threading.Event()

    def busy() -> None:
        ids["busy"] = threading.get_native_id()
        go.wait()
        _burn(0.3)
        done.wait()

    def sleepy() -> None:
        ids["sleepy"] = threading.get_native_id()
        go.wait()
        done.wait()

    threads = [threading.Thread(target=busy), threading.Thread(target=sleepy)]
    for t in threads:
        t.start()
    while len(ids) < 2:
        time.sleep(0.01)
    metrics = Metrics()
    metrics.threads.track("step", ids["busy"])
    metrics.threads.track("http", ids["sleepy"])
    before = _value(metrics, "step")
    go.set()
    deadline = time.monotonic() + 30
    while (thread_cpu_seconds(ids["busy"]) or 0.0) < 0.25:  # its 0.3 s, in clock ticks
        assert time.monotonic() < deadline
        time.sleep(0.02)
    after = _value(metrics, "step")
    sleepy_cpu = _value(metrics, "http")
    done.set()
    for t in threads:
        t.join()
    assert before is not None and after is not None and sleepy_cpu is not None
    assert after - before >= 0.25
    assert sleepy_cpu < 0.1
    # an ended thread is left out, not reported as 0 or as another thread's time (the OS
    # thread may outlive join() by a moment: /proc lists it until it has exited)
    deadline = time.monotonic() + 30
    while any(thread_cpu_seconds(tid) is not None for tid in ids.values()):
        assert time.monotonic() < deadline, "a joined thread is still listed in /proc"
        time.sleep(0.01)
    assert _value(metrics, "step") is None and _value(metrics, "http") is None


def test_the_metric_reads_the_thread_it_was_given() -> None:
    metrics = Metrics()
    metrics.threads.track("step", threading.get_native_id())
    _burn(0.05)
    value = _value(metrics, "step")
    assert value is not None and value > 0
    assert value == pytest.approx(thread_cpu_seconds(threading.get_native_id()), abs=0.05)
