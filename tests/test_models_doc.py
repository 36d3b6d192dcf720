"""docs/models.md's table of native families says what the code does: a row per ``model_type``
the native families run, with its family; EP only for the MoE family; ``compile`` refused
exactly where the family's spec refuses it."""

from __future__ import annotations

from pathlib import Path

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
