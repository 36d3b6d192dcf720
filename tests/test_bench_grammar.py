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
    assert [f.unit for f in figures] == ["%", "%", "ms"]
    assert all(math.isfinite(f.value) for f in figures)
    assert figures[0].met is not None and "ms per step" in figures[0].note


def test_sampling_cost_times_the_sampling_path_alone() -> None:
    from torch_tensorrt_dist.bench.grammar_cost import sampling_cost

    (figure,) = sampling_cost(blocks=1, steps=3)
    assert figure.unit == "us" and math.isfinite(figure.value)
    assert "a step" in figure.note
