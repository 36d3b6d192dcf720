"""Native Qwen3 (dense) in the Llama family: per-head q/k RMSNorm before RoPE, no q/k/v bias,
an explicit head_dim (24 here, not hidden_size / heads = 16).

Greedy tokens equal transformers' own ``generate`` (fp32) at TP 1 (``generate`` in process,
batched rows against each prompt alone) and TP 2 (``generate`` starting its own gloo ranks, and
``serve`` with concurrent requests); a rank reads only its slices; weight-only int8 / int4 against
the dequantized reference; refusals before any weight is read.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from torch_tensorrt_dist.cli import main
from torch_tensorrt_dist.config import GenerateJob, ModelOptions, Parallel, RunConfig
from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.families import checkpoint_spec
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.llama import QKNormLinear
from torch_tensorrt_dist.models.llama_args import read_config
from torch_tensorrt_dist.models.rope import apply_rope, apply_rope_flipped
from torch_tensorrt_dist.models.safetensors_io import SafetensorsReader
from torch_tensorrt_dist.parallel.llama_load import load_llama

from . import _llama_ckpt

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
NAME = "qwen3_hd24"
#: different lengths: left padding at TP 1, different prefill chunks when served
PROMPTS = ["Hi there", "The quick brown fox", "Qwen"]
MAX_NEW = 8


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    """The checkpoint (sharded files with an index; no tokenizer.json: byte tokens, vocabulary
    128, so every generated id is one ASCII character) and transformers' greedy tokens of each
    prompt alone."""
    path = tmp_path_factory.mktemp("qwen3") / "qwen3"
    hf = _llama_ckpt.save_checkpoint(NAME, path, shard_kb=60)
    assert (path / "model.safetensors.index.json").is_file()
    return path, [_llama_ckpt.hf_greedy(hf, list(p.encode()), MAX_NEW) for p in PROMPTS]


def _config(path: Path, **parallel: int) -> RunConfig:
    return RunConfig("generate", ModelOptions(model=str(path)), Parallel(**parallel), GenerateJob())


def test_config_fields(ckpt: tuple[Path, list[list[int]]]) -> None:
    args = read_config(ckpt[0])
    assert (args.qk_norm, args.qkv_bias, args.o_bias) == (True, False, False)
    assert (args.dim, args.n_heads, args.n_kv_heads, args.head_dim) == (64, 4, 2, 24)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flipped_rope_gives_rope_values(dtype: torch.dtype) -> None:
    """The rotation Qwen3's q / k take (a flip and a sign, not a cat) gives the same values,
    eager and compiled by Inductor behind a per-head norm (head_dim 24: halves of 12)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 24, generator=g).to(dtype)  # [B, H, S, D]
    cos, sin = (torch.randn(2, 5, 24, generator=g).to(dtype) for _ in range(2))
    assert torch.equal(apply_rope_flipped(x, cos, sin), apply_rope(x, cos, sin))
    if dtype != torch.float32:
        return

    def normed(rope: Any, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return rope(x, cos, sin)

    compiled = torch.compile(normed, backend="inductor", fullgraph=True)
    got = compiled(apply_rope_flipped, x)
    torch.testing.assert_close(got, normed(apply_rope, x), rtol=0, atol=1e-6)


def test_tp1_generate_equals_transformers(
    ckpt: tuple[Path, list[list[int]]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, expected = ckpt
    args = ["generate", "--model", str(path), "--prompt", PROMPTS[0], "--engine", "none"]
    assert main([*args, "--max-new-tokens", str(MAX_NEW), "--json"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("{")]
    assert json.loads(lines[0])["tokens"] == [expected[0]]


def test_batched_rows_equal_each_prompt_alone(ckpt: tuple[Path, list[list[int]]]) -> None:
    """Three rows of different lengths decoded together give each prompt's tokens alone
    (transformers' generate, one prompt at a time)."""
    path, expected = ckpt
    model = load_llama(path, progress=False)
    assert isinstance(model.blocks[0].attention.wq, QKNormLinear)
    gen = Generator(model, max_batch_size=len(PROMPTS), cache_len=64)
    out = gen.generate([list(p.encode()) for p in PROMPTS], max_new_tokens=MAX_NEW)
    assert out.tokens == expected


def test_each_rank_reads_only_its_slices(ckpt: tuple[Path, list[list[int]]]) -> None:
    """At tp 2 a rank reads exactly the bytes of the parameters it keeps: whole heads of q/k/v
    and o, half the MLP and the vocabulary, the per-head q/k norm weights whole."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    path = ckpt[0]
    total = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    for rank in range(2):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
        try:
            model = load_llama(path, group=dist.group.WORLD, progress=False)
        finally:
            dist.destroy_process_group()
        attn = model.blocks[0].attention
        assert isinstance(attn.wq, QKNormLinear) and isinstance(attn.wk, QKNormLinear)
        assert attn.wq.weight.shape == (2 * 24, 64) and attn.wk.weight.shape == (24, 64)
        assert attn.wq.norm.weight.shape == attn.wk.norm.weight.shape == (24,)
        kept = sum(p.numel() * p.element_size() for p in model.parameters())
        assert model.bytes_read == kept  # vocabulary 128 / 2: no padded rows
        assert model.bytes_read < 0.6 * total


def _dequantized(w: torch.Tensor, scheme: str) -> torch.Tensor:
    from torch_tensorrt_dist.quantization.tensors import (
        dequantize_int4,
        dequantize_int8,
        quantize_int4,
        quantize_int8,
    )

    if scheme == "int8":
        return dequantize_int8(*quantize_int8(w))
    return dequantize_int4(*quantize_int4(w, 32), 32)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_weight_only_matches_the_dequantized_model(
    ckpt: tuple[Path, list[list[int]]], scheme: str
) -> None:
    """Every projection quantized (q and k keep their per-head norm after the weight-only
    matmul), against the model whose matrices are their dequantized copies."""
    from torch_tensorrt_dist.quantization import QuantConfig, quantize_model
    from torch_tensorrt_dist.quantization.experts import QuantizedQKNormLinear

    model, ref = (load_llama(ckpt[0], progress=False) for _ in range(2))
    with torch.no_grad():
        for name, module in ref.named_modules():
            if isinstance(module, nn.Linear) and name.startswith("layers."):
                module.weight.copy_(_dequantized(module.weight, scheme))
    report = quantize_model(model, QuantConfig(scheme, 32 if scheme == "int4" else None))
    assert report.layers == 2 * 7
    assert isinstance(model.blocks[1].attention.wk, QuantizedQKNormLinear)
    tokens = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    for m in (model, ref):
        m.setup_caches(1, 16)
    with torch.no_grad():
        got, expected = model(tokens, torch.arange(10)), ref(tokens, torch.arange(10))
    assert (got - expected).abs().max() <= 0.03 * expected.abs().max()


def _no_tensor_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("a tensor was read before the refusal")

    monkeypatch.setattr(SafetensorsReader, "read_into", refuse)


def test_heads_not_divisible_by_tp_is_refused_before_reading(
    ckpt: tuple[Path, list[list[int]]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = ckpt[0]
    _no_tensor_reads(monkeypatch)
    message = "num_attention_heads=4 is not divisible by tp=3; use tp in [1, 2, 4]"
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        checkpoint_spec(_config(path, tp=3)).plan(_config(path, tp=3))
    assert main(["generate", "--model", str(path), "--tp", "3", "--prompt", "x"]) == 2
    assert message in capsys.readouterr().err


def _edited(src: Path, dest: Path, **fields: Any) -> Path:
    """A copy of checkpoint ``src`` whose config.json has ``fields`` changed (None: removed)."""
    dest.mkdir()
    for f in src.iterdir():
        (dest / f.name).symlink_to(f)
    (dest / "config.json").unlink()
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(fields)
    (dest / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return dest


def test_unknown_model_type_names_the_native_ones(
    ckpt: tuple[Path, list[list[int]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--model-impl native`` on a type no native family runs (``auto`` would hand it to
    transformers' class: tests/test_transformers_family.py)."""
    path = _edited(ckpt[0], tmp_path / "gemma", model_type="gemma3_text")
    _no_tensor_reads(monkeypatch)
    config = RunConfig(
        "generate", ModelOptions(model=str(path), model_impl="native"), Parallel(), GenerateJob()
    )
    with pytest.raises(
        ConfigError,
        match=r"model_type='gemma3_text', which no native model family runs; they run llama, "
        r"mistral, qwen2, qwen3 \(dense\), mixtral, qwen2_moe, qwen3_moe \(mixture of "
        r"experts\) and toy_parallel \(a toy parallel-block decoder, docs/families.md\); "
        r"--model-impl auto \(the default\) or transformers runs other model types",
    ):
        checkpoint_spec(config)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (  # head_dim left out: hidden_size / heads = 16, the weights hold 24 per head
            {"head_dim": None},
            r"tensor 'model.layers.0.self_attn.q_proj.weight' has shape \[96, 64\], but "
            r"config.json implies \[64, 64\] \(num_attention_heads x head_dim=64\)",
        ),
        (  # a Qwen2 config on Qwen3 weights: q/k/v biases it lacks
            {"model_type": "qwen2"},
            r"lacks tensor 'model.layers.0.self_attn.q_proj.bias' \(and 5 more\)",
        ),
    ],
    ids=["head_dim", "qwen2_config"],
)
def test_config_contradicting_weights_names_the_tensor(
    ckpt: tuple[Path, list[list[int]]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fields: dict[str, Any],
    message: str,
) -> None:
    path = _edited(ckpt[0], tmp_path / "edited", **fields)
    _no_tensor_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=message):
        checkpoint_spec(_config(path)).plan(_config(path))


def test_q_norm_missing_is_refused(ckpt: tuple[Path, list[list[int]]], tmp_path: Path) -> None:
    """A Qwen2 checkpoint relabelled qwen3: the per-head norms config.json implies are named."""
    _llama_ckpt.save_checkpoint("qwen2_tied", tmp_path / "qwen2")
    path = _edited(tmp_path / "qwen2", tmp_path / "relabelled", model_type="qwen3")
    with pytest.raises(CheckpointError, match=r"lacks tensor 'model.layers.0.self_attn.q_norm"):
        checkpoint_spec(_config(path)).plan(_config(path))


def test_tp2_generate_starts_its_own_ranks(ckpt: tuple[Path, list[list[int]]]) -> None:
    path, expected = ckpt
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "py"), env.get("PYTHONPATH", "")])
    args = ["generate", "--model", str(path), "--prompt", PROMPTS[1], "--engine", "none"]
    args += ["--tp", "2", "--json", "--max-new-tokens", str(MAX_NEW)]
    proc = subprocess.run(
        [sys.executable, "-m", "torch_tensorrt_dist", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    out = json.loads(lines[0])
    assert out["tokens"] == [expected[1]] and out["tp"] == 2


def test_tp2_serve_concurrent_requests_equal_transformers(
    ckpt: tuple[Path, list[list[int]]],
) -> None:
    """Concurrent greedy completions at TP 2 (rows joining and leaving at different steps):
    each one's text is transformers' tokens for that prompt alone."""
    import openai

    from ._serve import start_server

    path, expected = ckpt
    args = ["--model", str(path), "--served-model-name", "qwen3", "--tp", "2", "--engine", "none"]
    srv = start_server([*args, "--max-batch-size", "4", "--max-seq-len", "64"])
    try:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="none", max_retries=0, timeout=120)

        def ask(prompt: str) -> str:
            res = client.completions.create(
                model="qwen3", prompt=prompt, max_tokens=MAX_NEW, temperature=0
            )
            return str(res.choices[0].text)

        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(ask, PROMPTS))
        assert texts == [bytes(ids).decode() for ids in expected]
        assert srv.stop() == 0
    finally:
        srv.kill()


def test_q_and_k_one_matrix_where_float32_rows_are_kept(
    ckpt: tuple[Path, list[list[int]]],
) -> None:
    """``lay_out_linears`` keeping float32 weights row-major (the Inductor engine's row
    products) makes each layer's q and k weights views of one matrix (``Attention.fuse_qk``),
    which no state dict holds and no later layout change splits; the tokens stay
    transformers'."""
    from torch_tensorrt_dist.models.weight_layout import is_column_major, lay_out_linears

    path, expected = ckpt
    model = load_llama(path, progress=False)
    names = set(model.state_dict())
    lay_out_linears(model, row_major={torch.float32})
    assert set(model.state_dict()) == names
    lay_out_linears(model)  # column-major: but the fused matrix's views
    for block in model.blocks:
        attn = block.attention
        assert attn.wqk is not None and attn.wqk.shape == (
            attn.wq.weight.shape[0] + attn.wk.weight.shape[0],
            attn.wq.weight.shape[1],
        )
        for w in (attn.wq.weight, attn.wk.weight):
            assert w.untyped_storage().data_ptr() == attn.wqk.untyped_storage().data_ptr()
            assert w.is_contiguous()
        assert is_column_major(attn.wv.weight)
    gen = Generator(model, engine="none", max_batch_size=len(PROMPTS), cache_len=64)
    out = gen.generate([list(p.encode()) for p in PROMPTS], max_new_tokens=MAX_NEW)
    assert out.tokens == expected
