"""The run configuration of the commands that start ranks (``run.py``) and their jobs
(``jobs.py``): typed, validated once, picklable."""

from torch_tensorrt_dist.config.jobs import CompileJob, EvalJob, GenerateJob, Job, ServeJob
from torch_tensorrt_dist.config.run import CacheOptions, ModelOptions, Parallel, RunConfig

__all__ = [
    "CacheOptions",
    "CompileJob",
    "EvalJob",
    "GenerateJob",
    "Job",
    "ModelOptions",
    "Parallel",
    "RunConfig",
    "ServeJob",
]
