"""``ServerProcess.memory``: the resident bytes of a server's whole process group (the bench's
check that a stalled client does not make the server hold its stream)."""

from __future__ import annotations

import sys

import pytest

from torch_tensorrt_dist.bench.serve_load import ServerProcess

# a parent that starts a child holding 64 MiB, then says it is up as our server does
_SERVER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import sys, time; b = bytearray(64 << 20); print('ok', flush=True); time.sleep(60)"],
    stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print("serving demo at http://127.0.0.1:1/v1", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_counts_every_process_of_the_group() -> None:
    server = ServerProcess([], command=[sys.executable, "-c", _SERVER], start_timeout_s=60)
    with server:
        held = server.memory()
        # the child's 64 MiB plus two interpreters: more than the child's buffer alone
        assert held > (64 << 20)
        server.kill()
    assert server.memory() == 0  # the group is gone
