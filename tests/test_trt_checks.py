"""The TensorRT tests' engine readers (tests/_trt_checks.py) on hand-written inspector output:
they run only with a GPU, so what they read is checked here."""

from __future__ import annotations

from ._trt_checks import tensor_formats

# the shape of IEngineInspector's JSON at ProfilingVerbosity.DETAILED (TensorRT's docs)
LAYERS = [
    {
        "Name": "aten_ops._weight_int8pack_mm_3 [CONSTANT]",
        "LayerType": "Constant",
        "Inputs": [],
        "Outputs": [
            {
                "Name": "w_int8pack_codes",
                "Location": "Device",
                "Dimensions": [256, 512],
                "Format/Datatype": "Row major linear Int8 format",
            }
        ],
    },
    {
        "Name": "matmul",
        "LayerType": "MatrixMultiply",
        "Inputs": [{"Name": "x", "Format/Datatype": "Row major linear BF16 format"}],
        "Outputs": [{"Name": "y", "Format/Datatype": "Row major linear BF16 format"}],
    },
]


def test_formats_come_from_tensors_not_names() -> None:
    int8, bf16 = "row major linear int8 format", "row major linear bf16 format"
    assert tensor_formats(LAYERS) == {int8, bf16}
    # a fallback that folded the weights back to bf16 keeps "int8" only in its names: not found
    output = {"Name": "w_int8pack_codes", "Format/Datatype": "Row major linear BF16 format"}
    folded = [dict(LAYERS[0], Outputs=[output])]
    assert not any("int8" in f for f in tensor_formats(folded))
    assert tensor_formats([{"Name": "only a name"}]) == set()
