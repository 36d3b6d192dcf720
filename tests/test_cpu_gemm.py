"""``cpu_gemm="template"``: the Inductor engine's matrix products by Inductor's C++ GEMM
template over the weights made constants (``backend/cpu_gemm.py``); ``"auto"``: the template
for the generator's decode steps of few rows, ATen's elsewhere and for a graph the template
cannot take."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import torch_tensorrt_dist  # noqa: F401  (registers the backend)
from torch_tensorrt_dist.backend import CompileSettings
from torch_tensorrt_dist.backend.cpu_gemm import gemm_weights
from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.parallel.llama_load import load_llama

from . import _llama_ckpt

PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2]]
MAX_NEW = 10


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)
    ).eval()


def _compiled(model: torch.nn.Module, cpu_gemm: str) -> Any:
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(
        model, backend="torch_tensorrt_dist", options={"engine": "inductor", "cpu_gemm": cpu_gemm}
    )


def test_the_template_computes_the_products_and_aten_does_not():
    model, x = _mlp(), torch.randn(5, 64)
    with torch.no_grad():
        want = model(x)
        fn = _compiled(model, "template")
        got = fn(x)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 2  # both linears
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for rows in (3, 9):  # another row count: recompiled once with M dynamic
            other = torch.randn(rows, 64)
            torch.testing.assert_close(fn(other), model(other), rtol=1e-5, atol=1e-5)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 4
        plain = _compiled(model, "aten")(x)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 0
        torch.testing.assert_close(plain, want, rtol=1e-5, atol=1e-5)


def test_a_weight_changed_in_place_is_seen():
    """The template packs the weight at compile time; a write into the weight afterwards
    (``load_state_dict``) raises its version, and the graph builds itself again with the new
    values (``freeze_constants.drop_frozen``) rather than run the packed old ones."""
    model, x = _mlp(), torch.randn(2, 64)
    with torch.no_grad():
        fn = _compiled(model, "template")
        before = fn(x)
        model[0].weight.mul_(2.0)
        after = fn(x)
        torch.testing.assert_close(after, model(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(after, before)
        assert counters["inductor"]["cpp_templated_kernel_counter"] == 4  # built twice


def test_only_float_matrices_that_are_parameters_are_taken():
    w = torch.nn.Parameter(torch.randn(4, 4))
    inputs = [
        w,
        torch.randn(4, 4),  # an activation or a buffer: stays an input
        torch.nn.Parameter(torch.randn(4)),  # a bias
        torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.int8), requires_grad=False),
        torch.nn.Parameter(torch.randn(4, 4, dtype=torch.bfloat16)),
    ]
    assert gemm_weights(inputs) == [0, 4]


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="cpu_gemm='fast' is not one of aten, template, auto"):
        CompileSettings(engine="inductor", cpu_gemm="fast")
    with pytest.raises(ConfigError, match="applies to engine='inductor' only"):
        CompileSettings(engine="eager", cpu_gemm="template")


def test_generation_tokens_equal_transformers(tmp_path):
    """The paged step (prefill and decode graphs, KV pools written in the graph: buffers, not
    frozen) with the template: the same greedy tokens as HF transformers."""
    pytest.importorskip("transformers")
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path / "ckpt")
    want = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
    torch._dynamo.reset()
    counters.clear()
    model = load_llama(str(tmp_path / "ckpt"), progress=False)
    gen = Generator(
        model, engine="inductor", max_batch_size=len(PROMPTS), cache_len=64, cpu_gemm="template"
    )
    assert gen.generate(PROMPTS, max_new_tokens=MAX_NEW).tokens == want
    assert counters["inductor"]["cpp_templated_kernel_counter"] > 0


def test_the_flag_reaches_the_run_config_and_bad_uses_are_refused():
    from torch_tensorrt_dist.cli import build_parser
    from torch_tensorrt_dist.cli._options import run_config
    from torch_tensorrt_dist.config.jobs import GenerateJob

    def config(*argv: str) -> Any:
        ns = build_parser().parse_args(["generate", "--prompt", "hi", *argv])
        return run_config(ns, GenerateJob())

    from torch_tensorrt_dist.backend.settings import CPU_GEMMS
    from torch_tensorrt_dist.config.run import CPU_GEMMS as CLI_GEMMS

    assert CLI_GEMMS == CPU_GEMMS  # two layers, one list of values (settings.py says why)
    assert config("--engine", "inductor").cpu_gemm == "reduce"  # the default
    assert config("--engine", "inductor", "--cpu-gemm", "template").cpu_gemm == "template"
    with pytest.raises(ConfigError, match="applies to --engine inductor only"):
        config("--engine", "eager", "--cpu-gemm", "template")
    # auto is the template where it applies: aten with another engine, artifacts as compiled
    assert config("--engine", "eager", "--cpu-gemm", "auto").cpu_gemm == "auto"
    assert config("--artifacts", "/a", "--cpu-gemm", "auto").cpu_gemm == "auto"
    with pytest.raises(SystemExit):  # argparse names the choices
        build_parser().parse_args(["serve", "--cpu-gemm", "fast"])
    # compile builds artifacts (their GEMMs fixed there): it takes no such flag, and a serve
    # from artifacts refuses it
    assert build_parser().parse_args(["compile", "--out", "x"]).cpu_gemm == "reduce"
    with pytest.raises(ConfigError, match="--artifacts runs graphs compiled already"):
        config("--artifacts", "/a", "--engine", "inductor", "--cpu-gemm", "template")


#: how each option's products show in Dynamo's counters: templated kernels, rewritten products
_USED = {
    "template": ("inductor", "cpp_templated_kernel_counter"),
    "reduce": ("torch_tensorrt_dist", "reduced_products"),
}


def _tp_rank(rank: int, world: int, path: str, cpu_gemm: str) -> dict[str, Any]:
    import torch.distributed as dist

    torch._dynamo.reset()
    counters.clear()
    model = load_llama(path, group=dist.group.WORLD, progress=False)
    gen = Generator(
        model, engine="inductor", max_batch_size=len(PROMPTS), cache_len=64, cpu_gemm=cpu_gemm
    )
    tokens = gen.generate(PROMPTS, max_new_tokens=MAX_NEW).tokens
    group, name = _USED[cpu_gemm]
    return {"tokens": tokens, "used": counters[group][name]}


@pytest.mark.parametrize("cpu_gemm", ["template", "reduce"])
def test_tp2_tokens_equal_transformers(tmp_path, cpu_gemm):
    """Two gloo ranks, each with its shard's weights (frozen and packed by the template,
    row-major for the reductions, ``backend/row_products.py``), the collectives in the same
    graph: the same greedy tokens as the unsharded model in HF transformers."""
    pytest.importorskip("transformers")
    from torch_tensorrt_dist.testing import run_on_ranks

    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path / "ckpt")
    want = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
    results = run_on_ranks(_tp_rank, 2, str(tmp_path / "ckpt"), cpu_gemm, timeout=300)
    for rank, res in enumerate(results):
        assert res["tokens"] == want, rank
        assert res["used"] > 0, rank


def test_a_product_of_two_activations_is_refused_naming_aten():
    """The template takes constant weights only, and the compile offers it alone: a product of
    two inputs has no kernel to run, which is said in one line naming the other setting."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y

    torch._dynamo.reset()
    fn = torch.compile(
        f, backend="torch_tensorrt_dist", options={"engine": "inductor", "cpu_gemm": "template"}
    )
    with pytest.raises(Exception, match="compile it with cpu_gemm='aten' \\(or 'auto'") as info:
        fn(torch.randn(4, 8), torch.randn(8, 16))
    # Dynamo wraps what a backend raises (BackendCompilerFailed); ours is the one inside
    inner = getattr(info.value, "inner_exception", info.value)
    assert isinstance(inner, ConfigError), repr(inner)


def test_auto_compiles_a_graph_the_template_cannot_take_with_aten():
    """``auto`` in the backend: the template where the graph's products all take it (the
    MLP's two linears), ATen's for a graph where one does not (a product of two inputs),
    which then runs and is right."""

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ y)

    x, y = torch.randn(4, 8), torch.randn(8, 16)
    fn = _compiled(f, "auto")  # type: ignore[arg-type]
    torch.testing.assert_close(fn(x, y), f(x, y))
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 0
    model, x = _mlp(), torch.randn(5, 64)
    with torch.no_grad():
        torch.testing.assert_close(_compiled(model, "auto")(x), model(x), rtol=1e-5, atol=1e-5)
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 2


def test_auto_gives_the_template_to_decode_steps_of_few_rows_only(tmp_path, monkeypatch):
    """The generator's ``auto``: decode steps of at most TEMPLATE_ROWS rows compile with the
    template (a lone row as two equal rows in the same graph); prefill, and decode steps of
    more rows, with ATen's. Every split gives transformers' greedy tokens."""
    pytest.importorskip("transformers")
    from torch_tensorrt_dist.generation import generate as generate_module

    monkeypatch.setattr(generate_module, "TEMPLATE_ROWS", 2)
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path / "ckpt")
    prompts = [*PROMPTS, [9, 8, 7]]
    want = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in prompts]
    torch._dynamo.reset()
    counters.clear()
    model = load_llama(str(tmp_path / "ckpt"), progress=False)
    gen = Generator(model, engine="inductor", max_batch_size=3, cache_len=64, cpu_gemm="auto")

    def templated() -> int:
        return counters["inductor"]["cpp_templated_kernel_counter"]

    assert gen.generate([prompts[0]], max_new_tokens=1).tokens == [want[0][:1]]
    assert templated() == 0  # a prefill of one row: ATen's
    assert gen.generate(prompts, max_new_tokens=MAX_NEW).tokens == want
    assert templated() == 0  # three rows (prefill and decode): ATen's
    assert gen.generate(prompts[:2], max_new_tokens=MAX_NEW).tokens == want[:2]
    two_rows = templated()
    assert two_rows > 0  # a decode of two rows: the template
    assert gen.generate([prompts[2]], max_new_tokens=MAX_NEW).tokens == want[2:]
    assert templated() == two_rows  # a lone row runs twice in the two-row graph: no compile


def test_auto_with_quantized_and_expert_weights_gives_atens_tokens():
    """A quantized MoE model (int8 linears and experts, the router and head in float): the
    template takes the float products of its decode graphs, and the tokens are those of
    ``aten``."""
    from torch_tensorrt_dist.parallel.moe_load import random_moe
    from torch_tensorrt_dist.quantization import QuantConfig, quantize_model

    from .test_quantization_moe import ARGS, MOE

    def tokens(cpu_gemm: str) -> list[list[int]]:
        torch._dynamo.reset()
        counters.clear()
        model = random_moe(ARGS, MOE, seed=0)
        quantize_model(model, QuantConfig("int8"))
        gen = Generator(model, engine="inductor", max_batch_size=2, cache_len=32, cpu_gemm=cpu_gemm)
        return gen.generate([[1, 2, 3], [4, 5, 6, 7]], max_new_tokens=6).tokens

    auto = tokens("auto")
    assert counters["inductor"]["cpp_templated_kernel_counter"] > 0
    assert auto == tokens("aten")
