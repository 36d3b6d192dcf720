"""Length-prefixed frames over a byte stream (the socket between rank 0 and its HTTP process):
each frame arrives whole, or the reader raises :class:`FrameError`.

    write_frame(fd, payload)               # whole, on a blocking or non-blocking fd
    payload = read_frame(fd)               # a thread's blocking read; EOFError at the end
    frames = FrameBuffer()                 # an event loop's reader, on a non-blocking fd:
    for payload in frames.feed(os.read(fd, 1 << 20)): ...

A frame is an 8-byte big-endian length, then that many bytes. Why not ``Connection.send``:
it writes a message with as many ``write`` calls as the kernel takes, and on a non-blocking fd
(an event loop's reader makes its fd one) a write that the socket buffer (about 208 KiB) cannot
hold raises midway, leaving half a message in the stream; the next reads then decode garbage.
Here a write that would block waits until the fd is writable and resumes where it stopped.
"""

from __future__ import annotations

import os
import select
import struct
from collections.abc import Iterator

__all__ = ["MAX_FRAME", "FrameBuffer", "FrameError", "read_frame", "write_frame"]

HEADER = struct.Struct("!Q")
#: frames shorter than this go out in one write (header and payload copied together)
SMALL = 1 << 16
#: the largest frame a reader accepts; a longer length is a stream out of step (corrupt)
MAX_FRAME = 1 << 32


class FrameError(RuntimeError):
    """The stream does not hold a frame where one should start (it was cut or corrupted)."""


def _wait(fd: int, event: int) -> None:
    """Block until ``fd`` is ready for ``event`` (``select.POLLIN`` or ``POLLOUT``)."""
    poller = select.poll()
    poller.register(fd, event)
    poller.poll()


def write_frame(fd: int, payload: bytes) -> None:
    """Write ``payload`` as one frame; partial writes are resumed (a non-blocking fd waits
    until writable). OSError (``BrokenPipeError``) when the reader has gone."""
    head = HEADER.pack(len(payload))
    # a small frame in one write (one system call); a large one without copying it
    parts = (head + payload,) if len(payload) < SMALL else (head, payload)
    for part in parts:
        view = memoryview(part)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                _wait(fd, select.POLLOUT)


def _read_exact(fd: int, n: int, *, at_start: bool) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        try:
            k = os.readv(fd, [view[got:]])
        except BlockingIOError:
            _wait(fd, select.POLLIN)
            continue
        if k == 0:
            if at_start and got == 0:
                raise EOFError("the other end closed the stream")
            raise FrameError(f"the stream ended {n - got} bytes before the frame's end")
        got += k
    return bytes(buf)


def read_frame(fd: int) -> bytes:
    """The next frame's payload; EOFError where the stream ended between frames,
    FrameError where it ended inside one or holds an impossible length."""
    (n,) = HEADER.unpack(_read_exact(fd, HEADER.size, at_start=True))
    if n > MAX_FRAME:
        raise FrameError(f"a frame of {n} bytes announced (at most {MAX_FRAME}): corrupt stream")
    return _read_exact(fd, n, at_start=False)


class FrameBuffer:
    """Bytes as they arrive in, whole frames out (for an event loop's non-blocking reads)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> Iterator[bytes]:
        """Add ``data``; yield each frame now complete (FrameError on an impossible length)."""
        self._buf += data
        start = 0
        try:
            while len(self._buf) - start >= HEADER.size:
                (n,) = HEADER.unpack_from(self._buf, start)
                if n > MAX_FRAME:
                    raise FrameError(
                        f"a frame of {n} bytes announced (at most {MAX_FRAME}): corrupt stream"
                    )
                end = start + HEADER.size + n
                if len(self._buf) < end:
                    break
                yield bytes(self._buf[start + HEADER.size : end])
                start = end
        finally:
            del self._buf[:start]

    @property
    def pending(self) -> int:
        """Bytes of a frame not complete yet."""
        return len(self._buf)
