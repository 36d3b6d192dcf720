"""Malformed safetensors headers and indexes: each is refused in one line naming the file and
the tensor, at least wherever the ``safetensors`` library refuses it, never loaded as other
weights. Plus a seeded fuzz of small mutations of the demo checkpoint's header."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests._hostile import DEMO, WEIGHTS, copy_demo, demo_header, join, shard, split
from torch_tensorrt_dist.errors import CheckpointError
from torch_tensorrt_dist.models.checkpoint_files import checkpoint_tensors
from torch_tensorrt_dist.models.llama_args import read_config
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader
from torch_tensorrt_dist.models.weights_check import check_checkpoint, llama_tensors

NORM = "model.layers.0.input_layernorm.weight"  # BF16 [256]: data_offsets [524288, 524800]
EMBED = "model.embed_tokens.weight"  # BF16 [1024, 256]: [0, 524288]


def _set(name: str, key: str, value: Any) -> Any:
    def change(h: dict[str, Any]) -> None:
        h[name][key] = value

    return change


def _entry(name: str, value: Any) -> Any:
    def change(h: dict[str, Any]) -> None:
        h[name] = value

    return change


def _drop(name: str, key: str) -> Any:
    def change(h: dict[str, Any]) -> None:
        del h[name][key]

    return change


# (id, change of the header dict, message regex). All of these are refused by the library too.
HEADER_CASES = [
    ("overlap", _set(NORM, "data_offsets", [0, 512]), rf"tensor '{EMBED}' .* overlaps tensor"),
    (
        "before_data",
        _set(NORM, "data_offsets", [-400, 112]),
        r"data_offsets \[-400, 112\] is not \[begin, end\] with integers in \[0, 2\*\*64\)",
    ),
    ("begin_after_end", _set(NORM, "data_offsets", [524800, 524288]), "end before they begin"),
    (
        "short_span",
        _set(NORM, "data_offsets", [524288, 524544]),
        r"BF16 tensor of shape \[256\] needs 512 bytes, but .* span 256",
    ),
    (
        "bf16_as_f32",
        _set(NORM, "dtype", "F32"),
        r"F32 tensor of shape \[256\] needs 1024 bytes, but its data_offsets \[524288, 524800\] "
        "span 512",
    ),
    ("missing_dtype", _drop(NORM, "dtype"), "its entry has no 'dtype'"),
    ("string_offsets", _set(NORM, "data_offsets", ["524288", "524800"]), "is not \\[begin, end\\]"),
    ("float_offsets", _set(NORM, "data_offsets", [524288.0, 524800]), "is not \\[begin, end\\]"),
    ("three_offsets", _set(NORM, "data_offsets", [524288, 524800, 0]), "is not \\[begin, end\\]"),
    ("negative_shape", _set(NORM, "shape", [-256]), r"is not a list of integers in \[0, 2\*\*64"),
    ("bool_shape", _set(NORM, "shape", [True]), r"is not a list of integers in \[0, 2\*\*64"),
    ("huge_offset", _set(NORM, "data_offsets", [524288, 2**64]), r"integers in \[0, 2\*\*64\)"),
    ("entry_not_object", _entry(NORM, "BF16"), "its entry is a string, not an object"),
    ("unknown_dtype", _set(NORM, "dtype", "bf16"), 'has dtype "bf16", which this reader does not'),
    ("nan_offset", _set(NORM, "data_offsets", [524288, float("nan")]), "is not \\[begin, end\\]"),
    ("metadata_not_strings", _entry("__metadata__", {"format": 1}), "__metadata__ must map"),
]
RAW_CASES = [  # (id, header bytes, message regex)
    ("list", b"[]", r"the safetensors header is a list, not an object"),
    ("not_json", b"{nope", r"has a corrupt safetensors header: Expecting property name"),
    ("not_utf8", b'{"\xff": 1}', r"byte 2 is not UTF-8"),
    ("deep", b"[" * 100_000, r"nested too deeply"),
    ("huge_int", b'{"a": ' + b"9" * 5000 + b"}", r"corrupt safetensors header: Exceeds the limit"),
    ("empty", b"{}", r"the tensors cover 0 bytes of the data section, but it has 6820352"),
]


def _refused_by_library(blob: bytes) -> bool:
    try:
        safetensors.torch.load(blob)
    except Exception:  # the library's own SafetensorError, or torch's on an unknown dtype
        return True
    return False


def _write(tmp_path: Path, header: bytes) -> tuple[Path, bytes]:
    _, data = split((DEMO / WEIGHTS).read_bytes())
    blob = join(header, data)
    path = tmp_path / WEIGHTS
    path.write_bytes(blob)
    return path, blob


@pytest.mark.parametrize(
    ("change", "message"), [c[1:] for c in HEADER_CASES], ids=[c[0] for c in HEADER_CASES]
)
def test_malformed_entry_is_refused_in_one_line(tmp_path: Path, change: Any, message: str) -> None:
    header = demo_header()
    change(header)
    path, blob = _write(tmp_path, json.dumps(header).encode())
    with pytest.raises(CheckpointError, match=message) as exc:
        SafetensorsReader(path)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(path))
    assert _refused_by_library(blob)


@pytest.mark.parametrize(
    ("raw", "message"), [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES]
)
def test_malformed_header_is_refused_in_one_line(tmp_path: Path, raw: bytes, message: str) -> None:
    path, blob = _write(tmp_path, raw)
    with pytest.raises(CheckpointError, match=message) as exc:
        SafetensorsReader(path)
    assert "\n" not in str(exc.value) and str(path) in str(exc.value)
    assert _refused_by_library(blob)


def test_gap_trailing_bytes_and_duplicates(tmp_path: Path) -> None:
    header, data = split((DEMO / WEIGHTS).read_bytes())
    path = tmp_path / WEIGHTS
    path.write_bytes(join(header, data + b"\0" * 8))  # bytes after the last tensor
    with pytest.raises(CheckpointError, match="cover 6820352 bytes of the data section, but it"):
        SafetensorsReader(path)
    h = demo_header()
    del h[NORM]  # its 512 bytes now belong to no tensor
    path.write_bytes(join(json.dumps(h).encode(), data))
    with pytest.raises(CheckpointError, match=r"bytes \[524288, 524800\) .* belong to no tensor"):
        SafetensorsReader(path)
    # a name twice: json.loads would keep the second entry silently; refused instead
    text = header.decode().rstrip()
    dup = text[:-1] + ', "model.norm.weight": ' + json.dumps(demo_header()["model.norm.weight"])
    path.write_bytes(join(dup.encode() + b"}", data))
    with pytest.raises(CheckpointError, match=r"names 'model\.norm\.weight' twice"):
        SafetensorsReader(path)


def test_padding_metadata_and_zero_sized_tensors_are_accepted(tmp_path: Path) -> None:
    h = demo_header()
    h["__metadata__"] = None  # the library accepts null
    h["empty"] = {"dtype": "F32", "shape": [0, 4], "data_offsets": [524288, 524288]}
    path, blob = _write(tmp_path, b"  \n" + json.dumps(h).encode() + b" \t ")
    with SafetensorsReader(path) as f:
        assert f.read("empty").shape == (0, 4) and f.metadata == {}
        assert torch.equal(f.read(NORM), safetensors.torch.load(blob)[NORM])


# --- sharded checkpoints: model.safetensors.index.json --------------------------------------


def _index(ckpt: Path) -> Path:
    return ckpt / "model.safetensors.index.json"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    ckpt = copy_demo(tmp_path_factory.mktemp("sharded"))
    return ckpt, shard(ckpt)


INDEX_CASES = [
    ("not_json", "{", r"model.safetensors.index.json is not valid JSON"),
    ("list", [], r"has no weight_map object"),
    ("no_map", {"metadata": {}}, r"has no weight_map object"),
    ("map_of_ints", {"weight_map": {"model.norm.weight": 3}}, r"not a .safetensors file name"),
    (
        "traversal",
        {"weight_map": {"model.norm.weight": "../model.safetensors"}},
        r"shards must be file names in the checkpoint directory",
    ),
    (
        "missing_shard",
        {"weight_map": {"model.norm.weight": "model-00003-of-00003.safetensors"}},
        r"names files that are missing: model-00003-of-00003.safetensors",
    ),
]


@pytest.mark.parametrize(
    ("index", "message"), [c[1:] for c in INDEX_CASES], ids=[c[0] for c in INDEX_CASES]
)
def test_malformed_index_is_refused(tmp_path: Path, sharded: Any, index: Any, message: str) -> None:
    ckpt = tmp_path
    for f in sharded[0].iterdir():
        (ckpt / f.name).symlink_to(f)
    _index(ckpt).unlink()
    _index(ckpt).write_text(index if isinstance(index, str) else json.dumps(index))
    with pytest.raises(CheckpointError, match=message) as exc:
        checkpoint_tensors(ckpt)
    assert "\n" not in str(exc.value)


def test_index_and_shards_must_agree(tmp_path: Path, sharded: Any) -> None:
    src, mapping = sharded
    for f in src.iterdir():
        if f.name != _index(src).name:
            (tmp_path / f.name).symlink_to(f)
    args = read_config(tmp_path)

    def index(m: dict[str, str]) -> None:
        _index(tmp_path).write_text(json.dumps({"weight_map": m}))

    index(mapping)
    check_checkpoint(tmp_path, args)  # the consistent index passes
    moved = dict(mapping, **{EMBED: "model-00002-of-00002.safetensors"})
    index(moved)  # a weight mapped to a shard that does not hold it
    with pytest.raises(CheckpointError, match=rf"maps tensor '{EMBED}' to model-00002.*holds no"):
        check_checkpoint(tmp_path, args)
    index({k: v for k, v in mapping.items() if k != EMBED})  # a shard's tensor not listed
    with pytest.raises(CheckpointError, match=rf"holds tensor '{EMBED}', but .* does not list it"):
        check_checkpoint(tmp_path, args)


def test_a_tensor_in_two_files_without_an_index_is_refused(tmp_path: Path) -> None:
    ckpt = copy_demo(tmp_path)
    extra = {"model.norm.weight": torch.ones(256)}
    safetensors.torch.save_file(extra, str(ckpt / "extra.safetensors"))
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight' is in both extra\."):
        check_checkpoint(ckpt, read_config(ckpt))


# --- the fuzz: never a silent different model ---------------------------------------------

_ALPHABET = b'0123456789",:[]{} .-_aeFBIUx\\'


def _mutate(rng: random.Random, header: bytes) -> tuple[bytes, bytes]:
    """1-3 small random edits of the header (and sometimes its length prefix): replace, swap,
    delete or insert a byte, keeping the length by the trailing padding where possible.
    Returns (length prefix, header bytes)."""
    h = bytearray(header)
    delta = 0  # a change of the length prefix
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(h))
        kind = rng.choice(["replace", "digit", "swap", "delete", "insert", "length", "reorder"])
        if kind == "reorder":  # the same entries in another order, the same length
            try:
                entries = list(json.loads(h).items())
            except ValueError:  # an earlier edit broke the JSON
                continue
            rng.shuffle(entries)
            text = json.dumps(dict(entries), separators=(",", ":")).encode()
            h = bytearray(text.ljust(len(h))) if len(text) <= len(h) else h
        elif kind == "replace":
            h[i] = rng.choice(_ALPHABET) if rng.random() < 0.8 else rng.randrange(256)
        elif kind == "digit":
            digits = [j for j, b in enumerate(h) if 48 <= b <= 57]
            h[rng.choice(digits)] = rng.choice(b"0123456789")
        elif kind == "swap" and i + 1 < len(h):
            h[i], h[i + 1] = h[i + 1], h[i]
        elif kind == "delete":
            del h[i]
            h.append(32)  # the header length stays; JSON ignores the trailing space
        elif kind == "insert":
            h.insert(i, rng.choice(_ALPHABET))
            if h[-1] == 32:
                del h[-1]
        elif kind == "length":
            delta += rng.choice([-8, -3, -1, 1, 2, 8])
    return struct.pack("<Q", max(len(h) + delta, 0)), bytes(h)


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_fuzzed_headers_load_the_original_weights_or_are_refused(tmp_path: Path) -> None:
    """600 seeded mutations of the demo header: each load (header checks, config against the
    headers, then every tensor the model reads) gives the original weights bit for bit or
    raises CheckpointError; whatever the safetensors library refuses, we refuse too."""
    ckpt = copy_demo(tmp_path)
    args = read_config(ckpt)
    names = sorted(llama_tensors(args))
    header, data = split((DEMO / WEIGHTS).read_bytes())
    original = safetensors.torch.load((DEMO / WEIGHTS).read_bytes())
    want = {n: _bytes(t) for n, t in original.items()}
    rng = random.Random(0)
    outcome = {"same": 0, "refused": 0}
    (ckpt / WEIGHTS).write_bytes(join(header, data))
    for trial in range(600):
        prefix, body = _mutate(rng, header)
        blob = prefix + body + data
        if len(body) == len(header):  # only the header's bytes change: rewrite them in place
            with open(ckpt / WEIGHTS, "r+b") as f:
                f.write(prefix + body)
        else:
            (ckpt / WEIGHTS).write_bytes(blob)
        try:
            check_checkpoint(ckpt, args)
            with SafetensorsReader(ckpt / WEIGHTS) as f:
                loaded = {n: f.read(n) for n in names}
        except CheckpointError:
            outcome["refused"] += 1
            continue
        for n in names:
            same = loaded[n].dtype == original[n].dtype and loaded[n].shape == original[n].shape
            assert same and _bytes(loaded[n]) == want[n], (
                f"trial {trial}: {n} loaded as other weights from header {body!r}"
            )
        assert not _refused_by_library(blob), f"trial {trial}: the library refuses {body!r}"
        outcome["same"] += 1
    # the mutations reach both outcomes (padding and metadata edits keep the weights)
    assert outcome["refused"] > 300 and outcome["same"] > 20, outcome
