"""Parse and check a safetensors header: every rule of the format, one line per refusal.

A file is 8 bytes of little-endian header length N, N bytes of UTF-8 JSON, then the data
section. The JSON is an object: ``"__metadata__"`` (optional) maps strings to strings; every
other key is a tensor name mapping to ``{"dtype": str, "shape": [int >= 0, ...],
"data_offsets": [begin, end]}``, offsets relative to the data section. The tensors' byte spans,
sorted, must tile the data section exactly: the first begins at 0, each begins where the
previous one ends, the last ends at the end of the file, and each span holds exactly
``numel x itemsize`` bytes. This is what the ``safetensors`` library enforces; we also refuse a
name that appears twice (JSON parsers keep only the last one) and a header nested too deeply
to parse. Whatever passes, each tensor's bytes are its own and nothing else's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from torch_tensorrt_dist.errors import CheckpointError

__all__ = ["DTYPES", "MAX_HEADER_BYTES", "TensorInfo", "parse_header"]

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's limit
_FIX = "the file is damaged or was not written by a safetensors writer; download it again"


@dataclass(frozen=True)
class TensorInfo:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first byte
    end: int


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate written as a \ud800 escape
        return False
    return True


def _short(value: Any) -> str:
    """``value`` as JSON, cut to 60 characters (a hostile header can hold huge lists)."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _uints(value: Any) -> bool:
    """A JSON list of integers in [0, 2**64) (not booleans, not floats such as 8.0), as the
    format's ``usize`` fields."""
    return isinstance(value, list) and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64 for x in value
    )


def _entry(where: str, name: str, meta: Any, data_start: int, data_len: int) -> TensorInfo:
    """One tensor's entry, checked on its own (the tiling is checked by the caller)."""
    shown = repr(name) if len(name) <= 200 else f"{name[:200]!r}..."
    at = f"{where}: tensor {shown}"
    if not _utf8(name):
        raise CheckpointError(f"{where}: a tensor name is not valid UTF-8 ({shown}); {_FIX}")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{at}: its entry is {_kind(meta)}, not an object; {_FIX}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in meta:
            raise CheckpointError(f"{at}: its entry has no {key!r}; {_FIX}")
    dtype, shape, offsets = meta["dtype"], meta["shape"], meta["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CheckpointError(
            f"{at} has dtype {_short(dtype)}, which this reader does not know "
            f"(known: {', '.join(DTYPES)})"
        )
    if not _uints(shape):
        raise CheckpointError(
            f"{at}: shape {_short(shape)} is not a list of integers in [0, 2**64)"
        )
    if not _uints(offsets) or len(offsets) != 2:
        raise CheckpointError(
            f"{at}: data_offsets {_short(offsets)} is not [begin, end] with integers in "
            f"[0, 2**64); {_FIX}"
        )
    begin, end = offsets
    if begin > end:
        raise CheckpointError(f"{at}: data_offsets [{begin}, {end}] end before they begin; {_FIX}")
    if end > data_len:
        raise CheckpointError(
            f"{where} is truncated: tensor {shown} ends at byte {data_start + end}, the file has "
            f"{data_start + data_len}; download the file again"
        )
    need = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != need:
        size = str(need) if need <= 2**64 else "more than 2**64"  # str() of 4300+ digits fails
        raise CheckpointError(
            f"{at}: a {dtype} tensor of shape {_short(shape)} needs {size} bytes, but its "
            f"data_offsets [{begin}, {end}] span {end - begin}; {_FIX}"
        )
    return TensorInfo(DTYPES[dtype], tuple(shape), data_start + begin, data_start + end)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return names.get(type(value), "null" if value is None else "a number")


def parse_header(
    raw: bytes, *, where: str, data_start: int, data_len: int
) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """The tensors (absolute byte offsets) and ``__metadata__`` of header bytes ``raw``.

    ``data_start``: the file offset of the data section (8 + N); ``data_len``: its length
    (file size - data_start). Raises CheckpointError naming ``where`` and the tensor.
    """
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise CheckpointError(
            f"{where} has a corrupt safetensors header: byte {exc.start} is not UTF-8; {_FIX}"
        ) from None
    except _Duplicate as exc:
        raise CheckpointError(f"{where}: the header names {str(exc)!r} twice; {_FIX}") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(
            f"{where} has a corrupt safetensors header: {exc.msg} at byte {exc.pos}; {_FIX}"
        ) from None
    except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits, deep nesting
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise CheckpointError(f"{where} has a corrupt safetensors header: {what}; {_FIX}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: the safetensors header is {_kind(header)}, not an object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
        isinstance(v, str) and _utf8(v) and _utf8(k) for k, v in metadata.items()
    ):
        raise CheckpointError(
            f"{where}: __metadata__ must map strings to strings, got {_short(metadata)}"
        )
    tensors = {
        name: _entry(where, name, meta, data_start, data_len) for name, meta in header.items()
    }
    _check_tiling(where, tensors, data_start, data_len)
    return tensors, metadata


def _check_tiling(
    where: str, tensors: dict[str, TensorInfo], data_start: int, data_len: int
) -> None:
    """The spans, sorted, must tile ``[data_start, data_start + data_len)`` exactly."""
    pos, prev = data_start, None
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].begin, kv[1].end)):
        if t.begin < pos:
            raise CheckpointError(
                f"{where}: tensor {name!r} (data_offsets [{t.begin - data_start}, "
                f"{t.end - data_start}]) overlaps tensor {prev!r}, which ends at "
                f"{pos - data_start}; {_FIX}"
            )
        if t.begin > pos:
            raise CheckpointError(
                f"{where}: bytes [{pos - data_start}, {t.begin - data_start}) of the data section "
                f"belong to no tensor (before tensor {name!r}); {_FIX}"
            )
        pos, prev = t.end, name
    if pos != data_start + data_len:
        raise CheckpointError(
            f"{where}: the tensors cover {pos - data_start} bytes of the data section, but it has "
            f"{data_len} (bytes after the last tensor); {_FIX}"
        )
