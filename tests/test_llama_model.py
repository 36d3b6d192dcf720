"""The Llama-family model reproduces transformers' logits (Llama, Mistral, Qwen2) in fp32."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.step_inputs import StepLimits, step_inputs
from torch_tensorrt_dist.models.llama import ModelArgs, Transformer, rope_inv_freq
from torch_tensorrt_dist.parallel.llama_load import load_llama, random_llama

from . import _llama_ckpt

pytest.importorskip("transformers")
CPU = torch.device("cpu")


@pytest.mark.parametrize("name", sorted(_llama_ckpt.CONFIGS))
def test_logits_match_transformers(name: str, tmp_path: Path) -> None:
    hf = _llama_ckpt.save_checkpoint(name, tmp_path)
    model = load_llama(tmp_path, progress=False)
    model.setup_caches(2, 64)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.args.vocab_size, (2, 20), generator=gen)
    with torch.no_grad():
        ref = hf(tokens).logits
        out = model(tokens, torch.arange(20))
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
def test_a_short_chunk_at_the_longest_sequence_beside_a_longer_one(
    pack: bool, tmp_path: Path
) -> None:
    """A row's last chunk ends at the longest sequence (the RoPE table's end) while another
    row's chunk is longer: the short row's padding positions stay within the table (a
    rank once failed with an index error there) and its logits are transformers'; the same
    steps packed (``live``: the products over the real tokens only) too."""
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path)
    model = load_llama(tmp_path, progress=False)
    model.setup_paged(num_blocks=16, block_size=4, max_seq_len=24)
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, model.args.vocab_size, (1, 24), generator=gen)
    ids, blocks = tokens[0].tolist(), [3, 9, 1, 12, 7, 5]
    limits = StepLimits(rows=2, tokens=16, blocks=6, block_size=4)
    other = (list(range(1, 9)), 0, [14, 15])  # 8 tokens: the short row is padded by 6
    with torch.no_grad():
        ref = hf(tokens).logits[0]
        model.paged_step(*step_inputs([(ids[:16], 0, blocks), other], limits, CPU, pack=pack))
        model.paged_step(*step_inputs([(ids[16:22], 16, blocks), other], limits, CPU, pack=pack))
        inputs = step_inputs([(ids[22:24], 22, blocks), other], limits, CPU, pack=pack)
        assert len(inputs) == (6 if pack else 5)
        last = model.paged_step(*inputs)
    torch.testing.assert_close(last[0], ref[23], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pack", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("name", sorted(_llama_ckpt.CONFIGS))
def test_paged_steps_give_transformers_logits(name: str, pack: bool, tmp_path: Path) -> None:
    """A prompt prefilled in chunks (right-padded, or packed, beside another row) into blocks
    scattered over the pool, then decoded token by token: every chunk's last token and every
    decoded token has transformers' logits of that position (the sliding window included,
    where it is shorter than the sequence)."""
    hf = _llama_ckpt.save_checkpoint(name, tmp_path)
    model = load_llama(tmp_path, progress=False)
    model.setup_paged(num_blocks=40, block_size=4, max_seq_len=64)
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, model.args.vocab_size, (1, 24), generator=gen)
    ids = tokens[0].tolist()
    blocks = [17, 3, 29, 8, 12, 35]  # 24 tokens in 6 blocks of 4, in no order
    other = ([5, 6, 7, 8, 9, 1, 2], 0, [30, 31])  # a second row in the prefill calls
    limits = StepLimits(rows=2, tokens=16, blocks=6, block_size=4)
    with torch.no_grad():
        ref = hf(tokens).logits[0]  # [24, V]
        got, start = [], 0
        for n in (9, 7):  # chunks of the prompt's first 16 tokens
            rows = [(ids[start : start + n], start, blocks), other]
            inputs = step_inputs(rows, limits, CPU, pack=pack)
            got.append((start + n - 1, model.paged_step(*inputs)[0]))
            start += n
        for p in range(16, 24):  # decode
            rows = [([ids[p]], p, blocks)]
            got.append((p, model.paged_step(*step_inputs(rows, limits, CPU))[0]))
    for p, logits in got:
        torch.testing.assert_close(logits, ref[p], atol=1e-4, rtol=1e-4)
    if model.args.sliding_window is not None:
        assert model.args.sliding_window < 24


def test_prefill_then_decode_matches_full_forward(tmp_path: Path) -> None:
    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path)
    model = load_llama(tmp_path, progress=False)
    model.setup_caches(1, 32)
    tokens = torch.randint(0, 160, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(tokens).logits[:, -4:]
        model(tokens[:, :8], torch.arange(8))
        steps = [model(tokens[:, i : i + 1], torch.tensor([i])) for i in range(8, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), ref, atol=1e-4, rtol=1e-4)


def test_left_padding_gives_the_unpadded_logits() -> None:
    model = random_llama(ModelArgs.from_name("tiny"), seed=3)
    model.setup_caches(2, 32)
    prompt = torch.tensor([[5, 9, 17, 33, 65, 2]])
    with torch.no_grad():
        alone = model(prompt, torch.arange(6))[0]
        padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), prompt], dim=1)
        batch = model(
            torch.cat([padded, torch.arange(10)[None]]), torch.arange(10), torch.tensor([4, 0])
        )
    torch.testing.assert_close(batch[0, 4:], alone, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(batch).all()  # fully padded query rows stay finite


def test_llama3_rope_scaling_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_theta": 500000.0,
    }
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters=rope)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    args = ModelArgs.from_hf_config(json.loads(cfg.to_json_string()))
    assert args.rope_scaling is not None and args.rope_theta == 500000.0
    torch.testing.assert_close(rope_inv_freq(args), ref.float())
    assert not torch.allclose(rope_inv_freq(ModelArgs(dim=256, n_heads=2, rope_theta=5e5)), ref)


def test_model_args_validation_and_presets() -> None:
    assert ModelArgs.from_name("llama-3.1-8b").n_kv_heads == 8
    assert ModelArgs(dim=64, n_heads=4).head_dim == 16
    with pytest.raises(ConfigError, match="unknown model preset 'nope'"):
        ModelArgs.from_name("nope")
    with pytest.raises(ConfigError, match="not a multiple of n_kv_heads=3"):
        ModelArgs(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ConfigError, match="model_type='gpt2'"):
        ModelArgs.from_hf_config({"model_type": "gpt2"})


def test_setup_caches_refuses_beyond_max_positions() -> None:
    model = Transformer(
        ModelArgs(
            dim=32, n_layers=1, n_heads=2, vocab_size=16, intermediate_size=32, max_seq_len=16
        )
    )
    with pytest.raises(ConfigError, match="max_seq_len=32 exceeds the model's limit 16"):
        model.setup_caches(1, 32)
    with pytest.raises(ConfigError, match="setup_caches"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.arange(2))


def test_perplexity_over_paged_windows_equals_transformers(tmp_path: Path) -> None:
    """``eval --perplexity`` runs each window through the paged step (every position scored):
    the mean NLL of its windows equals transformers' cross entropy over the same windows."""
    from torch_tensorrt_dist.generation.perplexity import perplexity, windows

    hf = _llama_ckpt.save_checkpoint("llama_gqa", tmp_path)
    model = load_llama(tmp_path, progress=False)
    ids = torch.randint(0, 160, (70,), generator=torch.Generator().manual_seed(3)).tolist()
    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows(len(ids), 32, 16):
            logits = hf(torch.tensor([ids[w.begin : w.end]])).logits[0].float()
            nll = torch.nn.functional.cross_entropy(
                logits, torch.tensor(ids[w.begin + 1 : w.end + 1]), reduction="none"
            )
            total += float(nll[-w.scored :].double().sum())
            count += w.scored
    got = perplexity(model, ids, window=32, stride=16)
    assert got.tokens == count == len(ids) - 1
    assert got.nll == pytest.approx(total / count, rel=1e-5)
