"""The ``inductor`` engine's workaround for CPU flex attention after a complex RoPE.

Inductor itself (torch 2.14) fails on this function (``LoweringException: ValueError: too many
values to unpack (expected 4)``; ``docs/clients.md`` has the command that shows it, and that it
compiles through our backend). Compiling it takes ~25 s on CPU, so here the pass is checked on
the aten graph: two contiguous copies, and the same values.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.nn.attention.flex_attention import flex_attention

from torch_tensorrt_dist.lowering.flex_inputs import contiguous_flex_inputs

B, L, N, H = 1, 16, 4, 16

# the eager reference: flex attention unfused, which torch warns about
pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")


def _rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Meta's (and torchtitan's) complex RoPE: the output is a view of view_as_real's buffer."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs
    return torch.view_as_real(xc).flatten(3)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    query, key = _rope(q, f).transpose(1, 2), _rope(k, f).transpose(1, 2)
    return flex_attention(query, key, v.transpose(1, 2))


def test_query_and_key_copied_contiguous_and_values_unchanged() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, L, N, H) for _ in range(3))
    freqs = torch.polar(torch.ones(L, 1, H // 2), torch.randn(L, 1, H // 2))
    graphs: list[torch.fx.GraphModule] = []
    copies: list[int] = []

    def compiler(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> object:
        copies.append(contiguous_flex_inputs(gm))
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=compiler, inference_compiler=compiler)
    with torch.no_grad():
        out = torch.compile(_attention, backend=backend, fullgraph=True)(q, k, v, freqs)
        torch.testing.assert_close(out, _attention(q, k, v, freqs))
    assert copies == [2]
    (flex,) = graphs[0].graph.find_nodes(
        op="call_function", target=torch.ops.higher_order.flex_attention
    )
    query, key, value = flex.args[:3]
    for arg in (query, key):
        assert arg.target is torch.ops.aten.clone.default
        assert arg.kwargs == {"memory_format": torch.contiguous_format}
        assert arg.meta["val"].is_contiguous() and arg.meta["val"].dim() == 4
    assert value.target is not torch.ops.aten.clone.default
