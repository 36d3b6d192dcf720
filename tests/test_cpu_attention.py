"""The CPU decode-attention op (``ops/cpu_attention.py``): the attention of ``models/paged.py``
over the gathered past and the own tokens, read from the pools in place; what a decode step
(one token a row) and a verify call (k + 1 tokens a row) of the Inductor engine on the CPU run."""

from __future__ import annotations

import copy
import os
import shutil

import pytest
import torch

from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama import ModelArgs
from torch_tensorrt_dist.models.paged import NULL_BLOCK, paged_attention, paged_mask
from torch_tensorrt_dist.ops import cpu_attention
from torch_tensorrt_dist.parallel.llama_load import random_llama

# only where no C++ compiler exists (then Inductor cannot compile either); with one, a failed
# build fails these tests
pytestmark = pytest.mark.skipif(
    not any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "c++", "g++")),
    reason="no C++ compiler to build the op",
)

CPU = torch.device("cpu")
BS = 4  # block size


@pytest.fixture(autouse=True)
def _built() -> None:
    assert cpu_attention.available(), cpu_attention.unavailable_reason()


def _case(
    lengths: list[int],
    hq: int,
    hkv: int,
    d: int,
    *,
    window: int | None = None,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    s: int = 1,
    bs: int = BS,
    n: int = 32,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Rows whose past holds ``lengths`` tokens in distinct random blocks of 32-block pools
    (tables padded with the null block to the longest), ``s`` query tokens a row: the op's
    inputs, and the reference (the gathered past and the own tokens through
    ``paged_attention`` under ``paged_mask``, in float32 from the same values)."""
    g = torch.Generator().manual_seed(seed)
    r = len(lengths)
    nb = max(2, max(-(-x // bs) for x in lengths))

    def rand(*shape: int) -> torch.Tensor:  # values of ``dtype``, kept in float32 too
        return torch.randn(*shape, generator=g).to(dtype)

    pools = [rand(n, bs, hkv, d) for _ in range(2)]
    order = (torch.randperm(n - 1, generator=g) + 1).tolist()  # never the null block
    past = torch.full((r, nb), NULL_BLOCK, dtype=torch.long)
    for i, x in enumerate(lengths):
        for b in range(-(-x // bs)):
            past[i, b] = order.pop()
    q = rand(r, hq, s, d)
    own = [rand(r, hkv, s, d) for _ in range(2)]
    start = torch.tensor(lengths)
    args = ModelArgs(dim=hq * d, n_heads=hq, n_kv_heads=hkv, sliding_window=window)
    pos = start[:, None] + torch.arange(s)  # [R, S]
    mask = paged_mask(args, start, pos, nb * bs)  # [R, 1, S, nb * bs + S]
    keys = [p.float()[past].reshape(r, nb * bs, hkv, d).transpose(1, 2) for p in pools]
    k = torch.cat([keys[0], own[0].float()], 2)
    v = torch.cat([keys[1], own[1].float()], 2)
    ref = paged_attention(q.float(), k, v, mask)  # in float32
    return (q, pools[0], pools[1], past, own[0], own[1], mask), ref


@pytest.mark.parametrize(
    "hq,hkv,d",
    [(4, 4, 8), (8, 4, 32), (8, 2, 48), (4, 1, 64), (4, 2, 24)],
    ids=["mha", "gqa2", "gqa4", "mqa", "qwen3_d24"],
)
@pytest.mark.parametrize("window", [None, 5], ids=["full", "window5"])
def test_the_op_is_the_reference_attention(hq: int, hkv: int, d: int, window: int | None) -> None:
    inputs, ref = _case([0, 1, 7, 13, 30], hq, hkv, d, window=window)
    got = cpu_attention.decode_attention(*inputs)
    assert got.shape == ref.shape and got.is_contiguous()
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=2e-5)


def test_a_row_that_sees_no_key_gives_zeros_as_the_reference_does() -> None:
    inputs, _ = _case([6, 9], 8, 4, 32)
    q, kp, vp, past, ko, vo, mask = inputs
    blind = mask.clone()
    blind[1] = False  # row 1 sees nothing, not even its own token
    ref = paged_attention(
        q,
        torch.cat([kp[past].reshape(2, -1, 4, 32).transpose(1, 2), ko], 2),
        torch.cat([vp[past].reshape(2, -1, 4, 32).transpose(1, 2), vo], 2),
        blind,
    )
    got = cpu_attention.decode_attention(q, kp, vp, past, ko, vo, blind)
    assert not got[1].any() and not ref[1].any()
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=2e-5)


def test_half_precision_accumulates_in_float32() -> None:
    inputs, ref = _case([3, 17, 29], 8, 4, 32, dtype=torch.bfloat16)
    got = cpu_attention.decode_attention(*inputs)
    assert got.dtype == torch.bfloat16
    # the float32 result rounded once: within bfloat16's half step of the reference
    torch.testing.assert_close(got.float(), ref, atol=1e-2, rtol=8e-3)


@pytest.mark.parametrize("d", [32, 64, 24], ids=["d32", "d64", "d24_generic"])
def test_bfloat16_verify_queries_are_the_reference_and_keep_their_bits(d: int) -> None:
    """bfloat16 (its vector forms at D = 32 / 64, the generic one at 24), S = 5 queries a row
    over more than 16 keys (the scores of 16 keys at a time): within a rounding of the
    float32 reference, and query i the op over the first i + 1 tokens alone, bit for bit."""
    inputs, ref = _case([0, 3, 21, 40], 8, 2, d, dtype=torch.bfloat16, s=5, seed=d)
    got = cpu_attention.decode_attention(*inputs)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, atol=1e-2, rtol=8e-3)
    q, kp, vp, past, ko, vo, mask = inputs
    p = mask.shape[-1] - 5
    for n in (1, 3):
        own = torch.cat([mask[:, :, :n, :p], mask[:, :, :n, p : p + n]], -1)
        part = cpu_attention.decode_attention(
            q[:, :, :n], kp, vp, past, ko[:, :, :n], vo[:, :, :n], own
        )
        assert torch.equal(part, got[:, :, :n])


def test_bfloat16_verify_queries_over_a_long_past_read_the_pools_directly() -> None:
    """A past too long to widen in the L2 cache (L x D > 64 Ki): the verify call's bf16 keys
    are widened where read, as a decode step's: the reference, and query i's bits those of
    the op over the first i + 1 tokens alone."""
    inputs, ref = _case([600, 20], 4, 2, 128, dtype=torch.bfloat16, s=3, bs=16, n=48)
    got = cpu_attention.decode_attention(*inputs)
    torch.testing.assert_close(got.float(), ref, atol=1e-2, rtol=8e-3)
    q, kp, vp, past, ko, vo, mask = inputs
    assert (mask.shape[-1]) * 128 > 64 * 1024
    p = mask.shape[-1] - 3
    own = torch.cat([mask[:, :, :2, :p], mask[:, :, :2, p : p + 2]], -1)
    part = cpu_attention.decode_attention(
        q[:, :, :2], kp, vp, past, ko[:, :, :2], vo[:, :, :2], own
    )
    assert torch.equal(part, got[:, :, :2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_strided_queries_and_own_keys_give_the_bits_of_contiguous_ones(
    dtype: torch.dtype,
) -> None:
    """A verify call's q, k_own and v_own are views of [R, S, H, D] projections: read by
    their strides, the same bits as their contiguous copies."""
    inputs, _ = _case([5, 22, 11], 8, 2, 32, s=4, dtype=dtype)
    q, kp, vp, past, ko, vo, mask = inputs

    def strided(t: torch.Tensor) -> torch.Tensor:  # [R, H, S, D] as a view of [R, S, H, D]
        view = t.transpose(1, 2).contiguous().transpose(1, 2)
        assert not view.is_contiguous() and torch.equal(view, t)
        return view

    got = cpu_attention.decode_attention(q, kp, vp, past, ko, vo, mask)
    views = cpu_attention.decode_attention(strided(q), kp, vp, past, strided(ko), strided(vo), mask)
    assert views.is_contiguous() and torch.equal(views, got)


def test_a_rows_output_is_the_same_alone_in_any_batch_and_on_any_threads() -> None:
    """What keeps a served request's tokens those of ``generate`` alone: bit-equal rows."""
    inputs, _ = _case([5, 22, 9, 31], 8, 4, 32)
    q, kp, vp, past, ko, vo, mask = inputs
    together = cpu_attention.decode_attention(*inputs)
    for i in range(4):
        alone = cpu_attention.decode_attention(
            q[i : i + 1], kp, vp, past[i : i + 1], ko[i : i + 1], vo[i : i + 1], mask[i : i + 1]
        )
        assert torch.equal(alone[0], together[i])
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert torch.equal(cpu_attention.decode_attention(*inputs), together)
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("s", [2, 3, 4, 5])
@pytest.mark.parametrize(
    "hq,hkv,d,window",
    [(8, 2, 32, None), (4, 1, 64, None), (8, 4, 24, 6)],
    ids=["gqa4", "mqa", "gqa2_window6"],
)
def test_a_few_queries_a_row_are_the_reference_attention(
    s: int, hq: int, hkv: int, d: int, window: int | None
) -> None:
    """A verify call's form: S queries a row, query i over the row's past and its own tokens
    <= i; rows of different lengths (an empty past, one inside a block, several blocks)."""
    inputs, ref = _case([0, 3, 9, 17, 26], hq, hkv, d, window=window, s=s, seed=s)
    got = cpu_attention.decode_attention(*inputs)
    assert got.shape == ref.shape == (5, hq, s, d) and got.is_contiguous()
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=2e-5)


def test_a_query_gives_the_same_bits_whatever_tokens_follow_it() -> None:
    """Query i of S is the op over the first i + 1 tokens alone: a verify call's first query is
    its row's decode step, bit for bit (the same inputs)."""
    inputs, _ = _case([5, 22, 11], 8, 2, 32, s=5)
    q, kp, vp, past, ko, vo, mask = inputs
    full = cpu_attention.decode_attention(*inputs)
    p = mask.shape[-1] - 5
    for n in (1, 2, 4):
        own = torch.cat([mask[:, :, :n, :p], mask[:, :, :n, p : p + n]], -1)
        part = cpu_attention.decode_attention(
            q[:, :, :n], kp, vp, past, ko[:, :, :n], vo[:, :, :n], own
        )
        assert torch.equal(part, full[:, :, :n])


def test_bad_inputs_are_refused_with_what_was_wrong() -> None:
    inputs, _ = _case([3, 9], 8, 4, 32)
    q, kp, vp, past, ko, vo, mask = inputs
    with pytest.raises(RuntimeError, match="outside the pools"):
        cpu_attention.decode_attention(q, kp, vp, past + 100, ko, vo, mask)
    with pytest.raises(RuntimeError, match=r"own keys/values must be \[R, Hkv, S, D\]"):
        cpu_attention.decode_attention(q.expand(2, 8, 2, 32), kp, vp, past, ko, vo, mask)
    with pytest.raises(RuntimeError, match=r"q must be \[R, Hq, S, D\]"):
        cpu_attention.decode_attention(q[:, :, :0], kp, vp, past, ko, vo, mask)
    with pytest.raises(RuntimeError, match="mask must be"):
        cpu_attention.decode_attention(q, kp, vp, past, ko, vo, mask[..., :-1])
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_attention.decode_attention(q, kp.double(), vp.double(), past, ko, vo, mask)


ARGS = ModelArgs(
    dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=64, intermediate_size=64
)
LIMITS = StepLimits(rows=3, tokens=16, blocks=8, block_size=4)


def test_a_models_decode_steps_through_the_op_match_the_reference_steps() -> None:
    """A prefill, then decode steps, on two copies of a model: one with ``cpu_decode``. The
    same logits every step and the same K/V in the pools (the op writes nothing; the step
    writes its own K/V after the last layer as before)."""
    ref = random_llama(ARGS, seed=3)
    ref.setup_paged(num_blocks=16, block_size=4, max_seq_len=32)
    mine = copy.deepcopy(ref)
    mine.setup_paged(num_blocks=16, block_size=4, max_seq_len=32, cpu_decode=True)
    tables = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    prompts = [[5, 9, 11, 2, 7], [3], [8, 8, 1, 30, 2, 4, 6]]
    rows = [(p, 0, t) for p, t in zip(prompts, tables, strict=True)]
    with torch.no_grad():
        steps = 0
        while True:
            want = ref.paged_step(*step_inputs(rows, LIMITS, CPU))
            got = mine.paged_step(*step_inputs(rows, LIMITS, CPU))
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            steps += 1
            if steps == 6:
                break
            nxt = want.argmax(-1).tolist()
            rows = [([t], s + len(p), b) for (p, s, b), t in zip(rows, nxt, strict=True)]
    for a, b in zip(mine.blocks, ref.blocks, strict=True):
        torch.testing.assert_close(a.attention.kv_pages.k_pool, b.attention.kv_pages.k_pool)
        torch.testing.assert_close(a.attention.kv_pages.v_pool, b.attention.kv_pages.v_pool)


def test_the_inductor_engine_decodes_through_the_op_with_the_references_tokens() -> None:
    """The Inductor engine on the CPU turns the op on (decode steps call it, once a layer);
    the reference engine does not; the greedy tokens are the reference's."""
    prompts = [[5, 9, 11, 2], [3, 1], [8, 8, 1, 30, 2]]
    ref = Generator(random_llama(ARGS, seed=4), engine="none", max_batch_size=3, cache_len=32)
    want = ref.generate(prompts, max_new_tokens=6).tokens
    gen = Generator(random_llama(ARGS, seed=4), engine="inductor", max_batch_size=3, cache_len=32)
    assert gen.runner.backend.cpu_decode and not ref.runner.backend.cpu_decode
    gen.generate(prompts, max_new_tokens=6)  # compiles (its tracing calls the op's fake)
    with torch.profiler.profile() as prof:
        got = gen.generate(prompts, max_new_tokens=6).tokens
    calls = {e.key: e.count for e in prof.key_averages()}
    assert got == want
    assert calls.get(f"{cpu_attention.NAMESPACE}::decode_attention", 0) == 5 * ARGS.n_layers


def test_the_inductor_engines_verify_calls_attend_through_the_op() -> None:
    """Speculative decoding (prompt lookup) with the Inductor engine: its verify calls (k + 1
    tokens a row) call the op once a layer, as its decode steps do, and the greedy tokens are
    the reference's without speculation."""
    from torch_tensorrt_dist.generation.speculative import SpeculativeConfig

    prompts = [[5, 9, 11, 2, 5, 9, 11, 2, 5, 9], [3, 1, 3, 1, 3]]
    ref = Generator(random_llama(ARGS, seed=4), engine="none", max_batch_size=2, cache_len=32)
    want = ref.generate(prompts, max_new_tokens=8).tokens
    spec = SpeculativeConfig(num_tokens=3)
    gen = Generator(
        random_llama(ARGS, seed=4),
        engine="inductor",
        max_batch_size=2,
        cache_len=32,
        speculative=spec,
    )
    gen.generate(prompts, max_new_tokens=8)  # compiles
    with torch.profiler.profile() as prof:
        res = gen.generate(prompts, max_new_tokens=8)
    calls = {e.key: e.count for e in prof.key_averages()}
    assert res.tokens == want
    assert gen.runner.verify is not None
    # every step after the prefill: a decode step or a verify call, each through the op
    assert calls.get(f"{cpu_attention.NAMESPACE}::decode_attention", 0) == (
        res.decode_steps * ARGS.n_layers
    )
    assert res.decode_steps < 7  # some steps verified proposals (1 + 7 tokens a row)


def test_the_inductor_engines_bfloat16_verify_calls_give_the_plain_greedy_tokens() -> None:
    """bfloat16 weights (the op's widened keys and values, oneDNN's bf16 products of R x (k + 1)
    token rows against R): greedy speculation gives plain decoding's tokens, the same
    compiled generator with and without its proposer."""
    from torch_tensorrt_dist.generation.speculative import SpeculativeConfig

    prompts = [[5, 9, 11, 2, 5, 9, 11, 2, 5, 9], [3, 1, 3, 1, 3], [7, 7, 7, 7]]
    spec = SpeculativeConfig(num_tokens=3)
    args = ModelArgs(  # heads of 32: the op's vector forms
        dim=64, n_layers=2, n_heads=2, n_kv_heads=1, vocab_size=64, max_seq_len=64
    )
    model = random_llama(args, seed=4).to(torch.bfloat16)
    gen = Generator(model, engine="inductor", max_batch_size=3, cache_len=32, speculative=spec)
    gen.speculative = None
    want = gen.generate(prompts, max_new_tokens=10)
    gen.speculative = spec
    got = gen.generate(prompts, max_new_tokens=10)
    assert got.tokens == want.tokens
    assert got.decode_steps < want.decode_steps  # some proposals were accepted
