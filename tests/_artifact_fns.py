"""Functions the artifact tests run in spawned gloo ranks (must be importable)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from torch_tensorrt_dist.artifacts import compile_artifacts, load_generator
from torch_tensorrt_dist.artifacts.manifest import manifest_digest
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.parallel.llama_load import load_llama

from ._core_fns import Job, run_schedule

MAX_SEQ = 64


def flip_byte(path: Path) -> None:
    """Flip every bit of the byte in the middle of ``path``."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


#: Defects of one rank's file: variant -> the file whose middle byte is flipped.
FLIPPED = {
    "corrupt": "rank-1/decode.pt2",
    "weights": "rank-1/weights.safetensors",
    "prefill": "rank-0/prefill-16.pt2",
    "entry": "rank-0/rank.json",
}


def _variant(src: Path, dest: Path, edit: str) -> None:
    """A copy of the artifacts with one defect (``edit``). Manifest edits are sealed with a
    fresh digest (as a compile would write them), except ``manifest``: an edit after writing."""
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    if edit in FLIPPED:
        flip_byte(dest / FLIPPED[edit])
    elif edit == "missing":
        (dest / "rank-0" / "weights.safetensors").unlink()
    elif edit == "version":
        manifest["versions"]["torch"] = "2.0.0"
    elif edit == "groups":
        manifest["groups"][0]["ranks"] = [1, 0]
    elif edit == "format":
        manifest["format_version"] = 99
    elif edit == "manifest":
        manifest["cache_len"] += 1
    if edit != "manifest":
        manifest["digest"] = manifest_digest(manifest)
    (dest / "manifest.json").write_text(json.dumps(manifest))


VARIANTS = (*FLIPPED, "missing", "version", "groups", "format", "manifest")


def compile_and_generate(
    rank: int, world: int, ckpt: str, out: str, prompts: list[list[int]], max_new: int
) -> dict[str, Any]:
    """Compile artifacts, load them back and generate; generate from the checkpoint too; then
    try loading each defective copy (every refusal) and requests beyond the compiled shapes."""
    result = compile_artifacts(
        ckpt, out, max_seq_len=MAX_SEQ, max_batch_size=2, buckets=[16], wrapper_opt_level="O0"
    )
    start = time.perf_counter()
    gen = load_generator(out)
    load_s = time.perf_counter() - start
    from_artifacts = gen.generate(prompts, max_new_tokens=max_new).tokens
    single = gen.generate(prompts[:1], max_new_tokens=max_new).tokens  # fewer rows than compiled
    model = load_llama(ckpt, group=dist.group.WORLD, progress=False)
    reference = Generator(model, max_batch_size=2, cache_len=MAX_SEQ)
    from_ckpt = reference.generate(prompts, max_new_tokens=max_new).tokens
    # the serving core over the loaded graphs: requests join and leave at different steps
    jobs = [
        Job(0, prompts[0], max_new),
        Job(1, prompts[1], 4),
        Job(2, [6, 6], 7, cancel_at=5),
        Job(3, [1], 5),
    ]
    served = run_schedule(gen, jobs, ())["tokens"]
    served_ckpt = run_schedule(reference, jobs, ())["tokens"]

    errors: dict[str, str] = {}
    if rank == 0:
        for name in VARIANTS:
            _variant(Path(out), Path(out).parent / name, name)
    dist.barrier()
    for name in VARIANTS:
        errors[name] = _error(lambda n=name: load_generator(Path(out).parent / n))
    errors["layout"] = _error(lambda: load_generator(out, tp=1, pp=2))
    errors["batch"] = _error(lambda: gen.generate([[1, 2]] * 3, max_new_tokens=2))
    errors["bucket"] = _error(lambda: gen.generate([[1] * 20], max_new_tokens=2))
    errors["length"] = _error(lambda: gen.generate([[1] * 10], max_new_tokens=60))
    return {
        "compile_s": result.seconds,
        "load_s": load_s,
        "artifacts": from_artifacts,
        "single": single,
        "checkpoint": from_ckpt,
        "served": served,
        "served_checkpoint": served_ckpt,
        "errors": errors,
    }


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""
