"""Which libraries a shared object asks for (its ``DT_NEEDED`` entries), read without loading it.

A TensorRT-LLM plugin library built for TensorRT 10 names ``libnvinfer.so.10``; loading it
into a process that runs TensorRT 11 maps a second TensorRT and its creators land in the wrong
registry. Reading the ELF dynamic section first lets the loader refuse such a library with a
clear reason instead. Pure Python (``struct``), 64- and 32-bit, either byte order.
"""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path

__all__ = ["ElfError", "needed_libraries", "nvinfer_major"]

_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5
_PT_LOAD, _PT_DYNAMIC = 1, 2
_NVINFER = re.compile(r"^libnvinfer\.so\.(\d+)")


class ElfError(ValueError):
    """The file is not an ELF shared object this reader understands."""


def needed_libraries(path: str | Path) -> list[str]:
    """The ``DT_NEEDED`` sonames of an ELF file, in order (what ``readelf -d`` lists).

    The file is memory-mapped, not read: a TensorRT-LLM plugin library is over a gigabyte.
    """
    with open(path, "rb") as fh:
        try:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as exc:  # an empty file
            raise ElfError(f"{path} is not an ELF file ({exc})") from exc
        with data:
            return _needed(data, str(path))


def _needed(data: mmap.mmap, path: str) -> list[str]:
    if data[:4] != b"\x7fELF":
        raise ElfError(f"{path} is not an ELF file")
    is64 = data[4] == 2
    end = {1: "<", 2: ">"}.get(data[5])
    if end is None:
        raise ElfError(f"{path}: unknown ELF byte order {data[5]}")
    if is64:
        phoff, phentsize, phnum = (
            struct.unpack_from(end + "Q", data, 0x20)[0],
            *struct.unpack_from(end + "HH", data, 0x36),
        )
        ph_fmt, dyn_fmt = end + "IIQQQQQQ", end + "qQ"
    else:
        phoff, phentsize, phnum = (
            struct.unpack_from(end + "I", data, 0x1C)[0],
            *struct.unpack_from(end + "HH", data, 0x2A),
        )
        ph_fmt, dyn_fmt = end + "IIIIIIII", end + "iI"
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None  # (offset, size)
    for i in range(phnum):
        fields = struct.unpack_from(ph_fmt, data, phoff + i * phentsize)
        if is64:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = fields[:6]
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz = fields[:5]
        if p_type == _PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []  # a static executable: needs nothing
    entry = struct.calcsize(dyn_fmt)
    needed_offsets: list[int] = []
    strtab_vaddr = None
    for pos in range(dynamic[0], dynamic[0] + dynamic[1], entry):
        tag, value = struct.unpack_from(dyn_fmt, data, pos)
        if tag == _DT_NULL:
            break
        if tag == _DT_NEEDED:
            needed_offsets.append(value)
        elif tag == _DT_STRTAB:
            strtab_vaddr = value
    if strtab_vaddr is None:
        raise ElfError(f"{path}: dynamic section has no string table")
    strtab = next(
        (off + strtab_vaddr - va for va, off, size in loads if va <= strtab_vaddr < va + size),
        None,
    )
    if strtab is None:
        raise ElfError(f"{path}: the string table is outside every loaded segment")
    out = []
    for offset in needed_offsets:
        start = strtab + offset
        out.append(data[start : data.find(b"\0", start)].decode())
    return out


def nvinfer_major(needed: list[str]) -> int | None:
    """The TensorRT major a library was linked against (``libnvinfer.so.N``), if any."""
    for name in needed:
        match = _NVINFER.match(name)
        if match:
            return int(match.group(1))
    return None
