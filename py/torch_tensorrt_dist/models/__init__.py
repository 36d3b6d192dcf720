"""Reference model code: toy models and Llama-family decoders."""

from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

__all__ = ["ModelArgs", "Transformer"]
