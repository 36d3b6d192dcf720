"""Weight-only quantization: the math, the per-rank slice rules, the layers against a
dequantized reference, and what Inductor compiles the decode step into."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer
from torch_tensorrt_dist.parallel.llama import shard_slice, take_slice, tp_layout
from torch_tensorrt_dist.quantization import (
    QuantConfig,
    check_group_slices,
    quant_config,
    quantize_model,
    weight_bytes,
)
from torch_tensorrt_dist.quantization.apply import QuantReport, layer_kind
from torch_tensorrt_dist.quantization.modules import WeightOnlyLinear
from torch_tensorrt_dist.quantization.tensors import (
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

ARGS = ModelArgs(
    dim=128,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    vocab_size=96,
    intermediate_size=256,
    max_seq_len=64,
)


# --- the math ---------------------------------------------------------------------------


def test_int8_codes_and_scales_by_hand() -> None:
    w = torch.tensor([[1.0, -2.0, 0.5, 4.0], [0.0, 0.0, 0.0, 0.0]])
    q, s = quantize_int8(w)
    assert s[0].item() == pytest.approx(4 / 127)
    assert q[0].tolist() == [32, -64, 16, 127]  # round(w * 127 / 4)
    assert q[1].tolist() == [0, 0, 0, 0] and s[1].item() > 0  # a zero row: codes 0, no nan


def test_int4_groups_by_hand() -> None:
    w = torch.tensor([[7.0, -3.5, 1.0, 2.0, 0.1, -0.2, 0.4, -0.7]])
    q, s = quantize_int4(w, 4)
    assert s[0].tolist() == pytest.approx([1.0, 0.1])  # per group: max |w| / 7
    assert q.tolist() == [[7, -4, 1, 2, 1, -2, 4, -7]]  # round half to even: -3.5 -> -4


def test_pack_int4_puts_element_2j_in_the_low_nibble() -> None:
    q = torch.tensor([[1, -2, 7, -8]], dtype=torch.int8)
    assert pack_int4(q).tolist() == [[0xE1, 0x87]]  # -2 = 0xE high, 1 low; -8 = 0x8, 7
    codes = torch.randint(-8, 8, (16, 64), dtype=torch.int8)
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_rounding_error_is_at_most_half_a_step(scheme: str) -> None:
    w = torch.randn(64, 256)
    if scheme == "int8":
        q, s = quantize_int8(w)
        err, step = (dequantize_int8(q, s) - w).abs(), s[:, None]
    else:
        q, s = quantize_int4(w, 64)
        err, step = (dequantize_int4(q, s, 64) - w).abs(), s.repeat_interleave(64, 1)
    assert (err <= step / 2 + 1e-6).all()


@pytest.mark.parametrize(
    ("scheme", "name"),
    [
        ("int8", "layers.0.attention.wq.weight"),  # column-parallel: own output rows
        ("int4", "layers.0.attention.wq.weight"),
        ("int4", "layers.0.feed_forward.w2.weight"),  # row-parallel: own input columns
    ],
)
def test_quantizing_a_rank_slice_equals_slicing_the_whole_quantization(
    scheme: str, name: str
) -> None:
    """Each rank's codes and scales are the whole model's, cut to its slice: rows keep their
    scales, and whole int4 groups never straddle two ranks. (A row-parallel int8 weight has
    per-row scales of its own slice, by design.)"""
    torch.manual_seed(0)
    rows = ARGS.n_heads * ARGS.head_dim if "wq" in name else ARGS.dim
    cols = ARGS.dim if "wq" in name else ARGS.intermediate_size
    full = torch.randn(rows, cols)
    fq, fs = quantize_int8(full) if scheme == "int8" else quantize_int4(full, 32)
    for rank in range(4):
        sl = shard_slice(name, tp_layout(ARGS, rank, 4))
        assert sl is not None
        part = take_slice(full, sl)
        q, s = quantize_int8(part) if scheme == "int8" else quantize_int4(part, 32)
        assert torch.equal(q, take_slice(fq, sl))
        if sl.dim == 0:
            assert torch.equal(s, take_slice(fs, sl))
        else:  # the rank's groups are the global groups [start / 32, stop / 32)
            assert torch.equal(s, fs[:, sl.start // 32 : sl.stop // 32])


# --- options and their errors -------------------------------------------------------------


def test_config_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"'int3' is not a scheme; use int8 .* or int4"):
        QuantConfig("int3")
    with pytest.raises(ConfigError, match="int4 groups are 32, 64 or 128"):
        QuantConfig("int4", group_size=96)
    with pytest.raises(ConfigError, match="applies to int4"):
        QuantConfig("int8", group_size=64)
    with pytest.raises(ConfigError, match="--quantize-embeddings needs --quantize"):
        quant_config(None, embeddings=True)
    assert QuantConfig("int4").group_size == 128
    assert QuantConfig.from_dict(QuantConfig("int4", 64, True).to_dict()) == QuantConfig(
        "int4", 64, True
    )


def test_a_group_straddling_two_ranks_slices_is_refused() -> None:
    args = ModelArgs(dim=256, n_layers=1, n_heads=8, n_kv_heads=4, intermediate_size=768)
    check_group_slices(args, tp=2, config=QuantConfig("int4", 64))  # 128 / 384 per rank
    with pytest.raises(ConfigError) as err:
        check_group_slices(args, tp=4, config=QuantConfig("int4", 128))
    assert str(err.value) == (
        "int4 group size 128 does not divide attention.wo's input (its input slice of 64 "
        "columns per rank at tp=4; groups would straddle two ranks' slices); use "
        "--group-size 32 or 64, or a smaller --tp"
    )
    check_group_slices(args, tp=4, config=QuantConfig("int8"))  # per-channel: any tp


def test_tensorrt_takes_int4_groups_of_64_and_128_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Group 32 is an inductor/eager size; TensorRT's INT4 block quantization takes 64, 128."""
    from torch_tensorrt_dist.cli import main
    from torch_tensorrt_dist.quantization.scheme import check_engine_group

    check_engine_group(QuantConfig("int4", 32), "inductor")
    check_engine_group(QuantConfig("int4", 64), "tensorrt")
    check_engine_group(QuantConfig("int8"), "tensorrt")
    with pytest.raises(ConfigError, match="--group-size 32 with --engine tensorrt"):
        check_engine_group(QuantConfig("int4", 32), "tensorrt")
    args = ModelArgs(dim=256, n_layers=1, n_heads=8, n_kv_heads=4, intermediate_size=768)
    with pytest.raises(ConfigError, match=r"use --group-size 64, or a smaller --tp"):
        check_group_slices(args, tp=4, config=QuantConfig("int4", 128), engine="tensorrt")
    cli = ["generate", "--engine", "tensorrt", "--quantize", "int4", "--group-size", "32"]
    assert main(cli) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "TensorRT's INT4 block quantization takes groups of 64 or 128" in err


def test_int4_layout_follows_engine_and_device() -> None:
    assert layer_kind(QuantConfig("int4"), engine="inductor", device_type="cpu") == "int4_cpu"
    assert layer_kind(QuantConfig("int4"), engine="tensorrt", device_type="cuda") == (
        "int4_nibbles"
    )
    assert layer_kind(QuantConfig("int8"), engine="none", device_type="cuda") == "int8"
    report = QuantReport(QuantConfig("int8"), "int8", 7, 4000, 1000)
    # the module's codes, plus one frozen copy per TensorRT engine (buckets + decode)
    assert [report.engine_bytes(n) for n in (0, 1, 3)] == [1000, 2000, 4000]
    with pytest.raises(ConfigError, match="use --engine tensorrt, or --quantize int8"):
        layer_kind(QuantConfig("int4"), engine="inductor", device_type="cuda")


# --- layers and models against a dequantized reference -------------------------------------


@pytest.mark.parametrize("kind", ["int8", "int4_cpu", "int4_nibbles"])
@pytest.mark.parametrize("rows", [1, 40])  # decode (weight-only kernel) and prefill
def test_layer_matches_the_dequantized_matmul(kind: str, rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(128, 64, bias=True)
    config = QuantConfig("int8" if kind == "int8" else "int4", None if kind == "int8" else 32)
    layer = WeightOnlyLinear.from_linear(linear, config, kind=kind)
    if kind == "int8":
        q, s = quantize_int8(linear.weight.detach())
        w = dequantize_int8(q, s)
    else:
        q, s = quantize_int4(linear.weight.detach(), 32)
        w = dequantize_int4(q, s, 32)
    x = torch.randn(2, rows, 128)
    with torch.no_grad():
        expected = F.linear(x, w, linear.bias)
        got = layer(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    # the matmul runs with bfloat16 activations on CPU: relative error ~ 2^-8
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()


def _dequantized_copy(model: Transformer, scheme: str, group: int) -> Transformer:
    """The same model with every quantized matrix replaced by its dequantized float32 copy."""
    ref = Transformer(model.args)
    ref.load_state_dict(model.state_dict())
    for name, module in ref.named_modules():
        if isinstance(module, nn.Linear) and name.startswith("layers."):
            w = module.weight.detach()
            if scheme == "int8":
                module.weight.data = dequantize_int8(*quantize_int8(w))
            else:
                module.weight.data = dequantize_int4(*quantize_int4(w, group), group)
    return ref.eval()


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_model_matches_its_dequantized_reference(scheme: str) -> None:
    torch.manual_seed(0)
    model = Transformer(ARGS).eval()
    ref = _dequantized_copy(model, scheme, 32)
    before = weight_bytes(model)
    report = quantize_model(model, QuantConfig(scheme, 32 if scheme == "int4" else None))
    assert report.layers == 2 * 7
    linear_bytes = 2 * 4 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256)  # wq wo, wk wv, mlp
    assert report.bytes_before == linear_bytes
    ratio = report.bytes_after / report.bytes_before
    assert (0.25 < ratio < 0.27) if scheme == "int8" else (0.125 < ratio < 0.17)
    assert weight_bytes(model) == before - report.bytes_before + report.bytes_after
    for m in (model, ref):
        m.setup_caches(1, 16)
    tokens = torch.randint(0, ARGS.vocab_size, (1, 12))
    with torch.no_grad():
        got = model(tokens, torch.arange(12))
        expected = ref(tokens, torch.arange(12))
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()


def test_quantized_embeddings_and_head_are_int8_rows() -> None:
    torch.manual_seed(0)
    model = Transformer(ModelArgs(**{**ARGS.__dict__, "tie_embeddings": False})).eval()
    table = model.tok_embeddings.weight.detach().clone()
    head = model.output.weight.detach().clone()  # type: ignore[union-attr]
    quantize_model(model, QuantConfig("int8", embeddings=True))
    assert model.tok_embeddings.weight.dtype == torch.int8
    tokens = torch.tensor([[3, 50, 95]])
    q, s = quantize_int8(table)
    assert torch.allclose(model.tok_embeddings(tokens), dequantize_int8(q, s)[tokens])
    model.setup_caches(1, 8)
    assert model.layers[0].attention.kv_cache.k_cache.dtype == torch.float32  # type: ignore[union-attr]
    x = torch.randn(1, 3, ARGS.dim)
    hq, hs = quantize_int8(head)
    logits = model.output(x)  # type: ignore[misc]
    expected = x @ dequantize_int8(hq, hs).t()
    assert (logits - expected).abs().max() <= 0.02 * expected.abs().max()


# --- what Inductor compiles ---------------------------------------------------------------


def _decode_graph_use(model: nn.Module) -> object:
    from torch_tensorrt_dist.generation.runner import (
        compile_step,
        decode_example,
        paged_step,
        setup_example,
    )
    from torch_tensorrt_dist.quantization.kernel_use import post_grad_graphs, weight_only_use

    torch._dynamo.reset()
    setup_example(model, 1, 64)  # type: ignore[arg-type]
    with post_grad_graphs() as graphs, torch.no_grad():
        compile_step(paged_step(model), "inductor")(*decode_example(1))  # type: ignore[arg-type]
    torch._dynamo.reset()
    return weight_only_use(graphs[-1])


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_compiled_decode_runs_the_weight_only_kernel_on_every_matrix(scheme: str) -> None:
    args = ModelArgs(**{**ARGS.__dict__, "n_layers": 1})
    torch.manual_seed(0)
    model = Transformer(args).eval()
    quantize_model(model, QuantConfig(scheme, 32 if scheme == "int4" else None))
    model.setup_caches(1, 16)
    use = _decode_graph_use(model)
    kernel = "aten._weight_int8pack_mm" if scheme == "int8" else "aten._weight_int4pack_mm_for_cpu"
    assert use.kernels == {kernel: 7}, use  # type: ignore[attr-defined]
    assert use.dequantized == []  # type: ignore[attr-defined]


def test_the_check_sees_gpt_fast_form_dequantize_in_float32() -> None:
    """The control: ``linear(x, w.to(x.dtype)) * scales`` in float32 makes Inductor convert
    the whole int8 matrix to float32 before a dense matmul, and the check says so."""

    class GptFastInt8(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            q, s = quantize_int8(torch.randn(64, 128))
            self.register_buffer("weight", q)
            self.register_buffer("scales", s)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.linear(x, self.weight.to(x.dtype)) * self.scales

    from torch_tensorrt_dist.quantization.kernel_use import post_grad_graphs, weight_only_use

    torch._dynamo.reset()
    fn = torch.compile(GptFastInt8(), backend="torch_tensorrt_dist", options={"engine": "inductor"})
    with post_grad_graphs() as graphs, torch.no_grad():
        fn(torch.randn(1, 128))
    torch._dynamo.reset()
    use = weight_only_use(graphs[-1])
    assert not use.kernels and len(use.dequantized) == 1


def test_an_int8_prefill_graph_whose_chunks_straddle_the_kernel_rows_compiles() -> None:
    """A compiled prefill graph's chunk length is dynamic over [2, limit]; with a limit above
    KERNEL_ROWS the int8 layer's kernel-or-GEMM choice must not add a guard that splits that
    range (Dynamo refused the graph: ``generate --engine inductor --quantize int8`` failed).
    The choice is made once per graph (the dense GEMM here); the tokens equal plain PyTorch's,
    which takes the kernel at decode and the GEMM for the 40-token prompt."""
    from torch_tensorrt_dist.generation import Generator

    def tokens(engine: str) -> list[list[int]]:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = Transformer(ModelArgs(**{**ARGS.__dict__, "max_seq_len": 128})).eval()
        quantize_model(model, QuantConfig("int8"))
        gen = Generator(model, engine=engine, max_batch_size=1, cache_len=128)
        prompt = [(7 * i) % ARGS.vocab_size for i in range(40)]
        return gen.generate([prompt, prompt[:5]], max_new_tokens=6).tokens

    assert tokens("eager") == tokens("none")
