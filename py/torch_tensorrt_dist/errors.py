"""Exception types. Each message says what was found and how to fix it."""

from __future__ import annotations


class TensorRTDistError(RuntimeError):
    """Base class of every error this package raises on purpose."""


class GroupResolutionError(TensorRTDistError):
    """A collective names a process group that cannot be found, or whose ranks changed."""


class UnsupportedCollectiveError(TensorRTDistError):
    """A collective (or an argument of one) that this package cannot handle."""


class EngineUnavailableError(TensorRTDistError):
    """The requested engine needs software that is not installed (TensorRT, Torch-TensorRT)."""


class ConfigError(TensorRTDistError, ValueError):
    """A user-facing option, mesh or model configuration is invalid."""


class ScheduleMismatchError(TensorRTDistError):
    """Ranks of one group would issue different collective sequences (a hang in NCCL)."""


class DistributedSetupError(TensorRTDistError):
    """The process was launched in a way that cannot work (conflicting variables, no MPI...)."""


class CheckpointError(ConfigError):
    """A model checkpoint is missing, truncated, or holds tensors of the wrong name or shape."""


class VerificationError(TensorRTDistError):
    """A compiled graph's first run differs from the eager run of the same graph (``verify``)."""


class ArtifactError(ConfigError):
    """A compiled-artifact directory is incomplete, corrupt, or does not fit this run."""


class RankFailedError(TensorRTDistError):
    """Another rank failed a step that every rank must pass (``runtime.agree``), so this rank
    stops too. ``failed_rank`` is that rank: launchers report it as the cause, not this one."""

    def __init__(self, message: str, *, failed_rank: int) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank


class StepTimeoutError(TensorRTDistError):
    """A server's step made no progress within ``--step-timeout``: a rank did not answer.
    ``failed_rank`` is that rank (None: rank 0 itself), the cause launchers report."""

    def __init__(self, message: str, *, failed_rank: int | None) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
