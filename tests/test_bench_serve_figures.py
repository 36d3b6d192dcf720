"""``bench --section serve``'s figures from hand-made streams and inputs: a stream's and a
run's rates, a joining prompt's gap, seeded prompts, KV bytes per live token, the client's view
of gaps and first events, the demo tokenizer's continuation bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_tensorrt_dist.bench.serve_scenarios import Join, random_ids
from torch_tensorrt_dist.bench.serve_step import kv_bytes_per_live_token
from torch_tensorrt_dist.bench.serve_streams import (
    ClientRun,
    Stream,
    max_gap_during,
    slowest_ttft_share,
)
from torch_tensorrt_dist.generation.kv_memory import KVLayout

from ._bench_serve import stream


def test_stream_and_run_figures() -> None:
    a = stream(0.0, [0.5, 0.6, 0.8, 1.0])  # ttft 0.5, 3 tokens after the first in 0.5 s
    b = stream(0.2, [0.4, 2.2])  # ttft 0.2, latency 2.0
    assert a.ttft == 0.5 and a.latency == 1.0 and a.decode_tokens_per_s == pytest.approx(6.0)
    assert a.gaps == pytest.approx([0.1, 0.2, 0.2])
    run = ClientRun(2.0, [a, b])
    assert run.tokens == 6 and run.tokens_per_s == 3.0
    assert run.decode_tokens_per_s() == pytest.approx((6.0 + 1 / 1.8) / 2)  # b: 1 in 1.8 s
    # slowest TTFT 0.5 over the median latency (1.0 and 2.0: 1.5)
    assert slowest_ttft_share([a, b]) == pytest.approx(0.5 / 1.5)
    # gaps overlapping [0.55, 0.65]: a's 0.5-0.6 and 0.6-0.8, b's 0.4-2.2 (1.8)
    assert max_gap_during([a, b], 0.55, 0.65) == pytest.approx(1.8)
    assert max_gap_during([a], 0.55, 0.65) == pytest.approx(0.2)
    assert max_gap_during([a], 5.0, 6.0) == 0.0
    assert Stream(1.0).ttft == float("inf")  # no token: never counted as fast


def test_join_share_and_coverage() -> None:
    running = [stream(0.0, [0.1, 0.2, 0.3, 0.7, 0.8]), stream(0.0, [0.15, 0.25, 0.5])]
    join = Join(running, stream(0.25, [0.75]))  # prefilled from 0.25 to 0.75
    assert join.gap == pytest.approx(0.4)  # 0.3 -> 0.7
    assert join.gap_share == pytest.approx(0.8)
    assert not join.covered  # the second stream ended at 0.5, before 0.75
    assert Join(running[:1], join.join).covered


def test_random_ids_are_seeded_and_avoid_specials() -> None:
    ids = random_ids(500, vocab=8, seed=3, avoid=[0, 1])
    assert ids == random_ids(500, vocab=8, seed=3, avoid=[0, 1])
    assert len(ids) == 500 and set(ids) == set(range(2, 8))
    assert ids != random_ids(500, vocab=8, seed=4, avoid=[0, 1])


def test_kv_bytes_per_live_token() -> None:
    # the bench checkpoint: 8 layers, 4 KV heads of 32, fp32: 2 x 8 x 4 x 32 x 4 = 8192 B/token
    layout = KVLayout(layers=8, kv_heads=4, head_dim=32, element_size=4, block_size=16)
    paged, static = kv_bytes_per_live_token(layout, live=33, cache_len=4096)
    assert layout.bytes_per_token == 8192
    assert paged == pytest.approx(48 * 8192 / 33)  # 3 blocks of 16 tokens
    assert static == pytest.approx(4096 * 8192 / 33)


def test_client_view_figures_by_hand() -> None:
    """Two streams sent at 0: gaps, first events and events per token computed by hand."""
    from torch_tensorrt_dist.bench.serve_clients import client_view
    from torch_tensorrt_dist.bench.serve_streams import Stream

    a = Stream(0.0, times=[0.5, 0.6, 0.8], completion_tokens=3)  # gaps 0.1, 0.2
    b = Stream(0.0, times=[0.2, 2.2], completion_tokens=4)  # gap 2.0: text merged or held
    view = client_view([a, b])
    assert view["first_p50"] == 0.5 and view["first_max"] == 0.5  # nearest rank of 2
    assert view["gap_max"] == 2.0 and view["gap_p99"] == 2.0
    assert abs(view["gap_p50"] - 0.2) < 1e-9
    assert view["events_per_token"] == 5 / 7
    assert client_view([])["events_per_token"] == 0.0


def test_continuation_ids_of_the_demo_tokenizer() -> None:
    """The 64 single-byte tokens 0x80-0xBF of the demo's byte-level BPE, each alone U+FFFD;
    ASCII and lead bytes are not among them."""
    from tokenizers import Tokenizer

    from torch_tensorrt_dist.bench.serve_clients import continuation_ids
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path

    path = Path(demo_checkpoint_path()) / "tokenizer.json"
    ids = continuation_ids(path)
    tok = Tokenizer.from_file(str(path))
    assert len(ids) == 64 and {tok.decode([i]) for i in ids} == {"\ufffd"}
    raw = "".join(tok.id_to_token(i) for i in ids)
    assert len(raw) == 64  # one byte each
    lead = tok.token_to_id("Ã")  # byte 0xC3, a lead byte: not a continuation
    assert lead is not None and lead not in ids and tok.token_to_id("a") not in ids
