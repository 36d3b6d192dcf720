"""The serving parts of a request that need no server: request checks and response shapes,
each sampling setting from HTTP to the control payload, a rank out of step, chat templates,
the wait queue."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch

from torch_tensorrt_dist.errors import CheckpointError, ConfigError
from torch_tensorrt_dist.generation import SamplingConfig
from torch_tensorrt_dist.generation.core import Request
from torch_tensorrt_dist.generation.plan import StepPlan

pytest.importorskip("fastapi")

from torch_tensorrt_dist.serving import control, protocol, schema
from torch_tensorrt_dist.serving.bridge import (
    Cancel,
    Inbox,
    QueueFull,
    Submission,
)
from torch_tensorrt_dist.serving.chat import ChatTemplate, load_chat_template


def test_request_defaults_and_checks() -> None:
    p = schema.parse_request({"prompt": "hi"}, chat=False)
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, p.stop, p.stream) == (
        16,
        1.0,
        1.0,
        None,
        (),
        False,
    )
    # unknown fields are ignored; known ones at their default ("off") pass
    extra = {"prompt": "hi", "user": "u", "x-trace": [1], "suffix": "", "tools": []}
    assert schema.parse_request(extra, chat=False).sampling() == p.sampling()
    c = schema.parse_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ],
            "stop": "x",
            "max_completion_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        chat=True,
    )
    assert c.messages == [{"role": "user", "content": "a\nb"}] and c.max_new == 5
    assert c.stop == ("x",) and c.include_usage
    assert schema.parse_request({"prompt": [[1, 2]]}, chat=False).prompts == ((1, 2),)
    bad = [
        ({"prompt": "x", "seed": 2**64}, r"seed must be an integer in \[0, 2\*\*64\)"),
        ({"prompt": "x", "temperature": 0.0001}, r"temperature must be 0 \(greedy\) or in"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens must be an integer >= 1, got 0"),
        ({"prompt": "x", "max_tokens": True}, "max_tokens must be an integer"),
        ({"prompt": "x", "temperature": float("nan")}, "temperature must be a finite number"),
        ({"prompt": ""}, "non-empty string"),
        ({"prompt": "x", "stream": "yes"}, "stream must be true or false"),
        ({"prompt": "x", "suffix": "y"}, "suffix is not supported"),
        ([1, 2], "must be a JSON object"),
    ]
    for body, message in bad:
        with pytest.raises(protocol.RequestError, match=message) as err:
            schema.parse_request(body, chat=False)
        assert err.value.status == 400 and err.value.body()["error"]["type"]
    with pytest.raises(protocol.RequestError, match=r"role 'robot' is not one of"):
        schema.parse_request({"messages": [{"role": "robot", "content": "x"}]}, chat=True)
    with pytest.raises(protocol.RequestError, match="content part 'image_url'"):
        schema.parse_request(
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, chat=True
        )


def test_response_and_chunk_shapes() -> None:
    head = {"rid": "chatcmpl-1", "created": 7, "model": "m"}
    one = protocol.choice(True, index=0, text="hi", finish="stop")
    body = protocol.response(True, choices=[one], usage=protocol.usage(3, 2), **head)
    assert body["object"] == "chat.completion" and body["usage"]["total_tokens"] == 5
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    first = protocol.chunk(True, text="", first=True, **head)
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    end = protocol.chunk(True, text=None, index=2, finish="length", **head)
    assert end["choices"][0] == {
        "index": 2,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    assert protocol.chunk(False, text="a", **head)["object"] == "text_completion"
    assert protocol.chunk(False, text=None, usage={"x": 1}, **head)["choices"] == []


def test_control_payload_round_trip() -> None:
    req = Request(7, (1, 2, 3), 9, SamplingConfig(0.7, None, 0.9, 123), (2,), ("\n\n", "END"))
    plan = StepPlan(
        cancels=[4, 5],
        preempts=[6],
        joins=[req],
        resumes=[8],
        cached={7: 2, 8: 5},
        chunks=[(8, 16), (7, 3)],
        drafts=[(3, 4), (9, 1)],
    )
    back = control.decode_plan(control.encode_plan(plan), stop=True)
    assert back == StepPlan(**{**plan.__dict__, "stop": True})
    assert StepPlan().steady and not StepPlan(cancels=[1]).steady
    assert not StepPlan(drafts=[(3, 2)]).steady  # every rank must know the drafts' sizes
    assert control.decode_plan(b"") == StepPlan()


def test_each_sampling_setting_is_one_definition_from_http_to_every_rank() -> None:
    """Every ``SamplingConfig`` field outside ``schema.HTTP_FORM`` is a request field with the
    config's default and the config's check (the same 400 message, naming it); what a body sets
    reaches the settings and comes out of the control channel equal on the other ranks."""
    for f in fields(SamplingConfig):
        if f.name in schema.HTTP_FORM:
            continue
        assert schema.CompletionRequest.model_fields[f.name].default == f.default, f.name
        assert schema.ChatRequest.model_fields[f.name].default == f.default, f.name
        with pytest.raises(ConfigError) as want:
            SamplingConfig(**{f.name: "?"})  # type: ignore[arg-type]
        with pytest.raises(protocol.RequestError) as got:
            schema.parse_request({"prompt": "x", f.name: "?"}, chat=False)
        assert (got.value.message, got.value.param) == (str(want.value), f.name)
    sent = {
        "presence_penalty": 0.5,
        "frequency_penalty": -1,
        "repetition_penalty": 1.25,
        "logit_bias": {"7": -100, "3": 2.5},
        "min_tokens": 3,
        "ignore_eos": True,
        "stop_token_ids": [9, 4, 9],
    }
    assert set(sent) == {f.name for f in fields(SamplingConfig)} - set(schema.HTTP_FORM)
    body = {"messages": [{"role": "user", "content": "x"}], "seed": 5, "top_k": -1, **sent}
    cfg = schema.parse_request(body | {"logprobs": True, "top_logprobs": 2}, chat=True).sampling()
    assert cfg == SamplingConfig(
        temperature=1.0,
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        repetition_penalty=1.25,
        logit_bias=((3, 2.5), (7, -100.0)),
        min_tokens=3,
        ignore_eos=True,
        stop_token_ids=(9, 4),
        logprobs=2,
    )
    req = Request(1, (5, 6), 8, cfg, cfg.end_ids((2,)), ())
    back = control.decode_plan(control.encode_plan(StepPlan(joins=[req])))
    assert back.joins == [req] and back.joins[0].stop_ids == (9, 4)  # ignore_eos: no 2


def test_a_rank_out_of_step_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    channel = control.ControlChannel(None)
    channel.is_source, channel.group = False, object()  # type: ignore[assignment]

    def broadcast(t: torch.Tensor, *_: Any, **__: Any) -> None:
        t.copy_(torch.tensor([control.MAGIC, 5, 0, 0]))  # step 5, this rank is at step 0

    monkeypatch.setattr(dist, "broadcast", broadcast)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)
    with pytest.raises(control.ControlError, match="expected control header of step 0, got"):
        channel.exchange()


def test_chat_templates_where_transformers_finds_them(tmp_path: Path) -> None:
    assert load_chat_template(tmp_path) is None
    named = [
        {"name": "tool_use", "template": "T"},
        {
            "name": "default",
            "template": "{{ bos_token }}{% for m in messages %}"
            "{% generation %}{{ m.content | tojson }}{% endgeneration %}{% endfor %}",
        },
    ]
    config = {"chat_template": named, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    t = load_chat_template(tmp_path)
    assert t is not None and t.render([{"role": "user", "content": "é"}]) == '<s>"é"'
    (tmp_path / "chat_template.jinja").write_text("J{{ eos_token }}")
    t = load_chat_template(tmp_path)
    assert t is not None and t.render([]) == "J</s>"
    refusing = ChatTemplate("{{ raise_exception('only user messages') }}")
    with pytest.raises(ConfigError, match="refused the messages: only user messages"):
        refusing.render([])
    with pytest.raises(CheckpointError, match="does not parse"):
        ChatTemplate("{% for %}")


def test_inbox_bound_and_take() -> None:
    inbox = Inbox(max_waiting=2)
    subs = [Submission((1,), 2, SamplingConfig(), None, (), None) for _ in range(3)]  # type: ignore[arg-type]
    inbox.submit(subs[0])
    inbox.submit(subs[1])
    with pytest.raises(QueueFull, match="2 sequences are waiting, this request adds 1"):
        inbox.submit(subs[2])
    inbox.cancel(subs[0].rid)
    assert inbox.take(0.0) == [subs[0], subs[1], Cancel(subs[0].rid)]
    inbox.left(1)
    inbox.submit(subs[2])
    assert inbox.waiting == 2 and inbox.take(0.01) == [subs[2]] and inbox.take(0.01) == []
    inbox.left(2)
    two = Submission((1,), 2, SamplingConfig(), None, (), None, n=2)  # type: ignore[arg-type]
    inbox.submit(two)  # the bound counts sequences: n = 2 fills it
    with pytest.raises(QueueFull, match="2 sequences are waiting, this request adds 1"):
        inbox.submit(subs[0])


def test_short_requests_without_a_grammar_are_prepared_on_the_event_loop() -> None:
    from torch_tensorrt_dist.serving.prepare import INLINE_CHARS, INLINE_MESSAGES, inline

    def parse(body: dict[str, Any], chat: bool = False) -> schema.Params:
        return schema.parse_request(body, chat=chat)

    assert inline(parse({"prompt": "x" * INLINE_CHARS}))
    assert not inline(parse({"prompt": "x" * (INLINE_CHARS + 1)}))
    # a list of prompts counts them all; token ids count as characters
    assert not inline(parse({"prompt": ["x" * (INLINE_CHARS // 2), "y" * (INLINE_CHARS // 2 + 1)]}))
    assert inline(parse({"prompt": [[5] * INLINE_CHARS]}))
    assert not inline(parse({"prompt": [[5] * (INLINE_CHARS + 1)]}))
    msgs = [{"role": "user", "content": "x" * (INLINE_CHARS // 2)}]
    assert inline(parse({"messages": msgs * 2}, chat=True))
    assert not inline(parse({"messages": msgs * 3}, chat=True))
    # many short messages: the template renders each one, in the worker
    few = [{"role": "user", "content": "x"}]
    assert inline(parse({"messages": few * INLINE_MESSAGES}, chat=True))
    assert not inline(parse({"messages": few * (INLINE_MESSAGES + 1)}, chat=True))
    # a grammar compiles in the worker whatever the prompt's size
    assert not inline(parse({"prompt": "x", "guided_regex": "[ab]+"}))
    assert not inline(parse({"messages": msgs, "response_format": {"type": "json_object"}}, True))


def test_a_request_of_more_sequences_than_the_queue_holds_is_a_400() -> None:
    from types import SimpleNamespace

    from torch_tensorrt_dist.serving.prepare import check_counts
    from torch_tensorrt_dist.serving.protocol import RequestError

    model = SimpleNamespace(rows=8, max_queue=64)
    many = SimpleNamespace(sequences=8, best_of=None, chat=False, prompts=[[1]] * 64)
    with pytest.raises(RequestError) as err:
        check_counts(many, model)  # type: ignore[arg-type]
    assert (err.value.status, err.value.param) == (400, "prompt")
    assert "64 prompts x n=8 = 512 sequences; this server queues at most 64" in str(err.value)
    check_counts(SimpleNamespace(**{**vars(many), "prompts": [[1]] * 8}), model)  # type: ignore[arg-type]
    chat = SimpleNamespace(sequences=8, best_of=8, chat=True, prompts=None)
    with pytest.raises(RequestError) as err:
        check_counts(chat, SimpleNamespace(rows=8, max_queue=4))  # type: ignore[arg-type]
    assert err.value.param == "best_of" and "best_of = 8 sequences" in str(err.value)
