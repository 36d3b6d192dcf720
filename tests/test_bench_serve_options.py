"""``bench --section serve``'s options: the sizes against the checkpoint and the KV memory, the
server's command line, and the lines read from the servers' output (warm-up, HTTP loop, the
baseline's URL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torch_tensorrt_dist.bench import QUICK_SECTIONS, SECTIONS
from torch_tensorrt_dist.bench.serve import http_loop, our_server_args, warmup_seconds
from torch_tensorrt_dist.bench.serve_checkpoint import CHECKPOINT
from torch_tensorrt_dist.bench.serve_hf import HF_READY, hf_serve_command
from torch_tensorrt_dist.bench.serve_sizes import ServeSizes
from torch_tensorrt_dist.cli import build_parser
from torch_tensorrt_dist.errors import ConfigError


def test_sizes_fit_the_checkpoint_and_the_kv_memory() -> None:
    positions = CHECKPOINT["max_position_embeddings"]
    for sizes in (ServeSizes.full(), ServeSizes.quick()):
        sizes.check(positions)
    full = ServeSizes.full()
    assert full.kv_cache_tokens == 8 * 512 and full.clients == (1, 8, 32)
    assert (full.join_prompt, full.prefix, full.caches) == (2000, 1500, (256, 1024, 4096))
    with pytest.raises(ConfigError, match=r"joining prompt \(--max-seq-len\) needs 3004"):
        ServeSizes(join_prompt=3000).check(positions)
    with pytest.raises(ConfigError, match=r"burst \(the KV memory\) needs 8192 tokens, has 4096"):
        ServeSizes(burst_tokens=240).check(positions)
    with pytest.raises(ConfigError, match="rounds must be >= 1, got 0"):
        ServeSizes(rounds=0).check(positions)


def test_server_options_parse() -> None:
    sizes = ServeSizes.full()
    args = our_server_args(Path("/ckpt"), sizes, 8 * 512 * 8192)
    ns = build_parser().parse_args(["serve", "--port", "0", *args])
    assert (ns.max_batch_size, ns.max_seq_len, ns.engine) == (32, 2560, "inductor")
    assert ns.kv_cache_memory == str(32 * 2**20)
    bench = build_parser().parse_args(["bench", "--section", "serve", "--quick"])
    assert bench.quick and bench.section == ["serve"]
    assert "serve" in QUICK_SECTIONS and "serve_control" in SECTIONS


def test_warmup_and_baseline_lines() -> None:
    line = "serving bench at http://127.0.0.1:4242/v1 (tp=1 ep=1, engine inductor, 32 rows x "
    assert warmup_seconds(line + "2560 tokens, warm-up 41.3 s)\n") == 41.3
    assert http_loop(line + "2560 tokens, HTTP on uvloop, warm-up 41.3 s)\n") == "uvloop"
    assert http_loop(line + "2560 tokens, warm-up 41.3 s)\n") == ""
    with pytest.raises(ConfigError, match="no warm-up"):
        warmup_seconds("Traceback ...")
    uvicorn = "INFO:     Uvicorn running on http://127.0.0.1:33973 (Press CTRL+C to quit)"
    match = re.search(HF_READY, uvicorn)
    assert match is not None and match.group(1) == "http://127.0.0.1:33973"
    cmd = hf_serve_command("/ckpt")
    assert cmd[3:6] == ["serve", "/ckpt", "--continuous-batching"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[-1] == "0"
