"""Functions the artifact tests run in spawned gloo ranks (must be importable)."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from torch_tensorrt_dist.artifacts import ArtifactRunner, load_generator
from torch_tensorrt_dist.artifacts.manifest import manifest_digest
from torch_tensorrt_dist.families.compile import compile_artifacts
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.generation.kv_memory import kv_layout_for
from torch_tensorrt_dist.models.llama_args import read_config
from torch_tensorrt_dist.parallel.llama_load import load_llama

from ._core_fns import Job, run_schedule

MAX_SEQ = 64
#: 2 rows, blocks of 4 tokens, 8 prompt tokens a step: prompts are chunked, rows cross blocks
OPTIONS: dict[str, Any] = {
    "max_seq_len": MAX_SEQ,
    "max_batch_size": 2,
    "block_size": 4,
    "max_prefill_tokens": 8,
}
#: the pool (20 blocks and the null block): two 60-token requests (15 blocks each) preempt
KV_BLOCKS = 20
#: modules whose presence after the first calls from artifacts would mean a compile
COMPILERS = ("torch._inductor.compile_fx", "torch._dynamo")


def flip_byte(path: Path) -> None:
    """Flip every bit of the byte in the middle of ``path``."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


#: Defects of one rank's file: variant -> the file whose middle byte is flipped.
FLIPPED = {
    "corrupt": "rank-1/step.pt2",
    "weights": "rank-1/weights.safetensors",
    "package": "rank-0/step.pt2",
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
        manifest["format_version"] = 3  # the per-bucket graphs of earlier versions
    elif edit == "manifest":
        manifest["cache_len"] += 1
    if edit != "manifest":
        manifest["digest"] = manifest_digest(manifest)
    (dest / "manifest.json").write_text(json.dumps(manifest))


VARIANTS = (*FLIPPED, "missing", "version", "groups", "format", "manifest")


def kv_memory(ckpt: str, world: int) -> int:
    """Bytes of ``KV_BLOCKS`` blocks on each of ``world`` ranks."""
    layout = kv_layout_for(
        read_config(Path(ckpt)), tp=world, dtype=torch.float32, block_size=OPTIONS["block_size"]
    )
    return KV_BLOCKS * layout.bytes_per_block


def compile_rank(rank: int, world: int, ckpt: str, out: str) -> float:
    """Compile the artifacts (every rank); the seconds this rank took."""
    result = compile_artifacts(
        ckpt, out, kv_cache_memory=kv_memory(ckpt, world), wrapper_opt_level="O0", **OPTIONS
    )
    return result.seconds


def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def load_and_generate(
    rank: int, world: int, ckpt: str, out: str, prompts: list[list[int]], max_new: int
) -> dict[str, Any]:
    """In fresh ranks: load the artifacts and generate (the first calls compile nothing; every
    shape class runs); generate from the checkpoint with the same options; run a serving
    schedule (joins, a cancel, a prefix hit, preemptions) on both; then try loading each
    defective copy (every refusal) and a request beyond the compiled length."""
    start = time.perf_counter()
    gen = load_generator(out)
    load_s = time.perf_counter() - start
    runner = gen.runner
    assert isinstance(runner, ArtifactRunner)
    state = set(runner.manifest.rank_entry(rank).state)  # the pools: zeros, written each step
    pools = [t for n, t in runner.constants.items() if n in state]
    weights = [t for n, t in runner.constants.items() if n not in state]
    classes: set[tuple[bool, bool]] = set()  # (several rows, several tokens) of each call
    step = runner.step

    def recording(tokens: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        classes.add((tokens.shape[0] > 1, tokens.shape[1] > 1))
        return step(tokens, *rest)

    runner.step = recording
    start = time.perf_counter()
    from_artifacts = gen.generate(prompts, max_new_tokens=max_new).tokens
    first_s = time.perf_counter() - start
    imported = [m for m in COMPILERS if m in sys.modules]
    single = gen.generate(prompts[:1], max_new_tokens=max_new).tokens  # one row
    queued = [*prompts, [6, 6, 6]]  # more prompts than rows: the third waits for a row
    from_queued = gen.generate(queued, max_new_tokens=max_new).tokens

    # the reference's collectives on a group of their own: the packages' run on WORLD, and the
    # AOTInductor loader holds the GIL through a call, so a gloo thread still releasing a
    # Python tensor of an earlier collective on WORLD would wait for it forever (Package)
    model = load_llama(ckpt, group=dist.new_group(list(range(world))), progress=False)
    reference = Generator(model, kv_cache_memory=kv_memory(ckpt, world), **_generator_options())
    from_ckpt = reference.generate(prompts, max_new_tokens=max_new).tokens
    queued_ckpt = reference.generate(queued, max_new_tokens=max_new).tokens
    long = [(7 * i) % 120 + 1 for i in range(40)]
    jobs = [
        Job(0, prompts[0], max_new),
        Job(1, prompts[1], 4),
        Job(2, [6, 6], 7, cancel_at=5),
        Job(3, prompts[0], 5),  # the first job's prompt again: a prefix-cache hit
        Job(4, long, 20),
        Job(5, long[::-1], 20),  # with job 4: more blocks than the pool holds
    ]
    served = run_schedule(gen, jobs, ())
    served_ckpt = run_schedule(reference, jobs, ())

    errors: dict[str, str] = {}
    if rank == 0:
        for name in VARIANTS:
            _variant(Path(out), Path(out).parent / name, name)
    dist.barrier()
    for name in VARIANTS:
        errors[name] = _error(lambda n=name: load_generator(Path(out).parent / n))
    errors["layout"] = _error(lambda: load_generator(out, tp=1, pp=2))
    errors["length"] = _error(lambda: gen.generate([[1] * 10], max_new_tokens=60))
    return {
        "load_s": load_s,
        "first_s": first_s,
        "imported": imported,
        "classes": sorted(classes),
        "artifacts": from_artifacts,
        "single": single,
        "queued": from_queued,
        "queued_checkpoint": queued_ckpt,
        "checkpoint": from_ckpt,
        "served": served,
        "served_checkpoint": served_ckpt,
        "errors": errors,
        # the weight shard in one region of huge pages (runtime/huge_pages.py: a storage of
        # its own per weight storage, side by side in one mapping), each pool apart
        "storages": {
            "weights": _storages(weights),
            "weights_packed": _packed(weights),
            "pools": _storages(pools),
            "n_pools": len(pools),
        },
    }


def _storages(tensors: list[torch.Tensor]) -> int:
    return len({t.untyped_storage().data_ptr() for t in tensors})


def _packed(tensors: list[torch.Tensor]) -> bool:
    """Whether the tensors' storages lie side by side in one span (64-byte aligned each, the
    span starting within one 2 MiB page): what one mapping of the weights gives, and storages
    from the allocator, scattered over the heap, do not."""
    spans = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    lo = min(spans)
    hi = max(p + n for p, n in spans.items())
    return hi - lo <= sum(-(-n // 64) * 64 for n in spans.values()) + 2**21


def _generator_options() -> dict[str, Any]:
    """``OPTIONS`` as :class:`Generator` takes them."""
    opts = dict(OPTIONS)
    opts["cache_len"] = opts.pop("max_seq_len")
    return opts
