"""What each command's ranks do once the model is built: the command's own options.

    GenerateJob(prompts=("Hello",), max_new_tokens=32, sampling=SamplingConfig(0.8, seed=1))
    ServeJob(port=0)
    EvalJob(text="demo", window=256, stride=128)
    CompileJob(out="DIR", buckets=(16, 64))

Each checks its values in ``__post_init__``, naming the flag.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.validation import check_int, check_text

__all__ = [
    "DEFAULT_STEP_TIMEOUT_S",
    "DRAIN_GRACE_S",
    "MAX_DRAIN_S",
    "CompileJob",
    "EvalJob",
    "GenerateJob",
    "Job",
    "ServeJob",
    "check_step_timeout",
    "collective_timeout_s",
]

#: The longest --drain-timeout (the launcher waits for it after a signal: ServeJob.stop_timeout)
MAX_DRAIN_S = 300.0
#: after a signal, a rank still warming up ends at the next graph: the one compiling then may
#: take this long (Inductor, a loaded machine)
WARMUP_STOP_S = 120.0
#: A serving step that runs longer fails the server (well under the 10-minute collective
#: timeout); ``serving.server`` takes it from here (this module needs no serve extra)
DEFAULT_STEP_TIMEOUT_S = 60.0
#: A stream whose client takes no write for this long is cut (``serving.stream_out``)
DEFAULT_WRITE_TIMEOUT_S = 60.0
#: After a signal, a serving rank still running ``--drain-timeout`` + this ends itself
DRAIN_GRACE_S = 2.0


def collective_timeout_s() -> float:
    """The collective timeout the ranks will get (``TORCH_TENSORRT_DIST_TIMEOUT`` or 600 s)."""
    from torch_tensorrt_dist.runtime.timeouts import resolve_timeout

    return resolve_timeout(None, os.environ).total_seconds()


def check_step_timeout(step_timeout: float, collective_s: float) -> None:
    """--step-timeout must end a stuck step before the collective timeout does: then the
    watchdog, which names the rank that did not answer, speaks first (pure)."""
    from torch_tensorrt_dist.runtime.timeouts import TIMEOUT_ENV

    if not (math.isfinite(step_timeout) and 0 < step_timeout < collective_s):
        raise ConfigError(
            f"--step-timeout {step_timeout:g} must be in (0, {collective_s:g}): below the "
            f"collective timeout ({collective_s:g} s, {TIMEOUT_ENV}), so that a stuck step "
            "names the rank that did not answer"
        )


@dataclass(frozen=True)
class GenerateJob:
    """``generate``: complete the prompts, stream or print the text on rank 0."""

    prompts: tuple[str, ...] = ("The return statement",)
    max_new_tokens: int = 32
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    warmup: bool = True
    """Compile before timing (else compilation lands in ``ttft_s``)."""
    json: bool = False

    def __post_init__(self) -> None:
        for i, text in enumerate(self.prompts):
            check_text(text, name="--prompt" if len(self.prompts) == 1 else f"--prompt #{i + 1}")
        check_int(self.max_new_tokens, name="--max-new-tokens", low=1)


@dataclass(frozen=True)
class ServeJob:
    """``serve``: OpenAI's HTTP API on rank 0 until SIGTERM."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_queue: int = 64
    """Requests that may wait for a free row; more get 429."""
    drain_timeout: float = 20.0
    served_model_name: str | None = None
    drain_dir: str | None = None
    """Where each rank notes a clean drain (set by the launching process)."""
    step_timeout: float = DEFAULT_STEP_TIMEOUT_S
    """Seconds a step may run before the server fails, naming the rank that did not answer."""
    tool_call_parser: str | None = None
    """How tool_choice "auto" reads calls (None: the chat template's format, if known)."""
    reasoning_parser: str | None = None
    """Split ``<think>`` reasoning into ``reasoning_content`` (None: off)."""
    write_timeout: float = DEFAULT_WRITE_TIMEOUT_S
    """Seconds a stream's client may take no write before its stream is cut."""

    @property
    def stop_timeout(self) -> float:
        """Seconds the launcher lets the ranks end after a signal before it kills them: the
        drain and each rank's grace after it (2 x ``DRAIN_GRACE_S``), or the graph a warming
        rank may be compiling (``WARMUP_STOP_S``), plus 10 s."""
        return max(self.drain_timeout + 2 * DRAIN_GRACE_S, WARMUP_STOP_S) + 10.0

    def __post_init__(self) -> None:
        if self.max_queue < 1:
            raise ConfigError(f"--max-queue must be >= 1, got {self.max_queue}")
        if not 0 <= self.drain_timeout <= MAX_DRAIN_S:
            raise ConfigError(
                f"--drain-timeout {self.drain_timeout:g} must be in [0, {MAX_DRAIN_S:g}]"
            )
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port {self.port} is not a TCP port (0-65535)")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("--api-key is empty; give a key or leave it unset")
        if self.api_key is not None and not all("!" <= c <= "~" for c in self.api_key):
            raise ConfigError(
                "--api-key must be printable ASCII without spaces: clients send it in an HTTP "
                "header, which carries nothing else"
            )
        check_step_timeout(self.step_timeout, collective_timeout_s())
        if not self.write_timeout > 0:
            raise ConfigError(f"--write-timeout must be > 0 seconds, got {self.write_timeout:g}")


@dataclass(frozen=True)
class EvalJob:
    """``eval --perplexity``: the perplexity of a text, in sliding windows."""

    text: str
    """A text file, or ``demo`` for the demo model's held-out text."""
    window: int = 256
    stride: int = 128
    json: bool = False

    def __post_init__(self) -> None:
        from torch_tensorrt_dist.generation.perplexity import windows

        check_int(self.stride, name="--stride", low=1)
        check_int(self.window, name="--window", low=2)
        windows(2, self.window, self.stride)  # stride <= window
        self.read()

    def read(self) -> str:
        """The text to score: the file, or the demo model's held-out text."""
        if self.text == "demo":
            from torch_tensorrt_dist.models.demo_heldout import heldout_path

            path = heldout_path()
        else:
            path = Path(self.text)
            if not path.is_file():
                raise ConfigError(
                    f"--perplexity {self.text}: no such file; give a text file, or 'demo'"
                )
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"--perplexity {self.text}: cannot read it as UTF-8 text ({exc}); give a text file"
            ) from None


@dataclass(frozen=True)
class CompileJob:
    """``compile``: write each rank's compiled graphs and weight shard, and the manifest."""

    out: str
    json: bool = False


Job = GenerateJob | ServeJob | EvalJob | CompileJob
