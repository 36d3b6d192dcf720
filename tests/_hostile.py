"""Hostile copies of the shipped demo checkpoint, changed one thing at a time (for the tests of
malformed safetensors headers, indexes and configs)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.models.demo import demo_checkpoint_path

DEMO = demo_checkpoint_path()
WEIGHTS = "model.safetensors"


def split(blob: bytes) -> tuple[bytes, bytes]:
    """(header bytes, data bytes) of a safetensors file's contents."""
    (n,) = struct.unpack("<Q", blob[:8])
    return blob[8 : 8 + n], blob[8 + n :]


def join(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def copy_demo(dst: Path) -> Path:
    """A copy of the demo checkpoint in ``dst`` (created)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in DEMO.iterdir():
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
    return dst


def demo_header() -> dict[str, Any]:
    header, _ = split((DEMO / WEIGHTS).read_bytes())
    out: dict[str, Any] = json.loads(header)
    return out


def write_header(ckpt: Path, header: Any, *, raw: bytes | None = None) -> None:
    """Replace the header of ``ckpt``'s weights (a JSON value, or ``raw`` bytes) keeping the
    data section."""
    _, data = split((DEMO / WEIGHTS).read_bytes())
    body = raw if raw is not None else json.dumps(header).encode()
    (ckpt / WEIGHTS).write_bytes(join(body, data))


def edit_header(ckpt: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    header = demo_header()
    change(header)
    write_header(ckpt, header)


def edit_config(ckpt: Path, **fields: Any) -> None:
    """Set config.json fields (a value of ``...`` deletes the field)."""
    cfg = json.loads((DEMO / "config.json").read_text())
    for key, value in fields.items():
        if value is ...:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))  # NaN / Infinity written as JSON does


def shard(ckpt: Path) -> dict[str, str]:
    """Split the weights into two shards with a model.safetensors.index.json; return the map."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / WEIGHTS))
    (ckpt / WEIGHTS).unlink()
    names = sorted(tensors)
    files = {
        "model-00001-of-00002.safetensors": names[:20],
        "model-00002-of-00002.safetensors": names[20:],
    }
    mapping = {}
    for file, part in files.items():
        save_file({n: tensors[n] for n in part}, str(ckpt / file), metadata={"format": "pt"})
        mapping.update(dict.fromkeys(part, file))
    index = {"metadata": {"total_size": 0}, "weight_map": mapping}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return mapping
