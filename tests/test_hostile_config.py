"""config.json against the weights, and every config field by name: refused in one line before
anything is built (a 100000-layer config on 4-layer weights costs a header read, not minutes)."""

from __future__ import annotations

import json
import math
import resource
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import _moe_ckpt
from tests._hostile import copy_demo, edit_config, edit_header
from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.models.llama import Transformer
from torch_tensorrt_dist.models.llama_args import ModelArgs, read_config
from torch_tensorrt_dist.models.moe import MoETransformer
from torch_tensorrt_dist.models.moe_args import moe_args_from_hf_config
from torch_tensorrt_dist.models.weights_check import check_checkpoint, llama_tensors, moe_tensors
from torch_tensorrt_dist.parallel.llama_load import hf_name, load_llama
from torch_tensorrt_dist.parallel.moe_load import expert_key, moe_hf_name

# (id, config.json changes, message regex) on a copy of the demo checkpoint
MISMATCH_CASES = [
    (
        "layers_100000",
        {"num_hidden_layers": 100000},
        r"config.json says num_hidden_layers=100000, but .* holds 4 layers \(0-3\)",
    ),
    ("layers_2", {"num_hidden_layers": 2}, r"num_hidden_layers=2, but .* holds 4 layers"),
    (
        "intermediate_1e9",
        {"intermediate_size": 1e9},
        r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[768, 256\], "
        r"but config.json implies \[1000000000, 256\] \(intermediate_size=1000000000\)",
    ),
    (
        "vocab_2e9",
        {"vocab_size": 2 * 10**9},
        r"tensor 'model.embed_tokens.weight' has shape \[1024, 256\], but config.json implies "
        r"\[2000000000, 256\] \(vocab_size=2000000000\)",
    ),
    (
        "kv_heads",
        {"num_key_value_heads": 8},
        r"'model.layers.0.self_attn.k_proj.weight' has shape \[128, 256\], but config.json implies "
        r"\[256, 256\] \(num_key_value_heads x head_dim=256\)",
    ),
    ("untied", {"tie_word_embeddings": False}, r"lacks tensor 'lm_head.weight', which config"),
    (
        "dtype",
        {"torch_dtype": "float16", "dtype": "float16"},
        r"tensor 'model.embed_tokens.weight' is bfloat16, but config.json says the weights are "
        r"float16",
    ),
]


@pytest.mark.parametrize(
    ("fields", "message"), [c[1:] for c in MISMATCH_CASES], ids=[c[0] for c in MISMATCH_CASES]
)
def test_config_against_weights(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    ckpt = copy_demo(tmp_path)
    edit_config(ckpt, **fields)
    with pytest.raises(CheckpointError, match=message) as exc:
        check_checkpoint(ckpt, read_config(ckpt))
    assert "\n" not in str(exc.value)


def test_load_llama_refuses_before_allocating(tmp_path: Path) -> None:
    """The loader checks first: 100000 layers and a 1e12 vocabulary cost no memory."""
    ckpt = copy_demo(tmp_path)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    huge = ({"num_hidden_layers": 100000}, {"vocab_size": 2**31 - 1, "num_hidden_layers": 4})
    for fields in huge:
        edit_config(ckpt, **fields)
        with pytest.raises(CheckpointError, match="the config and weights do not match"):
            load_llama(ckpt, progress=False)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024, f"peak memory grew by {grown_kib} KiB"


def test_relabelled_dtype_is_refused(tmp_path: Path) -> None:
    """BF16 bytes relabelled F16 (same size, valid format) would load as other numbers; the
    config's dtype, or an integer dtype on its own, says they are not the weights."""
    ckpt = copy_demo(tmp_path)
    norm = "model.layers.2.post_attention_layernorm.weight"
    edit_header(ckpt, lambda h: h[norm].update(dtype="F16"))
    with pytest.raises(
        CheckpointError,
        match=rf"'{norm}' is float16, but config.json says .* "
        "bfloat16",
    ):
        check_checkpoint(ckpt, read_config(ckpt))
    edit_header(ckpt, lambda h: h[norm].update(dtype="I16"))
    edit_config(ckpt, torch_dtype=..., dtype=...)
    with pytest.raises(CheckpointError, match=rf"'{norm}' is int16, but .* floating point"):
        check_checkpoint(ckpt, read_config(ckpt))


NAN, INF = float("nan"), float("inf")
# (id, config.json changes, message regex): each field named, before any weights are read
FIELD_CASES = [
    (
        "rope_theta_nan",
        {"rope_theta": NAN, "rope_parameters": ...},
        r"config.json rope_theta must be a finite number in \(0, 3.40282e\+38\], got NaN",
    ),
    (
        "rope_parameters_theta_inf",
        {"rope_parameters": {"rope_theta": INF, "rope_type": "default"}},
        r"config.json rope_theta must be a finite number",
    ),
    (
        "eps_nan",
        {"rms_norm_eps": NAN},
        r"config.json rms_norm_eps must be a finite number in \(0, 1\)",
    ),
    (
        "vocab_1e12",
        {"vocab_size": 1e12},
        r"config.json vocab_size must be an integer in \[1, 2147483647\], got 1000000000000",
    ),
    ("eps_zero", {"rms_norm_eps": 0}, r"rms_norm_eps must be a finite number in \(0, 1\), got 0"),
    (
        "rope_factor_nan",
        {"rope_parameters": {"rope_type": "linear", "factor": NAN}},
        r"config.json rope_parameters factor must be a finite number in \[1, ",
    ),
    (
        "llama3_bands",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 4.0,
            },
            "rope_parameters": ...,
        },
        r"RoPE high_freq_factor \(> low_freq_factor\) must be a finite number in \(4, ",
    ),
    ("heads_missing", {"num_attention_heads": ...}, r"config.json lacks num_attention_heads"),
    (
        "heads_null",
        {"num_attention_heads": None},
        r"config.json has num_attention_heads=null; it must be an integer in \[1, ",
    ),
    (
        "hidden_abc",
        {"hidden_size": "abc"},
        r'config.json hidden_size must be an integer .*got "abc"',
    ),
    ("layers_fraction", {"num_hidden_layers": 4.5}, r"num_hidden_layers must be an integer"),
    ("layers_huge", {"num_hidden_layers": 10**400}, r"num_hidden_layers must be an integer in"),
    (
        "tied_string",
        {"tie_word_embeddings": "false"},
        r'config.json tie_word_embeddings must be true or false, got "false"',
    ),
    ("rope_list", {"rope_scaling": [8.0]}, r"config.json rope_scaling must be an object or null"),
    ("eos_string", {"eos_token_id": "</s>"}, r"config.json eos_token_id must be an integer"),
]


@pytest.mark.parametrize(
    ("fields", "message"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES]
)
def test_config_fields_are_checked_by_name(
    tmp_path: Path, fields: dict[str, Any], message: str
) -> None:
    ckpt = copy_demo(tmp_path)
    edit_config(ckpt, **fields)
    with pytest.raises(ConfigError, match=message) as exc:
        read_config(ckpt)
    assert "\n" not in str(exc.value)


def test_config_file_itself(tmp_path: Path) -> None:
    ckpt = copy_demo(tmp_path)
    (ckpt / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"config.json holds a JSON list, not an object"):
        read_config(ckpt)
    (ckpt / "config.json").write_bytes(b'{"hidden_size": "\xff"}')
    with pytest.raises(CheckpointError, match=r"config.json is not valid JSON: 'utf-8' codec"):
        read_config(ckpt)


def test_moe_config_fields_and_shapes(tmp_path: Path) -> None:
    cfg = _moe_config("qwen2_moe")
    for field, value, message in [
        ("mlp_only_layers", "1", "mlp_only_layers must be a list"),
        ("num_experts", NAN, "config.json num_experts must be an integer"),
        ("norm_topk_prob", "yes", "norm_topk_prob must be true or false"),
        ("moe_intermediate_size", None, "moe_intermediate_size=null"),
    ]:
        with pytest.raises(ConfigError, match=message):
            moe_args_from_hf_config({**cfg, field: value})


# --- the tables the checks use equal what the loaders read -------------------------------


def _meta_llama(args: ModelArgs) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = Transformer(args)
    out = {hf_name(n, args): tuple(p.shape) for n, p in model.named_parameters()}
    out[hf_name("output.weight", args)] = (args.vocab_size, args.dim)
    return out


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_embeddings": False, "qkv_bias": True, "o_bias": True},
        {"n_kv_heads": 4},
        {"qk_norm": True, "head_dim": 24},  # Qwen3: per-head q/k norms, head_dim != dim / heads
    ],
)
def test_llama_table_equals_the_model(overrides: dict[str, Any]) -> None:
    args = ModelArgs.from_name("tiny", **overrides)
    assert llama_tensors(args) == _meta_llama(args)


def _moe_config(name: str) -> dict[str, Any]:
    model_type, cfg = _moe_ckpt.CONFIGS[name]
    return {**_moe_ckpt._COMMON, **cfg, "model_type": model_type}


@pytest.mark.parametrize("name", sorted(_moe_ckpt.CONFIGS))
def test_moe_table_equals_the_model(name: str) -> None:
    args, moe = moe_args_from_hf_config(_moe_config(name))
    with torch.device("meta"):
        model = MoETransformer(args, moe)
    want: dict[str, tuple[int, ...]] = {}
    for n, p in model.named_parameters():
        key = moe_hf_name(n, args, moe)
        if key is not None:
            want[key] = (args.vocab_size, args.dim) if n == "output.weight" else tuple(p.shape)
    for i in moe.sparse_layers:
        for e in range(moe.n_experts):
            for kind in ("w1", "w3", "w2"):
                size, d = moe.expert_size, args.dim
                want[expert_key(i, e, kind, moe)] = (d, size) if kind == "w2" else (size, d)
    assert moe_tensors(args, moe, names=()) == want


def test_moe_checkpoint_shapes_name_the_field(tmp_path: Path) -> None:
    """A Qwen2-MoE checkpoint (shared expert, a dense layer) written from the table: each
    config field that disagrees with the weights is named."""
    from safetensors.torch import save_file

    from torch_tensorrt_dist.models.moe_args import read_moe_config

    cfg = _moe_config("qwen2_moe")
    args, moe = moe_args_from_hf_config(cfg)
    tensors = {n: torch.zeros(shape) for n, shape in moe_tensors(args, moe, names=()).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    cases = [
        (
            {"moe_intermediate_size": 32},
            r"experts.0.gate_proj.weight' has shape \[16, 64\], but "
            r"config.json implies \[32, 64\] \(moe_intermediate_size=32\)",
        ),
        (
            {"shared_expert_intermediate_size": 16},
            r"shared_expert.gate_proj.weight' has shape "
            r"\[32, 64\], .* \(shared_expert_intermediate_size=16\)",
        ),
        ({"num_experts": 10**6}, r"num_experts=1000000, but layer 0 of .* holds experts 4 \(0-3\)"),
        ({"mlp_only_layers": []}, r"layer 1 of .* holds experts 0 \(none\)"),
    ]
    for fields, message in cases:
        (tmp_path / "config.json").write_text(json.dumps({**cfg, **fields}))
        with pytest.raises(CheckpointError, match=message):
            check_checkpoint(tmp_path, *read_moe_config(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    check_checkpoint(tmp_path, *read_moe_config(tmp_path))  # the untouched checkpoint passes


def test_validators() -> None:
    from torch_tensorrt_dist.validation import check_float, check_int, check_seed, check_text

    assert check_float(1, name="x", low=0.0) == 1.0
    for bad in (NAN, INF, -INF, "1.0", True, None, 10**400):
        with pytest.raises(ConfigError, match="x must be a finite number"):
            check_float(bad, name="x")
    with pytest.raises(ConfigError, match=r"x must be a finite number in \(0, 1\], got 0"):
        check_float(0.0, name="x", low=0.0, high=1.0, low_open=True)
    assert check_int(1e3, name="n") == 1000 and isinstance(check_int(1e3, name="n"), int)
    for bad in (1.5, NAN, "3", False):
        with pytest.raises(ConfigError, match="n must be an integer"):
            check_int(bad, name="n")
    assert check_seed(2**64 - 1) == 2**64 - 1
    for bad in (2**64, -1, 1.0):
        with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*64\)"):
            check_seed(bad)
    assert check_text("héllo", name="--prompt") == "héllo"
    bad_text = b"ab\xffc".decode("utf-8", "surrogateescape")
    with pytest.raises(ConfigError, match="--prompt is not valid UTF-8 text: byte 0xff at "):
        check_text(bad_text, name="--prompt")
    assert math.isclose(check_float(1e-300, name="x"), 1e-300)


def test_output_file_is_checked_first(tmp_path: Path) -> None:
    from torch_tensorrt_dist.validation import check_output_file

    assert check_output_file(tmp_path / "a.json", name="--json") == tmp_path / "a.json"
    with pytest.raises(ConfigError, match=r"--json .* is a directory; give a file path"):
        check_output_file(tmp_path, name="--json")
    with pytest.raises(ConfigError, match=r"the directory .*nope does not exist"):
        check_output_file(tmp_path / "nope" / "a.json", name="--json")
