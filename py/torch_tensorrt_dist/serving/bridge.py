"""Between HTTP and the step loop (rank 0): requests in, text out, no tensors. (With HTTP in a
process of its own, ``frontend.py`` carries these through a pipe.)

    inbox = Inbox(max_waiting=64)
    inbox.submit(Submission(...))          # HTTP thread; QueueFull when the queue is full
    items = inbox.take(timeout=0.5)        # step loop: new submissions and cancels
    inbox.finished(rid)                    # HTTP thread: its handler answered (or left)
    inbox.fail_live(503, "...")            # any thread: answer every request not answered yet
    sink.put(Piece("text", 1, None))       # step loop -> the request's asyncio queue
    deliver([(sink, piece), ...])          # a step's pieces, one wake-up of the HTTP loop

The HTTP layer never waits on the step loop and the step loop never waits on HTTP: requests go
through a thread-safe queue, and each request's pieces come back through its own queue
(``loop.call_soon_threadsafe``), a :class:`PieceQueue` where a sequence's pieces merge while
they wait: a client that reads slowly gets fewer, larger events, and its queue holds one piece
per sequence, not one per token (``stream_out.py`` cuts a stream that stops reading).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.logits_process import TokenLogprobs
from torch_tensorrt_dist.generation.sampling import SamplingConfig

__all__ = [
    "Cancel",
    "Failed",
    "Inbox",
    "Piece",
    "PieceQueue",
    "QueueFull",
    "ServerState",
    "Sink",
    "Submission",
    "deliver",
]

logger = logging.getLogger(__name__)

State = Literal["warming", "ready", "draining", "failed"]


class QueueFull(Exception):
    """The wait queue holds ``max_waiting`` requests already (HTTP 429)."""


@dataclass
class Piece:
    """New text of a request, the number of tokens it came from, and how it ended (or None)."""

    text: str
    tokens: int
    finish: str | None = None
    cached: int = 0
    """Prompt tokens taken from the prefix cache (on a request's first piece)."""
    index: int = 0
    """Which sequence of the HTTP request (``Submission.index`` + its choice)."""
    logprobs: tuple[TokenLogprobs, ...] = ()
    """The logprobs of its tokens, where the request asked for them."""
    made: float = 0.0
    """``time.monotonic()`` at the step that made its first token (0: not known)."""


@dataclass
class Failed:
    """The request cannot finish: the HTTP status and message to answer with, and the request
    field it is about (OpenAI's ``param``), if one is."""

    status: int
    message: str
    param: str | None = None


#: the most a stream's pending pieces may hold (characters; logprobs count LOGPROBS_COST a token)
MAX_PENDING = 1 << 22
#: what a token's logprobs count in a queue's size (a few alternatives and their bytes)
LOGPROBS_COST = 256


def _size(item: Piece | Failed) -> int:
    if isinstance(item, Failed):
        return 0
    return len(item.text) + LOGPROBS_COST * len(item.logprobs)


def merged(first: Piece, then: Piece) -> Piece:
    """``first`` followed by ``then`` (same sequence) as one piece."""
    return replace(
        first,
        text=first.text + then.text,
        tokens=first.tokens + then.tokens,
        finish=then.finish,
        cached=first.cached + then.cached,
        logprobs=first.logprobs + then.logprobs,
        made=min(first.made, then.made) if first.made and then.made else first.made or then.made,
    )


class PieceQueue:
    """One request's pending pieces and failures, in order, a sequence's pieces merged while
    they wait (``asyncio.Queue``'s methods that the server uses; the event loop's thread)."""

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._items: deque[Piece | Failed] = deque()
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        #: called (on the event loop) when a piece takes the size past ``max_pending``
        self.on_full: Callable[[], None] | None = None
        #: pieces merged into one that was waiting (a slow reader's)
        self.merges = 0

    @property
    def over(self) -> bool:
        """The pending size is past ``max_pending``."""
        return self._size > self.max_pending

    def put_nowait(self, item: Piece | Failed) -> None:
        if isinstance(item, Piece):
            for k in range(len(self._items) - 1, -1, -1):
                waiting = self._items[k]
                if isinstance(waiting, Failed):
                    break  # nothing merges across a failure
                if waiting.index == item.index and waiting.finish is None:
                    self._items[k] = merged(waiting, item)
                    self._grow(_size(item))
                    self.merges += 1
                    self._wake()
                    return
        self._items.append(item)
        self._grow(_size(item))
        self._wake()

    def _grow(self, size: int) -> None:
        self._size += size
        if self.on_full is not None and self.over:
            self.on_full()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_nowait(self) -> Piece | Failed:
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        self._size -= _size(item)
        return item

    async def get(self) -> Piece | Failed:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.get_nowait()

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    @property
    def size(self) -> int:
        """The pending pieces' size (characters, logprobs counted ``LOGPROBS_COST`` a token)."""
        return self._size


class Sink:
    """A request's queue of :class:`Piece`/:class:`Failed`, filled from any thread (a
    :class:`~torch_tensorrt_dist.serving.stream_out.PieceQueue`: a sequence's pieces merge
    while they wait for a slow client)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_pending: int = MAX_PENDING) -> None:
        self.queue = PieceQueue(max_pending)
        self.loop = loop

    def put(self, item: Piece | Failed) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            logger.debug("dropped %r: the HTTP event loop is closed", item)


def deliver(items: list[tuple[Sink, Piece | Failed]]) -> None:
    """Put each item in its sink, with one wake-up of each event loop for all of them (a
    decode step's pieces: one ``call_soon_threadsafe`` per step, not one per request). A sink
    without an event loop gets its ``put`` called."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Sink, Piece | Failed]]] = {}
    for sink, item in items:
        loop = getattr(sink, "loop", None)
        if loop is None:
            sink.put(item)
        else:
            by_loop.setdefault(loop, []).append((sink, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            logger.debug("dropped %d items: the HTTP event loop is closed", len(batch))


def _put_all(batch: list[tuple[Sink, Piece | Failed]]) -> None:
    for sink, item in batch:
        sink.queue.put_nowait(item)


_ids = itertools.count()


@dataclass
class Submission:
    """A validated prompt, as the HTTP layer hands it to the step loop: ``n`` sequences of it
    (choices, or ``best_of`` candidates), each its own request of the core."""

    prompt: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingConfig
    """``seed`` None here means: rank 0 picks one (and sends it on join); choice ``j`` samples
    with seed + ``j`` (vLLM's)."""
    seed: int | None
    stop: tuple[str, ...]
    sink: Sink
    n: int = 1
    index: int = 0
    """The index of its first sequence in the HTTP request (a list of prompts: one
    submission each, sharing a sink)."""
    grammar: GrammarSpec | None = None
    grammar_param: str | None = None
    """The request field the grammar came from (errors name it)."""
    rid: int = field(default_factory=lambda: next(_ids))
    arrived: float = field(default_factory=time.perf_counter)
    rids: tuple[int, ...] = ()
    """The core's request id of each sequence (the first is ``rid``)."""

    def __post_init__(self) -> None:
        if not self.rids:
            self.rids = (self.rid, *(next(_ids) for _ in range(self.n - 1)))


@dataclass(frozen=True)
class Cancel:
    """The client of request ``rid`` went away."""

    rid: int


class Inbox:
    """Thread-safe queue of submissions and cancels, with a bound on waiting requests."""

    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self._q: queue.SimpleQueue[Submission | Cancel] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._live: dict[int, Sink] = {}  # submitted, not answered yet

    @property
    def waiting(self) -> int:
        """Sequences submitted that have not joined a row (nor left) yet."""
        return self._waiting

    def submit(self, *subs: Submission) -> None:
        """Queue ``subs`` (the prompts of one HTTP request) together, or none of them; the
        bound counts sequences (prompts x ``n``)."""
        n = sum(sub.n for sub in subs)
        with self._lock:
            if self._waiting + n > self.max_waiting:
                raise QueueFull(
                    f"{self._waiting} sequences are waiting, this request adds {n} "
                    f"(--max-queue {self.max_waiting})"
                )
            self._waiting += n
            for sub in subs:
                self._live[sub.rid] = sub.sink
        for sub in subs:
            self._q.put(sub)

    def finished(self, rid: int) -> None:
        """The handler of request ``rid`` has answered (or its client left)."""
        with self._lock:
            self._live.pop(rid, None)

    def fail_live(self, status: int, message: str) -> int:
        """Answer every request submitted and not answered yet with ``Failed`` (from any
        thread: the step loop may be stuck in a collective); how many there were."""
        with self._lock:
            sinks = list(self._live.values())
            self._live.clear()
        deliver([(sink, Failed(status, message)) for sink in sinks])
        return len(sinks)

    def cancel(self, rid: int) -> None:
        self._q.put(Cancel(rid))

    def left(self, n: int = 1) -> None:
        """``n`` waiting sequences joined a row or were dropped."""
        with self._lock:
            self._waiting -= n

    def take(self, timeout: float) -> list[Submission | Cancel]:
        """Everything queued; waits up to ``timeout`` s for the first item when empty."""
        items: list[Submission | Cancel] = []
        try:
            items.append(self._q.get(timeout=timeout) if timeout > 0 else self._q.get_nowait())
            while True:
                items.append(self._q.get_nowait())
        except queue.Empty:
            pass
        return items


class ServerState:
    """``warming`` -> ``ready`` -> ``draining`` (SIGTERM) | ``failed`` (a rank failed)."""

    def __init__(self) -> None:
        self.state: State = "warming"
        self.reason = ""
        self.pids: list[int] = []  # every rank's process id, once warm
        self.changed = threading.Event()
        #: called with this state after each change (the HTTP process is told)
        self.listeners: list[Callable[[ServerState], None]] = []

    def set(self, state: State, reason: str = "") -> None:
        if self.state == "failed" or (state == "ready" and self.state != "warming"):
            return  # failed is final; a drain that began while warming stays a drain
        self.state, self.reason = state, reason
        self.changed.set()
        for listener in self.listeners:
            listener(self)
