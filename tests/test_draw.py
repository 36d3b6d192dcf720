"""``generation.draw``: one token a row by the inverse of its cumulative distribution."""

from __future__ import annotations

import pytest
import torch

from torch_tensorrt_dist.generation.draw import draw


def _gens(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_the_draws_follow_the_distribution() -> None:
    p = torch.tensor([0.05, 0.3, 0.0, 0.15, 0.4, 0.1])
    n, g = 12_000, torch.Generator().manual_seed(7)
    counts = torch.bincount(torch.tensor(draw(p.expand(n, -1), [g] * n)), minlength=6)
    assert counts[2] == 0
    kept = p > 0
    expected = p[kept] * n
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    assert chi2 < 13.28  # chi-square 1 % critical value, 4 degrees of freedom


def test_tokens_without_mass_are_never_drawn() -> None:
    # mass only in the middle: the first and the last tokens (no mass) must never come
    p = torch.zeros(1, 64)
    p[0, 20:23] = torch.tensor([1e-30, 0.0, 1.0])
    g = torch.Generator().manual_seed(0)
    got = {draw(p, [g])[0] for _ in range(2_000)}
    assert got <= {20, 22} and 22 in got


def test_across_chunks_the_draws_follow_the_distribution_and_skip_empty_chunks() -> None:
    from torch_tensorrt_dist.generation.draw import CHUNK

    # 5 chunks (the last one short): two entries with mass in chunk 1 (one its last) and in
    # chunk 2 (one its first: found after chunk 1's mass), one in the short last chunk; chunks
    # 0 and 3 hold none
    at = [CHUNK + 500, 2 * CHUNK - 1, 2 * CHUNK, 2 * CHUNK + 400, 4 * CHUNK + 3]
    p = torch.zeros(4 * CHUNK + 8)
    p[at] = torch.tensor([0.1, 0.2, 0.15, 0.15, 0.4])
    n, g = 8_000, torch.Generator().manual_seed(3)
    got = torch.tensor(draw(p.expand(n, -1), [g] * n))
    assert set(got.tolist()) == set(at)
    counts = torch.stack([(got == i).sum() for i in at]).double()
    expected = p[at].double() * n
    assert float(((counts - expected) ** 2 / expected).sum()) < 13.28  # 1 %, 4 degrees


def test_unnormalised_rows_draw_as_their_normalised_form() -> None:
    p = torch.tensor([[0.2, 0.5, 0.3], [1.0, 0.0, 3.0]])
    assert draw(p * 7.0, _gens(3, 4)) == draw(p, _gens(3, 4))


def test_a_row_draws_the_same_alone_or_batched() -> None:
    probs = torch.softmax(torch.randn(8, 1_000, generator=torch.Generator().manual_seed(1)), -1)
    batched, alone = _gens(*range(8)), _gens(*range(8))
    for _ in range(20):
        together = draw(probs, batched)
        assert together == [draw(probs[i : i + 1], [alone[i]])[0] for i in range(8)]


def test_a_row_takes_one_number_from_its_generator() -> None:
    # the generator's state after a draw: as after one float64 (what the next draw sees)
    a, b = _gens(5, 5)
    draw(torch.ones(1, 10), [a])
    torch.rand(1, dtype=torch.float64, generator=b)
    assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize(
    "row",
    [[0.5, float("nan")], [0.5, float("inf")], [0.5, -0.1], [0.0, 0.0]],
    ids=["nan", "inf", "negative", "no-mass"],
)
def test_a_row_that_is_not_a_distribution_is_refused(row: list[float]) -> None:
    with pytest.raises(ValueError, match="finite and non-negative"):
        draw(torch.tensor([[0.2, 0.8], row]), _gens(0, 1))


def test_rows_and_generators_must_agree() -> None:
    with pytest.raises(ValueError, match="for 1 generators"):
        draw(torch.ones(2, 3), _gens(0))
