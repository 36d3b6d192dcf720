"""Read slices of tensors from a ``.safetensors`` file with plain positioned reads.

``safetensors.safe_open`` maps the whole file: a column slice (``w[:, a:b]``) touches every page
of the tensor, and those mapped pages count in the rank's resident memory, so a TP rank peaks at
about the whole checkpoint. This reader parses the header itself and ``pread``s only the bytes of
the slice into the destination, row by row for column slices: a rank's peak memory is the
weights it keeps, and ``bytes_read`` says exactly what it read.

Format: 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": ...}``,
then the data (offsets relative to byte 8 + N). The header is checked against every rule of
the format when the file is opened (``safetensors_header.parse_header``): each tensor's span
is its own, exactly as long as its shape and dtype need, so no read strays into other bytes.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import torch

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.safetensors_header import MAX_HEADER_BYTES, TensorInfo, parse_header

__all__ = ["CheckpointError", "SafetensorsReader", "TensorInfo"]


class SafetensorsReader:
    """``with SafetensorsReader(path) as f: f.read(name, dim=1, start=0, stop=128)``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.bytes_read = 0
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise CheckpointError(f"cannot open {self.path}: {exc}") from exc
        try:
            self.tensors = self._parse_header()
        except BaseException:
            os.close(self._fd)
            raise

    def _pread(self, n: int, offset: int) -> bytes:
        data = os.pread(self._fd, n, offset)
        if len(data) != n:
            raise CheckpointError(
                f"{self.path} is truncated: wanted {n} bytes at offset {offset}, got "
                f"{len(data)}; download the file again"
            )
        return data

    def _parse_header(self) -> dict[str, TensorInfo]:
        size = os.fstat(self._fd).st_size
        if size < 8:
            raise CheckpointError(f"{self.path} is too short to be a safetensors file")
        (n,) = struct.unpack("<Q", self._pread(8, 0))
        if n > min(size - 8, MAX_HEADER_BYTES):
            raise CheckpointError(f"{self.path} is not a safetensors file (header length {n})")
        tensors, self.metadata = parse_header(
            self._pread(n, 8), where=str(self.path), data_start=8 + n, data_len=size - 8 - n
        )
        return tensors

    def keys(self) -> list[str]:
        return list(self.tensors)

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.path} has no tensor {name!r}") from None

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """The tensor, or its ``[start:stop]`` slice along ``dim``, in a new tensor."""
        t = self.info(name)
        shape = list(t.shape)
        if dim is not None and shape:
            shape[dim] = (shape[dim] if stop is None else stop) - start
        out = torch.empty(shape, dtype=t.dtype)
        self.read_into(out, name, dim, start, stop)
        return out

    def read_into(
        self,
        out: torch.Tensor,
        name: str,
        dim: int | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> None:
        """Read the tensor (or its slice along ``dim``) straight into ``out``'s memory: a
        contiguous CPU tensor of the same dtype and shape (no intermediate copy)."""
        t = self.info(name)
        shape = list(t.shape) or [1]  # a scalar reads as one element
        if dim is None:
            dim, start, stop = 0, 0, None
        stop = shape[dim] if stop is None else stop
        if not 0 <= start <= stop <= shape[dim]:
            raise CheckpointError(f"slice [{start}:{stop}] of dim {dim} of {name!r} {shape}")
        want = [*shape[:dim], stop - start, *shape[dim + 1 :]]
        if not t.shape and dim == 0:
            want = []
        if out.dtype != t.dtype or list(out.shape) != want or not out.is_contiguous():
            raise CheckpointError(
                f"cannot read {name!r} {t.dtype}{want} into a {out.dtype}{list(out.shape)} tensor"
            )
        if out.device.type != "cpu":
            raise CheckpointError(f"read_into needs a CPU tensor, got one on {out.device}")
        if out.numel() == 0:
            return
        item = t.dtype.itemsize
        inner = math.prod(shape[dim + 1 :])
        outer = math.prod(shape[:dim])
        chunk = (stop - start) * inner * item  # contiguous bytes per outer index
        stride = shape[dim] * inner * item
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        for o in range(outer):
            offset = t.begin + o * stride + start * inner * item
            got = os.preadv(self._fd, [view[o * chunk : (o + 1) * chunk]], offset)
            if got != chunk:
                raise CheckpointError(
                    f"{self.path} is truncated: wanted {chunk} bytes at offset {offset}, got "
                    f"{got}; download the file again"
                )
        self.bytes_read += outer * chunk

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SafetensorsReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
