"""docs/models.md's table of native families says what the code does: a row per ``model_type``
the native families run, with its family; EP only for the MoE family; ``compile`` refused
exactly where the family's spec refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from torch_tensorrt_dist.families import (
    MODEL_TYPES,
    NATIVE_MODEL_TYPES,
    DenseSpec,
    ModelSpec,
    MoESpec,
)

DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"
SPECS: dict[str, type[ModelSpec]] = {"dense": DenseSpec, "moe": MoESpec}


def _rows() -> dict[str, dict[str, str]]:
    """model_type -> {column: cell} of the table under '## Native families'."""
    section = DOC.read_text().split("## Native families", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[cells["model_type"].strip("`")] = cells
    return rows


def test_every_native_model_type_has_its_row() -> None:
    rows = _rows()
    families = {spec.family for spec in MODEL_TYPES.values()}
    native = {kind: row["family"] for kind, row in rows.items() if row["family"] in families}
    assert native == NATIVE_MODEL_TYPES


def test_the_columns_follow_the_specs() -> None:
    for kind, row in _rows().items():
        spec = SPECS.get(row["family"])
        if spec is None:  # another family's row: its own test checks it
            continue
        assert row["EP"] == ("yes" if spec is MoESpec else "no"), kind
        assert row["compile"] == ("no" if "compile" in spec.refused else "yes"), kind
        assert row["TP"] == row["PP"] == row["int8 / int4"] == "yes", kind


#: the survey rows checked against the code (each kind of answer: native, plans, refused for
#: its layers, for its attention, for no TP plan at TP 2; at PP 2 for no PP plan, for a forward
#: that changes the hidden states it is given; granite's embedding multiplier: plans)
SAMPLE = (
    "llama",
    "granite",
    "qwen3_moe",
    "gemma2",
    "deepseek_v3",
    "gpt_oss",
    "gpt2",
    "mamba",
    "qwen3_next",
    "falcon",
    "gemma4_text",
)


@pytest.mark.transformers
def test_the_survey_table_covers_every_causal_lm_and_says_what_the_code_does() -> None:
    """docs/models.md's survey table (written by ``python -m torch_tensorrt_dist.testing.hf_survey
    docs/models.md``) has a row for every causal-LM type of the installed transformers; for a
    sample, its native / refused cells are what ``NATIVE_MODEL_TYPES``, ``hf_survey.refusal``
    and ``hf_survey.pp_cell`` (PP 2) say today, and the types the family's tests run exact say
    so."""
    from torch_tensorrt_dist.testing.hf_survey import causal_lm_types, pp_cell, read_table, refusal

    rows = read_table(DOC)
    assert sorted(rows) == causal_lm_types()
    for kind in SAMPLE:
        tp1, tp2, pp = rows[kind]
        assert tp2 == ("plans" if refusal(kind, 2) is None else f"refused: {refusal(kind, 2)}")
        assert pp == pp_cell(kind), kind
        if kind in NATIVE_MODEL_TYPES:
            assert tp1 == f"native ({NATIVE_MODEL_TYPES[kind]})", kind
        elif refusal(kind, 1) is not None:
            assert tp1 == f"refused: {refusal(kind, 1)}", kind
        else:  # run (exact / differs / an error) or not tried, never refused
            assert not tp1.startswith(("refused", "native")), kind
