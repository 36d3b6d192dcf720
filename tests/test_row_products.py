"""``cpu_gemm="reduce"``: the Inductor engine's products with row-major float32 weights as
vectorized reductions (``backend/row_products.py``), given by the generator to steps of few
token rows (``REDUCE_ROWS``: rows x tokens), ATen's GEMM elsewhere. At TP 2:
tests/test_cpu_gemm.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import torch_tensorrt_dist  # noqa: F401  (registers the backend)
from torch_tensorrt_dist.backend.row_products import products_as_reductions
from torch_tensorrt_dist.generation import Generator
from torch_tensorrt_dist.models.weight_layout import is_column_major
from torch_tensorrt_dist.parallel.llama_load import load_llama

from . import _llama_ckpt

PROMPTS = [[3, 5, 7, 9, 11], [4, 8, 15, 16, 23, 42, 7, 1, 2], [9, 8, 7]]
MAX_NEW = 10
#: products with weights in a step of the test checkpoint: 2 layers x (q, k, v, o, gate, up,
#: down) and the head
PRODUCTS = 2 * 7 + 1


def decode_inputs(gen: Generator, rows: int) -> Any:
    """A decode step's inputs of ``rows`` rows, each at position 3 of its own block."""
    from torch_tensorrt_dist.generation.step_inputs import step_inputs

    spans = [([1], 3, [1 + i]) for i in range(rows)]
    return step_inputs(
        spans, gen.runner.limits, gen.runner.device, mark_dynamic=gen.runner.mark_dynamic
    )


def _reduced() -> int:
    return counters["torch_tensorrt_dist"]["reduced_products"]


def _compiled(model: Any, cpu_gemm: str) -> Any:
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(
        model, backend="torch_tensorrt_dist", options={"engine": "inductor", "cpu_gemm": cpu_gemm}
    )


class _Block(torch.nn.Module):
    """Two linears (one with a bias, one without), a product of two activations and a
    column-major weight: only the first two are weight products the pass takes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(64, 96)
        self.down = torch.nn.Linear(96, 64, bias=False)
        self.side = torch.nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            self.side.weight.data = self.side.weight.data.t().contiguous().t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.nn.functional.silu(self.up(torch.rms_norm(x, [64]))))
        return h + self.side(x) + (x @ x.t()) @ x


def test_weight_products_become_reductions_with_the_same_values():
    model, x = _Block().eval(), torch.randn(5, 64)
    with torch.no_grad():
        want = model(x)
        fn = _compiled(model, "reduce")
        torch.testing.assert_close(fn(x), want, rtol=1e-5, atol=1e-5)
        assert _reduced() == 2  # up (addmm) and down (mm); not side, not x @ x.t()
        for rows in (1, 3, 9):  # other row counts: the same products, the same values
            other = torch.randn(rows, 64)
            torch.testing.assert_close(fn(other), model(other), rtol=1e-5, atol=1e-5)
        assert _reduced() > 2  # each compile rewrote its graph
        _compiled(model, "aten")(x)
        assert _reduced() == 0


def test_a_rows_result_does_not_depend_on_the_other_rows():
    """Each output is its own dot product: a row computes the same bits alone or among
    others (a lone request decodes as it would in a batch)."""
    model = torch.nn.Linear(256, 128, bias=False).eval()
    x = torch.randn(7, 256)
    with torch.no_grad():
        fn = _compiled(model, "reduce")
        batch = fn(x)
        for i in range(7):
            assert torch.equal(fn(x[i : i + 1].clone()), batch[i : i + 1])


def test_only_weight_positions_that_are_float32_and_row_major_are_taken():
    """The aten graph of ``x @ w.t()``: rewritten where ``w``'s position is a weight's, not
    otherwise (a product of two activations), nor for float64 or a column-major weight."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, w)

    x, w = torch.randn(3, 8), torch.randn(4, 8)
    assert products_as_reductions(make_fx(f)(x, w), weights=[]) == 0  # two activations
    for args, taken in (
        ((x, w), 1),
        ((x.double(), w.double()), 0),
        ((x, w.t().contiguous().t()), 0),
    ):
        gm = make_fx(f)(*args)
        assert products_as_reductions(gm, weights=[1]) == taken
        torch.testing.assert_close(gm(*args), f(*args))


def test_reduce_gives_decode_steps_of_few_rows_the_reductions_only(tmp_path, monkeypatch):
    """Decode steps of at most REDUCE_ROWS rows (a lone row too) compile with reductions;
    prefills of more token rows and larger decode steps with ATen's GEMM on the same
    row-major weights. Every
    split gives transformers' greedy tokens (the checkpoint's attention has biases: addmm)."""
    pytest.importorskip("transformers")
    from torch_tensorrt_dist.generation import runner as runner_module

    monkeypatch.setattr(runner_module, "REDUCE_ROWS", 2)
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path / "ckpt")
    want = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS]
    torch._dynamo.reset()
    counters.clear()
    model = load_llama(str(tmp_path / "ckpt"), progress=False)
    gen = Generator(model, engine="inductor", max_batch_size=3, cache_len=64, cpu_gemm="reduce")
    assert not any(is_column_major(m.weight) for m in model.modules() if hasattr(m, "weight"))
    assert gen.generate([PROMPTS[0]], max_new_tokens=1).tokens == [want[0][:1]]
    assert _reduced() == 0  # a prefill: ATen's
    assert gen.generate(PROMPTS, max_new_tokens=MAX_NEW).tokens == want
    assert _reduced() == 0  # three rows (prefill and decode): ATen's
    assert gen.generate(PROMPTS[:2], max_new_tokens=MAX_NEW).tokens == want[:2]
    # a decode of two rows: reductions, every product (2 layers x 7, and the head)
    assert _reduced() == PRODUCTS
    assert gen.generate([PROMPTS[2]], max_new_tokens=MAX_NEW).tokens == want[2:]
    assert _reduced() == 2 * PRODUCTS  # a lone row: its own (static) graph, reductions too
    # the logits come out row-major, as ATen's product gives them
    logits = gen.runner.step(*decode_inputs(gen, rows=2))
    assert logits.is_contiguous()


def test_a_prefill_of_few_token_rows_takes_the_reductions_too(tmp_path, monkeypatch):
    """The split counts token rows (rows x tokens: each product's rows): a prompt of 5 tokens
    under a limit of 12 is prefilled with reductions, two prompts of 5 and 9 (18) with ATen's;
    greedy tokens are transformers' either way, and a server's warm-up compiles both forms of
    a prefill of several rows, so no mix of prompts compiles after it."""
    pytest.importorskip("transformers")
    from torch_tensorrt_dist.generation import runner as runner_module

    monkeypatch.setattr(runner_module, "REDUCE_ROWS", 12)
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path / "ckpt")
    want = [_llama_ckpt.hf_greedy(hf, p, MAX_NEW) for p in PROMPTS[:2]]
    torch._dynamo.reset()
    counters.clear()
    model = load_llama(str(tmp_path / "ckpt"), progress=False)
    gen = Generator(model, engine="inductor", max_batch_size=2, cache_len=64, cpu_gemm="reduce")
    assert gen.generate([PROMPTS[0]], max_new_tokens=1).tokens == [want[0][:1]]
    assert _reduced() == PRODUCTS  # 1 x 5 token rows: reductions
    counters.clear()
    assert gen.generate(PROMPTS[:2], max_new_tokens=1).tokens == [w[:1] for w in want]
    assert _reduced() == 0  # 2 x 9 token rows: ATen's
    assert gen.generate(PROMPTS[:2], max_new_tokens=MAX_NEW).tokens == want
    torch._dynamo.reset()  # a fresh generator: its warm-up alone compiles every graph
    gen = Generator(model, engine="inductor", max_batch_size=2, cache_len=64, cpu_gemm="reduce")
    gen.warmup_all()
    frames = counters["stats"]["unique_graphs"]
    for prompts in ([PROMPTS[2]] * 2, PROMPTS[:2], [PROMPTS[1]], [[5] * 13, [6]]):
        gen.generate(prompts, max_new_tokens=3)
    assert counters["stats"]["unique_graphs"] == frames  # nothing compiled after the warm-up


@pytest.mark.parametrize(
    ("rows", "cache_len", "budget", "prompts"),
    [
        (1, 18, 512, [[7] * 17]),  # one row of cache_len - 1 tokens: past 16 alone
        (2, 10, 512, [[7] * 9, [8] * 9]),  # two rows of 9: past 16 together
        (3, 64, 10, [[7] * 6, [8] * 2, [9] * 2]),  # a small prefill budget: 3 x 6
    ],
)
def test_reduce_warmup_compiles_both_sides_whatever_the_limits(
    rows: int, cache_len: int, budget: int, prompts: list[list[int]]
) -> None:
    """The warm-up reaches past ``REDUCE_ROWS`` token rows with direct calls (the null block
    only), not through prompts the scheduler may chunk: a first request of these shapes
    compiles nothing (each case compiled a graph after the warm-up before)."""
    from torch_tensorrt_dist.models.llama_args import ModelArgs
    from torch_tensorrt_dist.parallel.llama_load import random_llama

    torch._dynamo.reset()
    counters.clear()
    model = random_llama(ModelArgs.from_name("tiny"), seed=0)
    gen = Generator(
        model,
        engine="inductor",
        max_batch_size=rows,
        cache_len=cache_len,
        max_prefill_tokens=budget,
        cpu_gemm="reduce",
    )
    gen.warmup_all()
    frames = counters["stats"]["unique_graphs"]
    gen.generate(prompts, max_new_tokens=1)
    assert counters["stats"]["unique_graphs"] == frames


def test_a_model_without_float32_weights_compiles_its_step_once(monkeypatch):
    """A bf16 model has nothing to rewrite: ``reduce`` is ``aten`` for it (one compile of the
    step, not two)."""
    from torch_tensorrt_dist.generation import runner as runner_module
    from torch_tensorrt_dist.models.llama import ModelArgs, Transformer

    seen: list[str] = []
    plain = runner_module.compile_paged_step

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["cpu_gemm"])
        return plain(*args, **kwargs)

    monkeypatch.setattr(runner_module, "compile_paged_step", spy)
    args = ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=96, max_seq_len=32)
    for dtype, want in ((torch.bfloat16, "aten"), (torch.float32, "reduce")):
        Generator(
            Transformer(args).to(dtype), engine="inductor", max_batch_size=2, cpu_gemm="reduce"
        )
        assert seen.pop() == want, dtype
