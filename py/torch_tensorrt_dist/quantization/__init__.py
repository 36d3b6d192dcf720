"""Weight-only quantization (int8, int4) of sharded models: each rank quantizes its own slices.

    from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

    model = load_llama(path, group=tp_group, dtype=torch.bfloat16)
    quantize_model(model, QuantConfig("int4", group_size=128), engine="inductor")

``scheme`` (what, and the slice checks), ``tensors`` (the math and int4 layouts), ``kernels``
(the weight-only matmul each engine compiles), ``modules`` / ``experts`` (the quantized
layers), ``apply`` (replace a loaded model's layers). See docs/quantization.md.
"""

from torch_tensorrt_dist.quantization.apply import (
    QuantReport,
    layer_kind,
    quantize_model,
    weight_bytes,
)
from torch_tensorrt_dist.quantization.modules import QuantizedEmbedding, WeightOnlyLinear
from torch_tensorrt_dist.quantization.scheme import (
    GROUP_SIZES,
    SCHEMES,
    QuantConfig,
    check_group_slices,
    quant_config,
)

__all__ = [
    "GROUP_SIZES",
    "SCHEMES",
    "QuantConfig",
    "QuantReport",
    "QuantizedEmbedding",
    "WeightOnlyLinear",
    "check_group_slices",
    "layer_kind",
    "quant_config",
    "quantize_model",
    "weight_bytes",
]
