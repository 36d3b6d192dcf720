"""What the sampler will see, checked before it sees it: grammars that no text satisfies or that
the engine cannot follow are refused when checked (``Grammars.check``), ``min_tokens`` holds
back the end only while the grammar allows another token, and a row left with no token fails
by name instead of drawing id 0 or NaN (byte grammars and scripted logits; no model)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.generation.grammar import (
    GrammarError,
    Grammars,
    GrammarSpec,
    allows_other,
    id_bits,
    new_bitmask,
    unpack_bitmask,
)
from torch_tensorrt_dist.generation.plan import Request
from torch_tensorrt_dist.generation.sampler import (
    Failure,
    NoTokenLeft,
    Pick,
    RowSampling,
    StepMasks,
    sample_step,
)
from torch_tensorrt_dist.generation.sampling import SamplingConfig

pytest.importorskip("llguidance", reason="structured output needs llguidance (the serve extra)")

V, EOS = 300, 299  # the byte vocabulary: ids 0-255 are bytes, 299 ends the text
A = ord("a")


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    return Grammars.for_bytes(vocab_size=V, eos_ids=(EOS,))


def _props(n: int) -> GrammarSpec:
    return GrammarSpec.json_schema(
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
    )


NOTHING = [
    GrammarSpec.regex(r"[^\s\S]"),
    GrammarSpec.regex(r"ab[^\s\S]"),
    GrammarSpec.json_schema({"$ref": "#"}),
    GrammarSpec.json_schema(
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    ),
]


@pytest.mark.parametrize("spec", NOTHING, ids=["empty-class", "dead-end", "ref-self", "ref-cycle"])
def test_a_grammar_no_text_satisfies_is_refused_when_checked(
    grammars: Grammars, spec: GrammarSpec
) -> None:
    # compiled alone, the engine fails only at its first mask, which allows the end-of-text
    # token alone: sampled, it answered "" with finish "stop" (the grammar accepts no "")
    matcher = grammars.compile(spec)
    assert matcher.allowed().nonzero().flatten().tolist() == [EOS]
    assert matcher.error is not None and "NoExtensionBias" in matcher.error
    with pytest.raises(GrammarError, match="allows no text: nothing satisfies it") as info:
        grammars.check(spec)
    assert "NoExtensionBias" in info.value.reason


def test_the_engines_size_limits_are_refused_when_checked(grammars: Grammars) -> None:
    """600 optional properties compile, then fail at the second token (the parser's row limit
    of 2,000 items: about 4 per property); 450 pass and follow."""
    big = _props(600)
    grammars.compile(big)  # compiles: the limit is reached only once "{" is taken
    with pytest.raises(GrammarError, match=r"fails after 1 token\(s\).*make it smaller") as info:
        grammars.check(big)
    assert "Current row has 2407 items; max is 2000" in info.value.reason
    # untyped, the lowest first token starts a string ('"'): the probe also follows "{"
    untyped = GrammarSpec.json_schema({"properties": {f"p{i}": {} for i in range(600)}})
    with pytest.raises(GrammarError, match="Current row has 2407 items"):
        grammars.check(untyped)
    start = grammars.check(_props(450))
    assert torch.equal(start.allowed(), grammars.compile(_props(450)).allowed())
    for spec in (GrammarSpec.json_object(), GrammarSpec.regex("()"), GrammarSpec.choice(["x"])):
        assert grammars.check(spec).error is None  # "()": the empty text, end-of-text at once


def test_id_bits_set_the_ids_and_the_padding() -> None:
    bits = id_bits([0, 31, 32, 299, 400], V)  # 400 is past the vocabulary: ignored
    expected = torch.zeros(320, dtype=torch.bool)
    expected[[0, 31, 32, 299]] = True
    expected[V:] = True  # the last word's padding
    assert torch.equal(unpack_bitmask(bits[None], 320)[0], expected)
    assert allows_other(new_bitmask(1, V)[0], bits)  # every id allowed
    assert allows_other(id_bits([7], V), bits)
    assert not allows_other(id_bits([0, 299], V), bits)  # held ids (and padding) only


def _run(
    grammars: Grammars, spec: GrammarSpec | None, cfg: SamplingConfig, logits: torch.Tensor
) -> tuple[list[int], Pick | Failure | None]:
    """Greedy steps of one row over fixed ``logits`` [V] until the grammar is complete, an end
    id is drawn or 12 tokens: (the tokens, the last pick)."""
    req = Request(0, (1, 2), 12, cfg, stop_ids=cfg.end_ids((EOS,)), grammar=spec)
    state = RowSampling(req, grammars)
    out: list[int] = []
    pick: Pick | Failure | None = None
    for _ in range(12):
        bitmask, failed = StepMasks.start(grammars, [state]).wait()
        pick = sample_step(logits[None].clone(), [state], bitmask, failed)[0]
        if isinstance(pick, Failure):
            break
        out.append(pick.token)
        if state.accept(pick.token) or pick.token in req.stop_ids:
            break
    return out, pick


def _favour(*ids: int) -> torch.Tensor:
    """Logits where ``ids[0]`` is the most likely, then ``ids[1]``, ..."""
    x = torch.zeros(V)
    for rank, i in enumerate(ids):
        x[i] = 10.0 - rank
    return x


def test_min_tokens_holds_the_end_back_only_while_the_grammar_allows_more(
    grammars: Grammars,
) -> None:
    x = _favour(EOS, A)  # the model wants to end at once
    a13 = GrammarSpec.regex("a{1,3}")
    assert _run(grammars, a13, SamplingConfig(), x)[0] == [A, EOS]  # ends after one "a"
    # min_tokens 5: the end is held back while the grammar allows another "a"; after three,
    # the grammar is complete and its end wins (3 tokens, not 5)
    tokens, pick = _run(grammars, a13, SamplingConfig(min_tokens=5), x)
    assert tokens == [A, A, A] and isinstance(pick, Pick)
    # without a grammar, min_tokens holds the end back for 5 tokens
    assert _run(grammars, None, SamplingConfig(min_tokens=5), x)[0] == [A] * 5 + [EOS]


def test_a_grammar_that_allows_only_held_ids_is_followed_not_masked(grammars: Grammars) -> None:
    """guided "a" with "a" a stop_token_id and min_tokens 2: min_tokens would hold back the
    one token the grammar allows, leaving every logit -inf (greedy drew id 0, a token the
    grammar refuses); the grammar wins and "a" ends the request."""
    cfg = SamplingConfig(min_tokens=2, stop_token_ids=(A,))
    tokens, pick = _run(grammars, GrammarSpec.regex("a"), cfg, _favour(EOS, 7))
    assert tokens == [A] and isinstance(pick, Pick)


def test_a_row_left_with_no_token_fails_by_name(grammars: Grammars) -> None:
    from torch_tensorrt_dist.generation.sequence import row_error
    from torch_tensorrt_dist.serving.isolation import row_failure

    x = torch.full((V,), -math.inf)
    x[EOS] = 1.0  # finite only where the grammar forbids (its first token must be "a")
    tokens, pick = _run(grammars, GrammarSpec.regex("a+"), SamplingConfig(), x)
    assert tokens == [] and isinstance(pick, Failure) and pick.stage == "masked"
    assert isinstance(pick.error, NoTokenLeft) and "the grammar masked every token" in str(
        pick.error
    )
    cfg = SamplingConfig()
    failed = row_failure(
        row_error(pick.stage, pick.error), sampling=cfg, stop=(), grammar="guided_regex"
    )
    assert (failed.status, failed.param) == (400, "guided_regex")
    # nothing of the request masks: the model's logits were not finite (the server's fault)
    nan = torch.full((V,), math.nan)
    tokens, pick = _run(grammars, None, SamplingConfig(logprobs=0), nan)
    assert isinstance(pick, Failure) and "the model's logits hold no finite value" in str(
        pick.error
    )
    failed = row_failure(row_error(pick.stage, pick.error), sampling=cfg, stop=())
    assert (failed.status, failed.param) == (500, None)


def test_a_matcher_the_engine_failed_fails_its_row_not_with_the_end_token(
    grammars: Grammars,
) -> None:
    """A grammar compiled without ``check`` that fails at its mask (the engine reports it by
    its state, not by raising) fails its row at the step, naming the engine's reason."""
    spec = GrammarSpec.regex(r"[^\s\S]")
    req = Request(0, (1, 2), 4, SamplingConfig(), stop_ids=(EOS,), grammar=spec)
    for device in (None, torch.device("cpu")):  # the engine's threads; row by row (CPU)
        state = RowSampling(req, grammars)
        masks = StepMasks.start(grammars, [state], device)
        bitmask, failed = masks.wait()
        assert list(failed) == [0] and "NoExtensionBias" in str(failed[0])
        pick = sample_step(_favour(EOS)[None], [state], bitmask, failed, masks.forbid)[0]
        assert isinstance(pick, Failure) and pick.stage == "grammar"


def test_a_repeated_spec_is_compiled_and_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    grammars = Grammars.for_bytes(vocab_size=V, eos_ids=(EOS,))
    calls = {"compile": 0, "probe": 0}
    compile_, probe = Grammars._compile, Grammars._probe

    def counted(name: str, fn: Any) -> Any:
        def wrapper(self: Grammars, spec: GrammarSpec) -> Any:
            calls[name] += 1
            return fn(self, spec)

        return wrapper

    monkeypatch.setattr(Grammars, "_compile", counted("compile", compile_))
    monkeypatch.setattr(Grammars, "_probe", counted("probe", probe))
    spec = GrammarSpec.regex("a{1,3}")
    one, two = grammars.check(spec), grammars.compile(spec)
    one.accept(A)  # each request its own copy: the other stays at the start
    assert two.allowed().nonzero().flatten().tolist() == [A] and one.allowed()[EOS]
    assert calls == {"compile": 1, "probe": 1}
    for _ in range(2):  # a refusal is raised again, not computed again
        with pytest.raises(GrammarError, match="allows no text"):
            grammars.check(GrammarSpec.regex(r"[^\s\S]"))
    assert calls == {"compile": 2, "probe": 2}
    for i in range(20):  # the oldest are dropped
        grammars.compile(GrammarSpec.regex(f"b{{{i + 1}}}"))
    grammars.compile(spec)
    assert calls["compile"] == 23
