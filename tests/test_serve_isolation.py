"""One request's failure fails that request only: sampling that keeps a token for every accepted
setting, the core's per-row isolation, the leader's answer to the failed request (and the other
requests going on), and the request checks that refuse by field what would have crashed a rank
or the handler (no server here: scripted graphs and the pure checks)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.core import Emitted, GenerationCore, Request
from torch_tensorrt_dist.generation.kv_blocks import BlockPool
from torch_tensorrt_dist.generation.sampling import SamplingConfig, check_top_p, sample
from torch_tensorrt_dist.generation.scheduler import Scheduler
from torch_tensorrt_dist.generation.step_inputs import StepLimits
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer

pytest.importorskip("fastapi")

from torch_tensorrt_dist.serving import control, schema
from torch_tensorrt_dist.serving.bridge import Failed, Inbox, Piece, ServerState, Submission
from torch_tensorrt_dist.serving.limits import check_fit, check_prompt_size, request_limits
from torch_tensorrt_dist.serving.loop import Leader, StepLoop
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.request_body import parse_json

V = 256  # the byte tokenizer's ids
BAD = 200  # the id the test tokenizer cannot decode


def test_top_p_below_float32_resolution_keeps_the_most_likely_token() -> None:
    logits = torch.tensor([[0.5, 3.0, 1.0, 2.9]])
    for p in (2.0**-149, 1e-40, 1e-8):
        draws = {
            int(sample(logits, SamplingConfig(1.0, top_p=p, seed=s), _gen(s))[0]) for s in range(20)
        }
        assert draws == {1}
    with pytest.raises(ConfigError, match=r"top_p 1e-300 is 0 in float32.*>= 1\.4e-45"):
        SamplingConfig(1.0, top_p=1e-300)
    assert check_top_p(2.0**-149) == 2.0**-149
    # logits / 0.001 would overflow float32; the row's maximum is subtracted first
    huge = torch.tensor([[3e38, -3e38, 2.99e38, 0.0]])
    assert int(sample(huge, SamplingConfig(1e-3, seed=0), _gen(0))[0]) == 0


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class _Tok(ByteTokenizer):
    """The byte tokenizer, except that id ``BAD`` cannot be decoded."""

    def __init__(self) -> None:
        super().__init__(V, eos_ids=())

    def decode(self, ids: list[int]) -> str:
        if BAD in ids:
            raise ValueError(f"no text for id {BAD}")
        return super().decode(ids)


def _core(script: dict[int, int], nan_row: int | None = None) -> tuple[GenerationCore, Scheduler]:
    """A core whose step puts all mass on ``script[position]`` (else id 65), and NaN in row
    ``nan_row`` of the first decode call (that request's sampling raises); its scheduler."""
    nan = [nan_row]

    def logits_at(pos: int) -> torch.Tensor:
        row = torch.full((V,), -10.0)
        row[script.get(pos, 65)] = 10.0
        return row

    def step(*inputs: torch.Tensor) -> torch.Tensor:
        tokens, start, last = inputs[:3]
        out = torch.stack([logits_at(int(p) + 1) for p in (start + last).tolist()])
        if nan[0] is not None and tokens.shape[1] == 1:
            out[nan[0]] = math.nan
            nan[0] = None
        return out

    limits = StepLimits(rows=2, tokens=16, blocks=8, block_size=4)
    pool = BlockPool(17, 4)
    core = GenerationCore(
        step, pool=pool, max_seq_len=32, limits=limits, tokenizer=_Tok(), text=True
    )
    core.isolate = True
    return core, Scheduler(core, max_rows=2, max_prefill_tokens=16)


def _emitted(core: GenerationCore, sched: Scheduler) -> dict[int, Emitted]:
    return {e.rid: e for e in core.step(sched.plan())}


def test_a_row_whose_sampling_raises_fails_alone_and_frees_its_blocks() -> None:
    core, sched = _core({}, nan_row=0)
    sampled = SamplingConfig(1.0, seed=1)
    sched.add(Request(0, (1, 2), 5, sampled))  # the prefill's logits are fine
    sched.add(Request(1, (1, 2), 5))
    _emitted(core, sched)
    out = _emitted(core, sched)  # the first decode: NaN in request 0's row
    assert out[0].finish == "error" and out[0].error is not None
    assert out[0].error.stage == "sampling" and "ValueError" in out[0].error.message
    assert out[1].finish is None and out[1].tokens == [65]
    assert [s.rid for s in core.running] == [1] and 0 not in core.sequences
    while not sched.idle():
        core.step(sched.plan())  # the other request runs to its length
    assert core.pool.stats().used == 0
    core, sched = _core({}, nan_row=0)
    core.isolate = False  # a generate() run: the error is raised, as before
    sched.add(Request(2, (1, 2), 5, sampled))
    core.step(sched.plan())
    with pytest.raises(ValueError, match="probability rows must be finite"):
        core.step(sched.plan())


def test_text_that_decides_the_finish_fails_on_every_rank_text_shown_only_marks() -> None:
    # position 4 (the second generated token) is BAD, which the tokenizer cannot decode
    core, sched = _core({4: BAD})
    sched.add(Request(0, (1, 2, 3), 5, stop=("zz",)))  # stop strings: text on every rank
    sched.add(Request(1, (1, 2, 3), 5))  # text only shown: render() on rank 0
    core.defer_text = True
    _emitted(core, sched)
    out = _emitted(core, sched)
    assert out[0].finish == "error" and out[0].error and out[0].error.stage == "text"
    assert [s.rid for s in core.running] == [1] and out[1].finish is None
    core.render()
    assert out[1].finish == "error" and out[1].error and "ValueError" in out[1].error.message
    assert [s.rid for s in core.running] == [1]  # rank 0 alone saw it: the leader cancels it


class _Sink:
    def __init__(self) -> None:
        self.items: list[Piece | Failed] = []

    def put(self, item: Piece | Failed) -> None:
        self.items.append(item)


def _run_leader(
    core: GenerationCore, sched: Scheduler, subs: list[Submission], inbox: Inbox | None = None
) -> list[Any]:
    """Rank 0's loop over ``core`` (one rank), until every request has its answer; the
    cancels each step announced."""
    inbox, state = inbox or Inbox(8), ServerState()
    state.set("ready")
    loop = StepLoop(core, control.ControlChannel(None))
    cancels: list[list[int]] = []
    real_exchange = loop.channel.exchange

    def exchange(plan: Any = None) -> Any:
        cancels.append(list(plan.cancels) if plan is not None else [])
        return real_exchange(plan)

    loop.channel.exchange = exchange  # type: ignore[method-assign]

    steps = [0]

    def on_step(leader: Leader) -> None:
        steps[0] += 1  # bounded: a wait queue that never empties fails its test, not hangs it
        if leader.scheduler.idle() and (not inbox.waiting or steps[0] > 300):
            state.set("draining")

    leader = Leader(loop, sched, inbox, state, stop_ids=(), idle_tick_s=0.01, on_step=on_step)
    for sub in subs:
        inbox.submit(sub)
    leader.run()
    return cancels


def test_the_leader_answers_a_failed_request_by_field_and_the_others_go_on() -> None:
    sinks = [_Sink() for _ in range(3)]
    subs = [
        Submission((1, 2), 6, SamplingConfig(1.0, top_p=1e-30), 7, (), sinks[0]),  # type: ignore[arg-type]
        Submission((1, 2), 6, SamplingConfig(), None, (), sinks[1]),  # type: ignore[arg-type]
        Submission((1, 2), 6, SamplingConfig(), None, (), sinks[2]),  # type: ignore[arg-type]
    ]
    _run_leader(*_core({}, nan_row=0), subs)
    failed = sinks[0].items[-1]
    assert isinstance(failed, Failed) and failed.status == 400 and failed.param == "top_p"
    assert "sampling failed for temperature=1, top_p=1e-30" in failed.message
    for sink in sinks[1:]:  # the second ran beside it, the third took its place
        assert "".join(p.text for p in sink.items if isinstance(p, Piece)) == "A" * 6
        assert sink.items[-1].finish == "length"  # type: ignore[union-attr]


def test_a_request_whose_shown_text_fails_is_cancelled_on_every_rank_at_the_next_step() -> None:
    sinks = [_Sink(), _Sink()]
    subs = [
        Submission((1, 2, 3), 8, SamplingConfig(), None, (), sinks[0]),  # type: ignore[arg-type]
        Submission((1, 2, 3, 4, 5), 8, SamplingConfig(), None, (), sinks[1]),  # type: ignore[arg-type]
    ]
    cancels = _run_leader(*_core({4: BAD}), subs)
    failed = sinks[0].items[-1]
    assert isinstance(failed, Failed) and failed.status == 500 and failed.param is None
    assert "decoding the generated tokens to text failed (ValueError" in failed.message
    assert [subs[0].rid] in cancels  # announced to every rank
    assert "".join(p.text for p in sinks[1].items if isinstance(p, Piece)) == "A" * 8


def test_a_failed_request_gives_back_the_queue_places_of_its_waiting_sequences() -> None:
    """n = 4 on 2 rows: two choices wait while the first fails at its first decode; their
    places in the wait queue (which counts sequences) come back, and a request after it runs."""
    sinks = [_Sink(), _Sink()]
    subs = [
        Submission((1, 2), 6, SamplingConfig(1.0), 7, (), sinks[0], n=4),  # type: ignore[arg-type]
        Submission((1, 2), 6, SamplingConfig(), None, (), sinks[1]),  # type: ignore[arg-type]
    ]
    inbox = Inbox(8)
    _run_leader(*_core({}, nan_row=0), subs, inbox)
    assert isinstance(sinks[0].items[-1], Failed)
    assert "".join(p.text for p in sinks[1].items if isinstance(p, Piece)) == "A" * 6
    assert inbox.waiting == 0


def _bad(body: Any, param: str | None, match: str, chat: bool = False) -> None:
    with pytest.raises(RequestError, match=match) as info:
        schema.parse_request(body, chat=chat)
    assert info.value.status == 400 and info.value.param == param


def test_requests_that_crashed_a_rank_or_the_handler_are_400s_naming_the_field() -> None:
    _bad({"prompt": "Hello", "temperature": 1, "top_p": 1e-300}, "top_p", "0 in float32")
    _bad({"prompt": "a\ud800b"}, "prompt", r"lone surrogate \(U\+D800\) at character 1")
    msgs = [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]
    _bad({"messages": msgs}, "messages", r"messages\[0\]\.content holds a lone", chat=True)
    _bad({"prompt": "x", "stop": ["\ud800"]}, "stop", "a stop string holds a lone surrogate")
    _bad({"prompt": "x", "stop": "s" * 257}, "stop", "257 characters; at most 256")
    _bad({"prompt": [1, 2.5]}, "prompt", r"prompt\[1\] is 2\.5; token ids are integers")
    _bad({"prompt": ["a", [1, 2.5]]}, "prompt", r"prompt\[1\]\[1\] is 2\.5; token ids are")
    _bad({"prompt": ["a", ""]}, "prompt", r"prompt\[1\] must be a non-empty string or a list")
    assert schema.parse_request({"prompt": [1.0, 7]}, chat=False).prompts == ((1, 7),)
    chat = schema.parse_request({"messages": [{"role": "user"}]}, chat=True)
    assert (chat.max_tokens, chat.max_tokens_param) == (None, "max_tokens")
    alias = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
    assert schema.parse_request(alias, chat=True).max_tokens_param == "max_completion_tokens"
    for raw, match in (
        (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "Exceeds the limit"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests arrays or objects"),
        (b'{"prompt": "\xff"}', "not JSON"),
    ):
        with pytest.raises(RequestError, match=match) as info:
            parse_json(raw)
        assert info.value.status == 400


def test_size_limits_before_the_tokenizer_and_fit_errors_naming_max_tokens() -> None:
    limits = request_limits(ByteTokenizer(256), cache_len=64)
    assert (limits.prompt_chars, limits.messages) == (2 * 64 * 4, 64)
    assert limits.body_bytes == 6 * limits.prompt_chars + (1 << 20)
    params = schema.parse_request({"prompt": "x" * 513}, chat=False)
    with pytest.raises(RequestError, match="prompt has 513 characters; a prompt that fits") as e:
        check_prompt_size(params, limits)
    assert e.value.param == "prompt"
    many = {"messages": [{"role": "user", "content": "hi"}] * 65}
    with pytest.raises(RequestError, match="65 messages") as e:
        check_prompt_size(schema.parse_request(many, chat=True), limits)
    assert e.value.param == "messages"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 60}
    with pytest.raises(
        RequestError, match=r"max_completion_tokens 60 \+ the prompt's 8 tokens"
    ) as e:
        check_fit(8, schema.parse_request(body, chat=True), cache_len=64)
    assert e.value.param == "max_completion_tokens" and "<= 56" in str(e.value)
    with pytest.raises(RequestError, match="the prompt has 64 tokens") as e:
        check_fit(64, schema.parse_request({"prompt": "x"}, chat=False), cache_len=64)
    assert e.value.param == "prompt"
    assert (
        check_fit(
            8,
            schema.parse_request(body | {"max_completion_tokens": None}, chat=True),
            cache_len=64,
        )
        == 56
    )


def test_the_longest_token_bounds_the_prompt_characters(tmp_path: Any) -> None:
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.serving.limits import longest_token_chars

    tok = load_tokenizer(demo_checkpoint_path(), vocab_size=1024)
    longest = longest_token_chars(tok)
    decoded = max(len(tok.decode([i])) for i in range(1024))
    assert longest >= decoded  # a token's text is never longer than its piece
    text = "The return statement. " * 40
    assert len(text) <= request_limits(tok, cache_len=len(tok.encode(text)) + 1).prompt_chars
