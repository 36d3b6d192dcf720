"""The transformers family (``--model-impl transformers``): transformers' own model classes over
our paged KV cache give HF's greedy tokens, and what cannot run is refused by name before any
weight is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from tests import _hf_ckpt
from torch_tensorrt_dist.config import GenerateJob, ModelOptions, Parallel, RunConfig
from torch_tensorrt_dist.config.jobs import CompileJob
from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.families import DenseSpec, Rank, TransformersSpec, checkpoint_spec
from torch_tensorrt_dist.generation.core import GenerationCore
from torch_tensorrt_dist.generation.generate import Generator
from torch_tensorrt_dist.generation.speculative import SpeculativeConfig
from torch_tensorrt_dist.quantization.scheme import QuantConfig
from torch_tensorrt_dist.testing.checkpoints import hf_greedy

pytestmark = pytest.mark.transformers

NEW = 10


def _config(path: Path, *, impl: str = "auto", tp: int = 1, command: str = "generate") -> RunConfig:
    job: Any = GenerateJob() if command == "generate" else CompileJob(out="x")
    return RunConfig(command, ModelOptions(model=str(path), model_impl=impl), Parallel(tp=tp), job)


def _ours(
    path: Path,
    engine: str,
    *,
    impl: str = "transformers",
    prompts: list[list[int]] = _hf_ckpt.PROMPTS,
    quantize: QuantConfig | None = None,
    **options: Any,
) -> Any:
    """Greedy tokens of the prompts through the spec ``impl`` picks, and the rank's model."""
    config = _config(path, impl=impl).with_(quantize=quantize)
    spec = checkpoint_spec(config)
    model = Rank(config, spec, spec.plan(config)).model()
    kw = dict(max_batch_size=4, cache_len=64, block_size=4, max_prefill_tokens=8) | options
    gen = Generator(model, engine=engine, **kw)
    return gen.generate(prompts, max_new_tokens=NEW), model


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root, made = tmp_path_factory.mktemp("hf"), {}

    def get(kind: str) -> tuple[Path, list[list[int]]]:
        if kind not in made:
            path, model = _hf_ckpt.save(kind, root)
            made[kind] = (path, hf_greedy(model, _hf_ckpt.PROMPTS, NEW))
        return made[kind]  # type: ignore[no-any-return]

    return get


@pytest.mark.parametrize("kind", sorted(_hf_ckpt.CONFIGS))
def test_exact_at_tp1(ckpts: Any, kind: str) -> None:
    """Chunked prefill (19 tokens, budget 8) over blocks of 4, three rows at once: HF's tokens
    (gemma2/3: soft-capping, sliding windows, query_pre_attn_scalar; granite: its multipliers;
    gpt_oss: sinks, alternating windows, fused experts as stored; deepseek_v3: K and V of
    different sizes, experts stored one by one and fused at load, a router bias buffer;
    mixtral: its experts' names renamed and fused as transformers' conversion does)."""
    path, ref = ckpts(kind)
    res, model = _ours(path, "none")
    assert res.tokens == ref
    assert 0 < model.bytes_read <= sum(f.stat().st_size for f in path.glob("*.safetensors"))


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_eager_engine_exact(ckpts: Any, kind: str) -> None:
    """One compiled graph per shape class through our backend, the same tokens; llama's also
    equal the native family's on the same checkpoint."""
    path, ref = ckpts(kind)
    res, _ = _ours(path, "eager")
    assert res.tokens == ref
    if kind == "llama":
        native, model = _ours(path, "eager", impl="native")
        assert not hasattr(model, "hf")  # the native Transformer
        assert native.tokens == ref


@pytest.mark.parametrize("kind", ["llama", "gemma3_text", "gpt_oss"])
def test_cpu_decode_attention_exact(ckpts: Any, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode steps through the CPU decode-attention op (what the Inductor engine takes on the
    CPU) give HF's tokens: llama, gemma3_text (sliding windows, its own scaling) attend through
    it; gpt_oss's sinks keep the gathered form (the op has none)."""
    from torch_tensorrt_dist.models import hf_attention
    from torch_tensorrt_dist.models.hf_model import PagedHFModel
    from torch_tensorrt_dist.ops import cpu_attention

    if not cpu_attention.available():
        pytest.skip(f"the CPU op is not built here: {cpu_attention.unavailable_reason()}")
    setup, op, calls = PagedHFModel.setup_paged, hf_attention.decode_attention, []

    def with_op(model: PagedHFModel, *args: Any, **kw: Any) -> None:
        setup(model, *args, **{**kw, "cpu_decode": True})

    monkeypatch.setattr(PagedHFModel, "setup_paged", with_op)
    monkeypatch.setattr(hf_attention, "decode_attention", lambda *a: (calls.append(1), op(*a))[1])
    path, ref = ckpts(kind)
    res, _ = _ours(path, "none")
    assert res.tokens == ref
    assert bool(calls) == (kind != "gpt_oss")


@pytest.mark.parametrize("quant", [QuantConfig("int8"), QuantConfig("int4", 32)])
def test_quantized_as_native(ckpts: Any, quant: QuantConfig) -> None:
    """``--quantize``: the plan's colwise / rowwise linears become weight-only ones (the seven
    of each layer), and llama's tokens are the native family's quantized alike."""
    from torch_tensorrt_dist.quantization.modules import WeightOnlyLinear

    path, _ = ckpts("llama")
    res, model = _ours(path, "none", quantize=quant)
    native, _ = _ours(path, "none", impl="native", quantize=quant)
    assert res.tokens == native.tokens
    quantized = [m for m in model.modules() if isinstance(m, WeightOnlyLinear)]
    assert len(quantized) == 7 * 2 and {m.kind for m in quantized} == {
        "int8" if quant.scheme == "int8" else "int4_cpu"
    }


def test_shared_parameter_filled_once(tmp_path: Path) -> None:
    """roberta's LM head shares its bias with the decoder linear: the loader fills the one
    parameter for both modules (it was left on the meta device), and the tokens are HF's
    (the survey's own run of a tiny checkpoint, ``testing/hf_survey.tp1_verdict``)."""
    from torch_tensorrt_dist.testing.hf_survey import tp1_verdict

    assert tp1_verdict("roberta", tmp_path) == "exact"


def test_preemption_and_prefix_cache(ckpts: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool too small for the three rows at once (10 blocks of 4; they need 8 + 4 + 3)
    preempts and recomputes, and still gives HF's tokens; a prompt given again after the first
    finished takes its 4 full blocks from the prefix cache."""
    path, ref = ckpts("llama")
    preempted: list[int] = []
    preempt = GenerationCore._preempt
    monkeypatch.setattr(
        GenerationCore, "_preempt", lambda core, rid: (preempted.append(rid), preempt(core, rid))
    )
    # 2 layers x 2 KV heads x (16 + 16) x 4 bytes x 4 tokens = 2 KiB a block
    res, _ = _ours(path, "none", cache_len=32, kv_cache_memory=10 * 2048)
    assert res.tokens == ref
    assert preempted
    prompt = _hf_ckpt.PROMPTS[0]
    res, _ = _ours(path, "none", prompts=[prompt, prompt], max_batch_size=1)
    assert res.tokens == [ref[0], ref[0]]
    assert res.cached_tokens == [0, 16]


def test_kv_estimate_is_the_pools(ckpts: Any) -> None:
    """``check_kv_cache``'s estimate (``kv_layout_for`` over the plan's ModelArgs) is what a
    rank's pools hold per token, for every model here at TP 1 and TP 2 (phi3, olmo2, gpt_oss:
    a plan that keeps every KV head on every rank; deepseek_v3: K 24 and V 12 per head); the
    built model's own layout (``kv_layout``) too."""
    import transformers

    from torch_tensorrt_dist.generation.kv_memory import kv_layout, kv_layout_for
    from torch_tensorrt_dist.models.hf_config import kv_shape, model_args

    for kind in _hf_ckpt.CONFIGS:
        cfg = transformers.CONFIG_MAPPING[kind](**{**_hf_ckpt.TINY, **_hf_ckpt.CONFIGS[kind]})
        for tp in (1, 2):
            kv = kv_shape(cfg, tp=tp)
            pools = cfg.num_hidden_layers * kv.kv_heads * (kv.k_dim + kv.v_dim) * 4
            layout = kv_layout_for(model_args(cfg, tp=tp), tp=tp, dtype=torch.float32, block_size=1)
            assert layout.bytes_per_token == pools, (kind, tp)
    path, _ = ckpts("deepseek_v3")
    _, model = _ours(path, "none", prompts=[[1, 2]])
    per_block = sum(p.k_pool[0].nbytes + p.v_pool[0].nbytes for p in model.kv_pools)
    assert kv_layout(model, block_size=4).bytes_per_block == per_block == 2 * 4 * (24 + 12) * 16


def test_selection(ckpts: Any) -> None:
    """auto: native where a native family runs the model_type, else transformers;
    --model-impl forces either (native refuses a model_type it does not run)."""
    llama, _ = ckpts("llama")
    gemma, _ = ckpts("gemma2")
    assert isinstance(checkpoint_spec(_config(llama)), DenseSpec)
    assert isinstance(checkpoint_spec(_config(llama, impl="transformers")), TransformersSpec)
    assert isinstance(checkpoint_spec(_config(gemma)), TransformersSpec)
    native = _config(gemma, impl="native")
    with pytest.raises(ConfigError, match="model_type='gemma2'"):
        checkpoint_spec(native).plan(native)
    with pytest.raises(ConfigError, match="--model-impl 'hf' is not one of"):
        ModelOptions(model_impl="hf")


def _config_dir(root: Path, name: str, cfg: dict[str, Any]) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def _plan_error(path: Path, tp: int = 1, command: str = "generate") -> str:
    config = _config(path, impl="transformers", tp=tp, command=command)
    with pytest.raises((ConfigError, CheckpointError)) as info:
        checkpoint_spec(config).plan(config)
    return str(info.value)


def test_refusals_before_any_weight(tmp_path: Path, ckpts: Any) -> None:
    """Each refusal names what was found; none of these directories holds a weight."""
    import transformers

    def saved(kind: str, **fields: Any) -> Path:
        path = tmp_path / kind
        transformers.CONFIG_MAPPING[kind](**fields).save_pretrained(path)
        return path

    remote = _config_dir(tmp_path, "remote", {"model_type": "llama", "auto_map": {"x": "y.Z"}})
    assert "auto_map" in _plan_error(remote) and "never executed" in _plan_error(remote)
    unknown = _config_dir(tmp_path, "unknown", {"model_type": "not_a_model"})
    assert f"transformers {transformers.__version__}" in _plan_error(unknown)
    assert "'not_a_model'" in _plan_error(unknown)
    assert "linear_attention" in _plan_error(saved("qwen3_next", num_hidden_layers=4))
    assert "linear_attention" in _plan_error(saved("mamba", num_hidden_layers=2))
    assert "no base_model_tp_plan" in _plan_error(saved("gpt2", n_layer=2), tp=2)
    heads = saved("llama", num_attention_heads=6, num_key_value_heads=3, hidden_size=96)
    assert "--tp 4 does not divide" in _plan_error(heads, tp=4)
    path, _ = ckpts("llama")
    assert "`compile` does not package" in _plan_error(path, command="compile")
    phi3, _ = ckpts("phi3")  # its plan gathers qkv: no quantized colwise / rowwise slice
    quantized = _config(phi3, impl="transformers", tp=2).with_(quantize=QuantConfig("int8"))
    with pytest.raises(
        ConfigError, match=r"splits model\.layers\.0\.\S+ as '(colwise_ga|rowwise_sp)"
    ):
        checkpoint_spec(quantized).plan(quantized)
    embeddings = _config(path, impl="transformers").with_(quantize=QuantConfig("int8", None, True))
    with pytest.raises(ConfigError, match="--quantize-embeddings"):
        checkpoint_spec(embeddings).plan(embeddings)
    for change in (
        dict(parallel=Parallel(tp=1, ep=2)),
        dict(speculative=SpeculativeConfig("ngram", 4)),
    ):
        config = _config(path, impl="transformers").with_(**change)
        with pytest.raises(ConfigError, match=r"with --tp only|--speculative"):
            checkpoint_spec(config).plan(config)


def test_config_contradicting_weights(tmp_path: Path, ckpts: Any) -> None:
    """A config.json whose sizes differ from the weights: refused naming the tensor (headers
    only, before allocating)."""
    path, _ = ckpts("llama")
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in path.iterdir():
        (bad / f.name).symlink_to(f)
    cfg = json.loads((path / "config.json").read_text())
    (bad / "config.json").unlink()
    (bad / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 96}))
    message = _plan_error(bad)
    assert "'model.layers.0.mlp.gate_proj.weight' has shape [128, 64]" in message
    # experts stored one by one, fused by the loader: a part of the wrong size is named
    moe, _ = _hf_ckpt.save("deepseek_v3", tmp_path)
    weights = moe / "model.safetensors"
    state = safetensors.torch.load_file(weights)
    state["model.layers.1.mlp.experts.3.up_proj.weight"] = torch.zeros(16, 64)
    safetensors.torch.save_file(state, weights, metadata={"format": "pt"})
    message = _plan_error(moe)
    assert "'model.layers.1.mlp.experts.3.up_proj.weight' has shape [16, 64]" in message
    assert "implies [32, 64] (its part of 'model.layers.1.mlp.experts.gate_up_proj')" in message
    del state["model.layers.1.mlp.experts.3.up_proj.weight"]
    safetensors.torch.save_file(state, weights, metadata={"format": "pt"})
    assert "lacks tensor 'model.layers.1.mlp.experts.3.up_proj.weight'" in _plan_error(moe)


def test_native_families_import_no_transformers() -> None:
    """transformers is optional: the families and the core import without it. And a native
    checkpoint loaded (built on the meta device) and run by the ``none`` engine imports no
    Dynamo (seconds of a CLI's or a server's start, for nothing it compiles)."""
    code = (
        "import sys, torch_tensorrt_dist.families, torch_tensorrt_dist.generation; "
        "assert 'transformers' not in sys.modules, 'transformers imported'; "
        "from torch_tensorrt_dist.models.demo import demo_checkpoint_path; "
        "from torch_tensorrt_dist.parallel.llama_load import load_llama; "
        "model = load_llama(demo_checkpoint_path(), progress=False); "
        "gen = torch_tensorrt_dist.generation.Generator(model, engine='none', cache_len=16); "
        "assert len(gen.generate([[5, 6]], max_new_tokens=2).tokens[0]) == 2; "
        "assert 'torch._dynamo' not in sys.modules, 'Dynamo imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serve_tp2_gives_generate_tokens(ckpts: Any) -> None:
    """``serve`` picks the family by itself (gemma2: no native family) and, at TP 2, answers
    three greedy completions of token ids sent together (rows batched, joining and leaving at
    different steps) each with the text of HF's tokens for that prompt alone."""
    import concurrent.futures as cf

    import httpx

    from tests._serve import start_server
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer

    path, ref = ckpts("gemma2")
    args = ["--model", str(path), "--engine", "none", "--max-seq-len", "64", "--tp", "2"]
    server = start_server([*args, "--max-batch-size", "4"])  # started: no second ``with``

    def ask(prompt: list[int]) -> dict[str, Any]:
        body = {"model": "gemma2", "prompt": prompt, "max_tokens": NEW, "temperature": 0}
        out: dict[str, Any] = httpx.post(
            f"{server.url}/v1/completions", json=body, timeout=120
        ).json()
        return out

    try:
        with cf.ThreadPoolExecutor(len(_hf_ckpt.PROMPTS)) as pool:
            replies = list(pool.map(ask, _hf_ckpt.PROMPTS))
    finally:
        assert server.stop() == 0
    tokenizer = load_tokenizer(path, vocab_size=256)
    assert [r["choices"][0]["text"] for r in replies] == [tokenizer.decode(t) for t in ref]
    assert [r["usage"]["completion_tokens"] for r in replies] == [NEW] * len(ref)
