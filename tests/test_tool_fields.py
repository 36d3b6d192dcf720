"""The tool fields of a chat request and the fields refused by name (serving/schema.py,
serving/tool_fields.py), pure: each bad value is a RequestError whose ``param`` is the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.schema import ChatRequest, parse_request

from . import _tool_templates as T

ASK = [{"role": "user", "content": "Hi"}]


def _fn(name: str = "f", **function: Any) -> dict[str, Any]:
    return {"tools": [{"type": "function", "function": {"name": name, **function}}]}


def _said(role: str, **message: Any) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": None, **message}]}


BAD_CALL = [{"function": {"name": "f", "arguments": "{bad"}}]
NAMED_X = {"type": "function", "function": {"name": "x"}}


def _chat(**fields: Any) -> ChatRequest:
    req = parse_request({"messages": ASK, **fields}, chat=True)
    assert isinstance(req, ChatRequest)
    return req


def test_tool_choice_modes_and_their_grammars() -> None:
    assert _chat().tool_mode == "none" and _chat(tool_choice="auto").tool_mode == "none"
    assert (
        _chat(tools=[T.WEATHER]).tool_mode == "auto" and _chat(tools=[T.WEATHER]).grammar() is None
    )
    spec, param = _chat(tools=[T.WEATHER, T.TIME], tool_choice="required").grammar()  # type: ignore[misc]
    assert param == "tool_choice" and json.loads(str(spec.value))["minItems"] == 1
    named = {"type": "function", "function": {"name": "get_time"}}
    spec, _ = _chat(tools=[T.WEATHER, T.TIME], tool_choice=named).grammar()  # type: ignore[misc]
    assert (
        json.loads(str(spec.value))["properties"] == T.TIME["function"]["parameters"]["properties"]
    )
    bare = {"type": "function", "function": {"name": "now", "parameters": None}}
    spec, _ = _chat(tools=[bare], tool_choice="required").grammar()  # type: ignore[misc]
    assert json.loads(str(spec.value))["items"]["properties"]["parameters"]["type"] == "object"
    one = _chat(tools=[T.WEATHER], tool_choice="required", parallel_tool_calls=False).grammar()
    assert one is not None and json.loads(str(one[0].value))["maxItems"] == 1


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (_fn(parameters=[1]), "tools[0].function.parameters"),
        (
            _fn(parameters={"properties": {"a": {"type": "nope"}}}),
            "tools[0].function.parameters.properties.a.type",
        ),
        (_fn(parameters={"required": "a"}), "tools[0].function.parameters.required"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (_fn("a b"), "tools[0].function.name"),
        ({"tools": [T.TIME, T.TIME]}, "tools[1].function.name"),
        ({"tools": [T.TIME] * 129}, "tools"),
        ({"tools": [T.TIME], "tool_choice": "any"}, "tool_choice"),
        ({"tools": [T.TIME], "tool_choice": NAMED_X}, "tool_choice"),
        ({"tools": [T.TIME], "tool_choice": "required", "guided_regex": "a"}, "guided_regex"),
        ({"tools": [T.TIME], "parallel_tool_calls": "no"}, "parallel_tool_calls"),
        (_said("assistant", tool_calls=BAD_CALL), "messages[0].tool_calls[0].function.arguments"),
        (_said("user", tool_calls=[]), "messages[0].tool_calls"),
        ({"chat_template_kwargs": {"bos_token": "x"}}, "chat_template_kwargs"),
        ({"chat_template": "{{ x }}"}, "chat_template"),
        ({"function_call": "auto"}, "function_call"),
        ({"structured_outputs": {"json": {}}}, "structured_outputs"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"skip_special_tokens": False}, "skip_special_tokens"),
    ],
)  # fmt: skip
def test_bad_tool_fields_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_request({"messages": ASK, **fields}, chat=True)
    assert err.value.status == 400 and err.value.param == param, err.value.message


def test_completions_refuse_tools_and_chat_takes_history_with_calls() -> None:
    with pytest.raises(RequestError) as err:
        parse_request({"prompt": "x", "tools": [T.TIME]}, chat=False)
    assert err.value.param == "tools"
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"zone": 1}'},
    }
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]  # fmt: skip
    assert _chat(messages=history, tools=[T.TIME]).messages[1]["tool_calls"] == [call]


def _served(template: str, tool_format: Any = None) -> Any:
    from torch_tensorrt_dist.generation.grammar import Grammars
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.serving.chat import ChatTemplate
    from torch_tensorrt_dist.serving.limits import request_limits
    from torch_tensorrt_dist.serving.prepare import ServedModel

    tok = load_tokenizer(demo_checkpoint_path(), vocab_size=1024)
    grammars = Grammars.for_tokenizer(tok, vocab_size=1024, eos_ids=(1,))
    chat = ChatTemplate(template, {"bos_token": "<s>", "eos_token": "</s>"})
    limits = request_limits(tok, cache_len=256)
    return ServedModel(
        "m", tok, chat, 256, 1024, lambda p, m: None, limits, grammars=grammars,
        tool_format=tool_format, reasoning=True,
    )  # fmt: skip


def test_auto_needs_a_known_format_and_a_template_that_renders_tools() -> None:
    pytest.importorskip("llguidance")
    from torch_tensorrt_dist.serving.prepare import prepare
    from torch_tensorrt_dist.serving.tools import FORMATS

    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    for model, param in [
        (_served(T.SERVER), "tool_choice"),
        (_served(plain, FORMATS["hermes"]), "tools"),
    ]:
        with pytest.raises(RequestError) as err:
            prepare(_chat(tools=[T.TIME]), model)
        assert err.value.param == param, err.value.message
    # forced calls need neither: the grammar carries the schema
    ready = prepare(_chat(tools=[T.TIME], tool_choice="required"), _served(plain))
    assert ready.grammar is not None and ready.grammar.after == ""
    # a prompt that opens <think>: the grammar starts after </think>
    ready = prepare(
        _chat(
            tools=[T.TIME], tool_choice="required", chat_template_kwargs={"enable_thinking": True}
        ),
        _served(T.SERVER),
    )
    assert ready.grammar is not None and ready.grammar.after == "</think>"
    assert ready.output is not None and ready.output.reasoning is not None
