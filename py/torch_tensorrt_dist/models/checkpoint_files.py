"""Which file holds which tensor of a checkpoint directory, from the headers (checked).

    tensors = checkpoint_tensors("path/to/ckpt")   # name -> (file, TensorInfo)

With ``model.safetensors.index.json`` the index names the shards; every shard it names must
exist, be a plain ``*.safetensors`` file name of the directory, and hold exactly the tensors
the index maps to it (a tensor in a shard the index maps elsewhere, or does not list, is
refused: which copy a loader would use is ambiguous). Without an index every ``*.safetensors``
file of the directory is read, and a tensor in two files is refused. Only headers are read.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader, TensorInfo

__all__ = ["INDEX_FILE", "checkpoint_tensors", "load_config_json", "read_index", "weight_map"]

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
_FIX = "download the checkpoint again or regenerate the index"


def _read_json(file: Path) -> Any:
    """The JSON value of ``file``; CheckpointError in one line when it is not UTF-8 JSON."""
    try:
        return json.loads(file.read_bytes().decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{file} is not valid JSON: {exc}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise CheckpointError(f"{file} is not valid JSON: {what}") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from None


def load_config_json(path: str | Path) -> dict[str, Any]:
    """The object in ``path/config.json`` (a checkpoint directory's model configuration)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(
            f"{Path(path)} has no config.json; pass a Hugging Face checkpoint directory "
            "(config.json + *.safetensors)"
        )
    cfg = _read_json(cfg_file)
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cfg_file} holds a JSON {type(cfg).__name__}, not an object")
    return cfg


def read_index(index: Path) -> dict[str, str]:
    """The ``weight_map`` (tensor name -> shard file name) of an index file, checked."""
    data = _read_json(index)
    mapping = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(mapping, dict) or not mapping:
        raise CheckpointError(
            f"{index} has no weight_map object (tensor name -> shard file); {_FIX}"
        )
    for name, file in mapping.items():
        if not isinstance(file, str) or not file.endswith(".safetensors"):
            raise CheckpointError(
                f"{index} maps {name!r} to {json.dumps(file)}, not a .safetensors file name; {_FIX}"
            )
        if Path(file).name != file or file.startswith("."):
            raise CheckpointError(
                f"{index} maps {name!r} to {file!r}; shards must be file names in the "
                "checkpoint directory (no folders, no '..')"
            )
    return mapping


def _headers(files: list[Path]) -> dict[Path, dict[str, TensorInfo]]:
    out = {}
    for file in files:
        with SafetensorsReader(file) as f:  # parses and checks the header only
            out[file] = dict(f.tensors)
    return out


def _indexed(root: Path, index: Path) -> dict[str, tuple[Path, TensorInfo]]:
    mapping = read_index(index)
    shards = sorted({root / f for f in mapping.values()})
    missing = [f.name for f in shards if not f.is_file()]
    if missing:
        raise CheckpointError(
            f"{index} names files that are missing: {', '.join(missing)}; download them again"
        )
    headers = _headers(shards)
    for name, shard_name in mapping.items():
        if name not in headers[root / shard_name]:
            raise CheckpointError(
                f"{index} maps tensor {name!r} to {shard_name}, but {shard_name} holds no such "
                f"tensor; {_FIX}"
            )
    for shard, tensors in headers.items():
        for name in tensors:
            listed = mapping.get(name)
            if listed is None or root / listed != shard:
                where = "does not list it" if listed is None else f"maps it to {listed}"
                raise CheckpointError(
                    f"{shard.name} holds tensor {name!r}, but {index.name} {where}; {_FIX}"
                )
    unused = sorted(set(root.glob("*.safetensors")) - set(shards))
    if unused:
        logger.info("%s: ignoring %s (not in the index)", root, ", ".join(f.name for f in unused))
    return {name: (root / f, headers[root / f][name]) for name, f in mapping.items()}


def _unindexed(root: Path) -> dict[str, tuple[Path, TensorInfo]]:
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{root} holds no *.safetensors file; only safetensors is read")
    out: dict[str, tuple[Path, TensorInfo]] = {}
    for file, tensors in _headers(files).items():
        for name, info in tensors.items():
            if name in out:
                raise CheckpointError(
                    f"tensor {name!r} is in both {out[name][0].name} and {file.name} of {root}; "
                    f"remove the stale file or add the {INDEX_FILE} that says which is used"
                )
            out[name] = (file, info)
    return out


def checkpoint_tensors(path: str | Path) -> dict[str, tuple[Path, TensorInfo]]:
    """Tensor name -> (its file, its header entry) for checkpoint directory ``path``."""
    root = Path(path)
    index = root / INDEX_FILE
    return _indexed(root, index) if index.is_file() else _unindexed(root)


def weight_map(path: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (see :func:`checkpoint_tensors`)."""
    return {name: file for name, (file, _) in checkpoint_tensors(path).items()}
