"""Text generation: compiled prefill (bucketed) and decode graphs, sampling, streaming."""

from torch_tensorrt_dist.generation.buckets import check_lengths, prefill_bucket
from torch_tensorrt_dist.generation.generate import GenerationResult, Generator
from torch_tensorrt_dist.generation.runner import ENGINES, compile_step
from torch_tensorrt_dist.generation.sampling import SamplingConfig, make_generator, sample
from torch_tensorrt_dist.generation.streaming import TextStream

__all__ = [
    "ENGINES",
    "GenerationResult",
    "Generator",
    "SamplingConfig",
    "TextStream",
    "check_lengths",
    "compile_step",
    "make_generator",
    "prefill_bucket",
    "sample",
]
