"""Transparent huge pages for torch's large CPU tensors (``runtime/huge_pages.py``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torch_tensorrt_dist.runtime.huge_pages import (
    THP_ENV,
    HugePages,
    rank_env,
    system_thp_mode,
    wanted,
)


def test_the_environment_decides_and_unset_means_on():
    assert wanted({})
    assert wanted({THP_ENV: "1"})
    assert not wanted({THP_ENV: "0"})
    assert not wanted({THP_ENV: " "})
    # launched ranks get the variable from their first line, unless the user set it
    assert rank_env({}) == {THP_ENV: "1"}
    assert rank_env({THP_ENV: "0"}) == {}


def test_the_system_mode_is_the_bracketed_word(tmp_path: Path):
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert system_thp_mode(str(f)) == "madvise"
    f.write_text("garbage\n")
    assert system_thp_mode(str(f)) is None
    assert system_thp_mode(str(tmp_path / "absent")) is None


def test_each_state_says_what_it_does():
    assert "off (THP_MEM_ALLOC_ENABLE=0)" in HugePages(False, "madvise").describe()
    assert "mode is never" in HugePages(True, "never").describe()
    assert "on (system THP mode madvise)" in HugePages(True, "madvise", True).describe()
    assert "not granted" in HugePages(True, "madvise", False).describe()


_PROBE = textwrap.dedent(
    """
    import os, torch
    from torch_tensorrt_dist.cli import build_parser  # the CLI's imports, as main has them
    from torch_tensorrt_dist.runtime.huge_pages import THP_ENV, use_huge_pages
    use_huge_pages()
    assert THP_ENV not in os.environ or os.environ[THP_ENV] == "0", "the environment is restored"
    build_parser()
    x = torch.ones(64 * 2**18)  # 64 MiB
    start = x.data_ptr()
    huge = 0
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= start < hi
            elif inside and head == "AnonHugePages:":
                huge = int(line.split()[1])
    print(huge)
    """
)


def _huge_kib(env_value: str | None) -> int:
    import os

    env = {k: v for k, v in os.environ.items() if k != THP_ENV}
    if env_value is not None:
        env[THP_ENV] = env_value
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(system_thp_mode() != "madvise", reason="needs the system's THP mode madvise")
def test_a_large_tensor_gets_huge_pages_unless_the_environment_says_no():
    """The allocator reads the variable at its first allocation: asked for first thing (as
    the CLI does), a 64 MiB tensor lies in huge pages; with THP_MEM_ALLOC_ENABLE=0 it does
    not. (The kernel may refuse a huge page when memory is fragmented: most of the tensor is
    asked for, not all.)"""
    assert _huge_kib(None) >= 32 * 1024
    assert _huge_kib("0") == 0
