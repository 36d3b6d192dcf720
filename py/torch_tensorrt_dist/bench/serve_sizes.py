"""``bench --section serve``: the counts and lengths of a run (``full``: the issues' sizes,
``quick``: a few minutes), checked against the checkpoint and the KV memory before it starts.

    sizes = ServeSizes.full()            # or .quick()
    sizes.check(positions)               # ConfigError where a request would not fit
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_tensorrt_dist.errors import ConfigError

__all__ = ["ServeSizes"]


@dataclass(frozen=True)
class ServeSizes:
    """The counts and lengths of a run (``full``: the issues' sizes)."""

    clients: tuple[int, ...] = (1, 8, 32)
    rounds: int = 4
    """Timed rounds of each server once warm, alternated with transformers serve's (both up
    at once, the order swapped each round; half of them with each server started first): the
    ratio is the median of those pairs (a load that drifts within the run moves both rounds
    of a pair alike)."""
    requests_per_client: int = 2
    min_requests: int = 8
    """At least this many requests per client count: one client's 2 requests last well under a
    second, which this machine's noise swamps (rounds of the same server differed by 10 %)."""
    max_tokens: int = 64
    burst_requests: int = 32
    burst_tokens: int = 96
    join_streams: int = 7
    join_prompt: int = 2000
    stream_tokens: int = 256
    prefix: int = 1500
    suffix: int = 64
    caches: tuple[int, ...] = (256, 1024, 4096)
    live: int = 33
    step_rows: int = 8
    max_batch_size: int = 32
    max_seq_len: int = 2560
    kv_rows: int = 8
    kv_tokens: int = 512
    engine: str = "inductor"
    baseline: bool = True
    defaults: tuple[int, ...] = (1, 8)
    """Client counts of a second comparison, each server at its own default threads (no
    ``OMP_NUM_THREADS``: ours takes the cores over its ranks, transformers serve torch's
    default), ``rounds`` alternated pairs; () leaves it out."""

    @classmethod
    def full(cls) -> ServeSizes:
        return cls()

    @classmethod
    def quick(cls) -> ServeSizes:
        """Fewer requests and tokens, shorter prompts, two cache lengths (a few minutes)."""
        return cls(
            rounds=2,
            requests_per_client=1,
            min_requests=2,
            max_tokens=24,
            burst_tokens=48,
            join_prompt=600,
            stream_tokens=128,
            prefix=400,
            suffix=32,
            caches=(256, 1024),
            max_seq_len=1024,
            defaults=(),
        )

    @property
    def kv_cache_tokens(self) -> int:
        """The KV memory of the burst (and of every run): ``kv_rows`` x ``kv_tokens`` tokens."""
        return self.kv_rows * self.kv_tokens

    def check(self, positions: int, *, prompt: int = 16) -> None:
        """ConfigError unless every request of the run fits the checkpoint's ``positions``,
        ``--max-seq-len`` and the KV memory (``prompt``: the longest text prompt in tokens),
        so that no request is refused or preempted."""
        if self.rounds < 1:
            raise ConfigError(f"serve bench sizes: rounds must be >= 1, got {self.rounds}")
        kv = self.kv_cache_tokens
        needs = {
            "--max-seq-len (the checkpoint's positions)": (self.max_seq_len, positions),
            "the longest cache length (the checkpoint's positions)": (max(self.caches), positions),
            "the joining prompt (--max-seq-len)": (self.join_prompt + 4, self.max_seq_len),
            "the shared prefix and a suffix (--max-seq-len)": (
                self.prefix + self.suffix + 4,
                self.max_seq_len,
            ),
            "--max-seq-len (the KV memory)": (self.max_seq_len, kv),
            "the streams and the joining prompt (the KV memory)": (
                self.join_streams * (prompt + self.stream_tokens) + self.join_prompt,
                kv,
            ),
            "the burst (the KV memory)": (self.burst_requests * (prompt + self.burst_tokens), kv),
            "the burst (--max-batch-size)": (self.burst_requests, self.max_batch_size),
            "the streams and the join (--max-batch-size)": (
                self.join_streams + 1,
                self.max_batch_size,
            ),
        }
        for what, (need, have) in needs.items():
            if need > have:
                raise ConfigError(f"serve bench sizes: {what} needs {need} tokens, has {have}")
