"""Speculative decoding with a draft model (``--speculative draft``): the demo model as the
target, its first layers (its embeddings and head) as the draft. Greedy tokens equal plain
decoding (alone, batched, and on 2 gloo ranks); a draft equal to the target has every
proposal accepted; a draft of another vocabulary, a larger one, and the options without each
other are refused naming the option."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation import Generator, SamplingConfig
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.generation.speculative import SpeculativeConfig
from torch_tensorrt_dist.models.demo import demo_checkpoint_path
from torch_tensorrt_dist.models.tokenizer import load_tokenizer
from torch_tensorrt_dist.parallel.llama_load import load_llama
from torch_tensorrt_dist.testing import run_on_ranks
from torch_tensorrt_dist.testing.checkpoints import first_layers_checkpoint

from ._core_fns import one_thread

DEMO = demo_checkpoint_path()
EOS = (1,)
DRAFT = SpeculativeConfig(method="draft", num_tokens=3)
CACHE = 96
OPTS = {"max_batch_size": 4, "cache_len": CACHE, "block_size": 8, "max_prefill_tokens": 16}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return first_layers_checkpoint(DEMO, tmp_path_factory.mktemp("draft"), 2)


@pytest.fixture(scope="module")
def model() -> Any:
    return load_llama(DEMO, progress=False)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = load_tokenizer(DEMO, vocab_size=1024)
    return [
        tok.encode("The for statement is used to iterate over the elements of a sequence"),
        tok.encode("Python"),
        tok.encode("A class definition defines a class object"),
    ]


def _run(gen: Generator, prompts: list[list[int]], n: int) -> tuple[list[list[int]], Any]:
    core = gen.core()
    sched = gen.scheduler(core)
    for i, ids in enumerate(prompts):
        sched.add(Request(i, tuple(ids), n, SamplingConfig(), EOS))
    got: list[list[int]] = [[] for _ in prompts]
    while not sched.idle():
        for e in core.step(sched.plan()):
            got[e.rid] += e.tokens
    return got, core


def test_greedy_tokens_equal_plain_decoding_alone_and_batched(
    model: Any, draft_dir: Path, prompts: list[list[int]]
) -> None:
    want = Generator(model, **OPTS).generate(prompts, max_new_tokens=20, stop_ids=EOS).tokens
    draft = load_llama(draft_dir, progress=False)
    gen = Generator(model, speculative=DRAFT, draft=draft, **OPTS)
    got, core = _run(gen, prompts, 20)  # batched
    assert got == want
    assert core.spec_proposed > core.spec_accepted > 0
    assert core.pool.stats().used == 0
    for i, ids in enumerate(prompts):  # alone
        assert gen.generate([ids], max_new_tokens=20, stop_ids=EOS).tokens[0] == want[i]
    assert gen.draft is not None and gen.draft.calls > 0


def test_a_draft_equal_to_the_target_has_every_proposal_accepted(
    model: Any, prompts: list[list[int]]
) -> None:
    gen = Generator(model, speculative=DRAFT, draft=load_llama(DEMO, progress=False), **OPTS)
    gen.warmup_all()  # the draft's graphs too; its cache starts clean after
    got, core = _run(gen, prompts[:2], 16)
    want = Generator(model, **OPTS).generate(prompts[:2], max_new_tokens=16, stop_ids=EOS)
    assert got == want.tokens
    assert core.spec_proposed > 0 and core.spec_accepted == core.spec_proposed


def test_a_draft_of_another_vocabulary_or_larger_or_without_the_method_is_refused(
    model: Any, draft_dir: Path
) -> None:
    from torch_tensorrt_dist.models.llama import Transformer

    small = load_llama(draft_dir, progress=False)
    other = Transformer(replace(small.args, vocab_size=512))
    with pytest.raises(ConfigError, match="--draft-model has a vocabulary of 512"):
        Generator(model, speculative=DRAFT, draft=other, **OPTS)
    with pytest.raises(ConfigError, match="--draft-model is larger than the target"):
        Generator(small, speculative=DRAFT, draft=model, **OPTS)
    with pytest.raises(ConfigError, match="the target's own module"):
        Generator(model, speculative=DRAFT, draft=model, **OPTS)
    with pytest.raises(ConfigError, match="needs a draft model"):
        Generator(model, speculative=DRAFT, **OPTS)
    with pytest.raises(ConfigError, match="needs --speculative draft"):
        Generator(model, speculative=SpeculativeConfig(), draft=small, **OPTS)
    with pytest.raises(ConfigError, match="--draft-model needs --speculative draft"):
        SpeculativeConfig(draft_model=str(draft_dir))


# -- the command line -----------------------------------------------------------------------


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from torch_tensorrt_dist.cli import main

    base = ["generate", "--engine", "none", "--max-new-tokens", "12", "--json"]
    code = main([*base, "--prompt", "The for statement is used to", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_generate_command_with_a_draft_model_gives_the_plain_tokens(
    draft_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outs = []
    for extra in ([], ["--speculative", "draft", "--draft-model", str(draft_dir)]):
        code, out, err = _main(extra, capsys)
        assert code == 0, err
        outs.append(json.loads(out[out.index("{") :])["tokens"])
    assert outs[0] == outs[1] and len(outs[0][0]) > 5


def test_bad_draft_options_are_refused_at_start_naming_the_option(
    draft_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    vocab = tmp_path / "vocab"
    shutil.copytree(draft_dir, vocab)
    cfg = json.loads((vocab / "config.json").read_text())
    (vocab / "config.json").write_text(json.dumps({**cfg, "vocab_size": 512}))
    weights = load_file(vocab / "model.safetensors")
    weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"][:512].clone()
    save_file(weights, vocab / "model.safetensors")
    other = tmp_path / "tokenizer"
    shutil.copytree(draft_dir, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["added_tokens"] = [*tok.get("added_tokens", []), {**tok["added_tokens"][0], "id": 1023}]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    draft = ["--speculative", "draft", "--draft-model"]
    cases = [
        ([*draft, str(vocab)], "--draft-model " + str(vocab) + " has a vocabulary of 512"),
        ([*draft, str(other)], "has another tokenizer.json"),
        (["--model", str(draft_dir), *draft, str(DEMO)], "is larger than the target"),
        (["--speculative", "draft"], "--speculative draft needs --draft-model"),
        (["--draft-model", str(draft_dir)], "--draft-model needs --speculative draft"),
        (["--speculative", "ngram", "--draft-model", str(draft_dir)], "needs --speculative draft"),
    ]
    for extra, message in cases:
        code, _, err = _main(extra, capsys)
        assert code == 2 and message in err, (extra, err)


def draft_rank(rank: int, world: int, draft: str, prompts: list[list[int]]) -> list[Any]:
    """On each gloo rank: the target and the draft loaded by the family's loader over the
    world (as ``rank_main`` loads them), greedy tokens without and with the draft."""
    import torch.distributed as dist

    from torch_tensorrt_dist.config.jobs import GenerateJob
    from torch_tensorrt_dist.config.run import ModelOptions, Parallel, RunConfig
    from torch_tensorrt_dist.families import rank_for
    from torch_tensorrt_dist.families.draft import draft_model

    out = []
    for spec in (None, replace(DRAFT, draft_model=draft)):
        config = RunConfig(
            "generate",
            ModelOptions(model=str(DEMO), dtype="fp32"),
            Parallel(tp=world),
            GenerateJob(),
            engine="none",
            speculative=spec,
        )
        built = rank_for(config, index=rank, world=world, group=dist.group.WORLD)
        gen = built.generator(rows=4, cache_len=CACHE, draft=draft_model(built))
        got, core = _run(gen, prompts, 16)
        out.append((got, core.spec_proposed, core.spec_accepted))
    return out


@pytest.mark.slow
def test_two_ranks_agree_and_equal_plain_decoding(
    draft_dir: Path, prompts: list[list[int]]
) -> None:
    results = run_on_ranks(draft_rank, 2, str(draft_dir), prompts, timeout=240)
    assert results[0] == results[1]  # the same proposals, acceptances and tokens
    (plain, _, _), (got, proposed, accepted) = results[0]
    assert got == plain  # TP 2 sums in another order than TP 1: against TP 2 plain decoding
    assert proposed > accepted > 0


def test_the_draft_cache_gives_what_a_fresh_one_gives(draft_dir: Path) -> None:
    """Rows that grow, diverge from the draft's tokens (a refused proposal), leave, and a pool
    too small for every row at once (other rows' caches dropped): each proposal equals the
    proposal of a draft with an empty cache."""
    from torch_tensorrt_dist.generation.runner import ModelRunner
    from torch_tensorrt_dist.generation.speculative.draft import DraftProposer

    draft = load_llama(draft_dir, progress=False)
    memory = 9 * ModelRunner(draft, block_size=4, cache_len=32).layout.bytes_per_block
    small = DraftProposer(
        ModelRunner(draft, max_batch_size=3, cache_len=32, block_size=4, kv_cache_memory=memory)
    )
    # a runner sets up its model's pools: the fresh drafts run another copy of the model
    fresh = DraftProposer(
        ModelRunner(load_llama(draft_dir, progress=False), cache_len=32, block_size=4)
    )
    rows = {0: [5, 9, 17, 3, 80], 1: [7, 7, 120, 33, 2, 9, 14], 2: [300, 4, *range(40, 48)]}
    dropped = False
    for step in range(5):
        # row 2 skips steps 2 and 3 (paused): its cache is dropped for the others' blocks
        planned = [
            (r, list(t), 1 + (r + step) % 3)
            for r, t in rows.items()
            if (r, step) not in {(2, 2), (2, 3)}
        ]
        got = small.propose_rows(planned, live=rows)
        dropped |= 2 in rows and 2 not in small.rows
        for (rid, tokens, k), proposal in zip(planned, got):
            assert proposal == fresh.propose(tokens, k), (step, rid)
            assert not fresh.rows  # propose() keeps nothing
            # the first proposed token accepted, then the target's own (another) one; or
            # refused, then another token (a row that decoded a step without proposing)
            first = proposal[0] if step % 2 == 0 else (proposal[0] + 1) % 1024
            rows[rid] = [*tokens, first, (proposal[-1] + 1 + step) % 1024]
        if step == 3:
            del rows[2]  # the request ended
    assert dropped
    assert set(small.rows) == {0, 1} and small.pool.stats().used > 0
