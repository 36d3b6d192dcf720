"""``bench.grammar_cost``: both variants run 8 decoding rows (the grammar rows within their
schema, none failing) and the figures come out (values are the lead's to read, not checked)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("llguidance")

pytestmark = pytest.mark.slow


def test_grammar_cost_times_plain_and_grammar_steps() -> None:
    from torch_tensorrt_dist.bench.grammar_cost import grammar_cost

    figures = grammar_cost(engine="none", steps=3, blocks=1)
    assert [f.unit for f in figures] == ["%", "%", "%", "ms"]
    assert all(math.isfinite(f.value) for f in figures)
    assert figures[0].met is not None and "ms per step" in figures[0].note
    # the graph call's CPU is timed apart: what is outside it is a part of the step
    outside = figures[2].note.split("outside the graph ")[1].split(" ms")[0].split(" vs ")
    assert float(outside[0]) > 0 and 0 < float(outside[1]) < float(figures[1].note.split()[-2])


def test_sampling_cost_times_the_sampling_path_alone() -> None:
    from torch_tensorrt_dist.bench.grammar_cost import sampling_cost

    (figure,) = sampling_cost(blocks=1, steps=3)
    assert figure.unit == "us" and math.isfinite(figure.value)
    assert "a step" in figure.note


def test_the_cost_is_the_median_of_paired_blocks_not_each_variants_best() -> None:
    from torch_tensorrt_dist.bench.grammar_cost import _paired

    # block pairs (wall s, CPU s, CPU s outside the graph): the machine slows the 2nd pair;
    # the plain variant's best block (1.0) is a lucky moment no grammar block had beside it
    medians = {
        False: [(2.0, 2.0, 0.1), (3.0, 3.0, 0.1), (1.0, 2.0, 0.1)],
        True: [(2.1, 2.1, 0.2), (3.3, 3.0, 0.2), (2.1, 2.0, 0.2)],
    }
    wall, cpu = _paired(medians, 0), _paired(medians, 1)
    assert math.isclose(wall.cost, 0.1)  # pairs +5 %, +10 %, +110 %: the median
    assert "+5.0 to +110.0 %" in wall.spread and "+110.0 %" in wall.best  # best: 2.1 vs 1.0
    assert math.isclose(cpu.cost, 0.0)
