"""The tool-call and reasoning parsers (serving/tools/, serving/reasoning.py) over what the
families' chat templates render (tests/_tool_templates.py, rendered by serving/chat.py as the
server renders them): an assistant turn with tool calls, rendered by its family's template,
parses back into those calls; streamed in pieces of every size, the deltas join into the same
content and arguments, with OpenAI's delta shape (a first delta per call with index, id, type
and name; then arguments only)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.serving.chat import ChatTemplate
from torch_tensorrt_dist.serving.reasoning import Reasoning, prompt_opens_thinking
from torch_tensorrt_dist.serving.tools import (
    FORMATS,
    CallFormat,
    format_for_template,
    tool_format,
)
from torch_tensorrt_dist.serving.tools.forced import REQUIRED, Named, required_schema

from . import _tool_templates as T

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}
CALLS = [
    {"id": "Abc123xyz", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris \"Ville\"", "unit": "c"}}},
    {"id": "Def456uvw", "type": "function",
     "function": {"name": "get_time", "arguments": {"zone": -3}}},
]  # fmt: skip
#: family -> (template, parser, the assistant turn's start and end in the rendered prompt)
FAMILIES = {
    "hermes": (T.HERMES, "<|im_start|>assistant\n", "<|im_end|>"),
    "llama3_json": (T.LLAMA3, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>"),
    "mistral": (T.MISTRAL, "[/INST]\n", "</s>"),
    "mistral_v11": (T.MISTRAL_V11, "[/INST]\n", "</s>"),
}
PARSER = {"mistral_v11": "mistral"}


def _turn(family: str, content: str, calls: list[dict[str, Any]]) -> str:
    """The assistant turn the family's template renders for ``content`` and ``calls``."""
    source, start, end = FAMILIES[family]
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": content, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "Abc123xyz", "content": "20"},
        {"role": "user", "content": "Thanks"},
    ]
    text = ChatTemplate(source, SPECIAL).render(messages, tools=[T.WEATHER, T.TIME])
    assert '"maxLength": 12' in text and '"name": "get_time"' in text  # the tools are there
    turn = text[text.index(start) + len(start) :]
    return turn[: turn.index(end)]


def _pieces(text: str, sizes: list[int]) -> list[str]:
    out, i, k = [], 0, 0
    while i < len(text):
        size = sizes[k % len(sizes)]
        out.append(text[i : i + size])
        i, k = i + size, k + 1
    return out


def _streamed(fmt: Any, pieces: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """The content and calls the deltas of ``pieces`` add up to, checking OpenAI's shape."""
    stream = fmt.stream()
    content, calls = "", []
    for delta in [d for p in pieces for d in stream.feed(p)] + stream.finish():
        assert set(delta) in ({"content"}, {"tool_calls"}), delta
        if "content" in delta:
            assert delta["content"] and not calls, "content after a call, or an empty delta"
            content += delta["content"]
            continue
        (tc,) = delta["tool_calls"]
        if tc["index"] == len(calls):  # a call's first delta: its id, type and name
            assert set(tc) == {"index", "id", "type", "function"} and tc["type"] == "function"
            assert tc["function"]["arguments"] == ""
            calls.append({"id": tc["id"], "name": tc["function"]["name"], "arguments": ""})
        else:
            assert tc["index"] == len(calls) - 1 and set(tc) == {"index", "function"}
            assert set(tc["function"]) == {"arguments"} and tc["function"]["arguments"]
            calls[-1]["arguments"] += tc["function"]["arguments"]
    return content, calls


def _check_stream_matches_whole(fmt: Any, text: str) -> None:
    whole = fmt.parse(text)
    for sizes in ([1], [2], [3], [7], [1, 5, 2], [len(text) + 1]):
        content, calls = _streamed(fmt, _pieces(text, sizes))
        assert content == (whole.content or "") or (not content.strip() and whole.content is None)
        assert [(c["name"], c["arguments"]) for c in calls] == [
            (c.name, c.arguments) for c in whole.calls
        ]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("n", [1, 2])
def test_a_templates_rendered_calls_parse_back_whole_and_streamed(family: str, n: int) -> None:
    content = "Let me check." if family == "hermes" else ""
    text = _turn(family, content, CALLS[:n])
    fmt = FORMATS[PARSER.get(family, family)]
    parsed = fmt.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in CALLS[:n]
    ]
    assert (parsed.content or "").strip() == content
    ids = {c.id for c in parsed.calls}
    assert len(ids) == n and all(i.startswith("call_") or len(i) == 9 for i in ids)
    _check_stream_matches_whole(fmt, text)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_default_parser_is_recognised_from_the_template(family: str) -> None:
    family = PARSER.get(family, family)
    assert format_for_template(FAMILIES[family][0]) == family
    assert format_for_template("{{ messages[0].content }}") is None
    assert tool_format(family) is FORMATS[family]
    with pytest.raises(ConfigError, match="--tool-call-parser 'qwen9' is not known; choose"):
        tool_format("qwen9")


@pytest.mark.parametrize("family", sorted(FORMATS))
@pytest.mark.parametrize(
    "text",
    [
        "Paris is sunny today.",
        "",
        "a { brace } and [brackets] and <tool_ and [TOOL",
        "  \n",
        '{"answer": 42}',  # JSON content: llama3_json reads it as a call that has no name
        "<tool_call>not json</tool_call> [TOOL_CALLS] {]",
    ],
)
def test_text_without_calls_is_content_whole_and_streamed(family: str, text: str) -> None:
    fmt = FORMATS[family]
    assert fmt.parse(text).content == (text or None) and fmt.parse(text).calls == []
    for sizes in ([1], [4], [100]):
        content, calls = _streamed(fmt, _pieces(text, sizes))
        assert content == text and calls == []


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (FORMATS["hermes"], 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "P'),
        (FORMATS["hermes"], '<tool_call>\n{"arguments": {"city": "P"}}\n</tool_call>'),
        (FORMATS["hermes"], '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>'),
        (FORMATS["hermes"], '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
        (FORMATS["mistral"], '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}'),
        (FORMATS["mistral"], '[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": 3}]'),
        (FORMATS["llama3_json"], '{"name": "f", "parameters": {"a": tru'),
        (FORMATS["mistral"], '[TOOL_CALLS]f[ARGS]{"a": 1'),
        (FORMATS["mistral"], "[TOOL_CALLS]f[ARGS]oops"),
    ],
)
def test_calls_that_do_not_parse_are_the_whole_text_as_content(fmt: CallFormat, text: str) -> None:
    parsed = fmt.parse(text)
    assert parsed.content == text and parsed.calls == []


def test_a_last_call_cut_short_after_whole_ones_is_left_out() -> None:
    text = '[{"name": "get_time", "parameters": {"zone": 2}}, {"name": "get_weath'
    assert [c.name for c in REQUIRED.parse(text).calls] == ["get_time"]


def test_the_arguments_stream_as_the_model_writes_them() -> None:
    args = '{"q": "a}b{\\"c", "n": [1, {"m": 2}]}'
    text = '<tool_call>\n{"name": "f", "arguments": ' + args + "}\n</tool_call>"
    stream = FORMATS["hermes"].stream()
    deltas = [d for ch in text for d in stream.feed(ch)]
    sent = [d["tool_calls"][0]["function"]["arguments"] for d in deltas[1:]]
    assert "".join(sent) == args
    assert len(sent) > 10  # piece by piece, not at the end
    # the name is sent once whole, before any argument
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}


def test_a_malformed_call_keeps_what_was_sent_whole_and_as_merged_pieces() -> None:
    """A later call that is not a call stops the stream of calls, but the deltas built
    before it in the same feed still go out: the first call's arguments are whole JSON, and
    a slow reader's merged piece gets what the same text token by token gets."""
    first = '<tool_call>\n{"name": "f", "arguments": {"a": 1'
    rest = '}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": [1]}\n</tool_call>'
    hermes = FORMATS["hermes"]
    for pieces in ([first, rest], list(first + rest), [first + rest]):
        _, calls = _streamed(hermes, pieces)
        assert calls[0]["name"] == "f" and json.loads(calls[0]["arguments"]) == {"a": 1}
        assert [c["name"] for c in calls] == ["f", "g"] and calls[1]["arguments"] == ""


def test_a_call_without_arguments_has_an_empty_object() -> None:
    text = '<tool_call>\n{"name": "now"}\n</tool_call>'
    assert FORMATS["hermes"].parse(text).calls[0].arguments == "{}"
    _check_stream_matches_whole(FORMATS["hermes"], text)


def test_arguments_sent_as_a_json_string_are_that_string() -> None:
    text = '{"name": "f", "parameters": "{\\"a\\": 1}"}'
    assert FORMATS["llama3_json"].parse(text).calls[0].arguments == '{"a": 1}'
    _check_stream_matches_whole(FORMATS["llama3_json"], text)


def test_llama3_python_tag_and_leading_space_start_the_calls() -> None:
    fmt = FORMATS["llama3_json"]
    for text in (
        '<|python_tag|>{"name": "f", "parameters": {}}',
        '  {"name": "f", "parameters": {}}',
    ):
        assert [c.name for c in fmt.parse(text).calls] == ["f"]
        _check_stream_matches_whole(fmt, text)
    assert fmt.parse("Hello {").calls == []


def test_forced_named_and_required_read_what_their_grammars_force() -> None:
    named = Named("get_weather")
    text = '  {"city": "Oslo", "unit": "f"} '
    (call,) = named.parse(text).calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {
        "city": "Oslo",
        "unit": "f",
    }
    _check_stream_matches_whole(named, text)
    assert named.parse('{"city": "Os').calls == []  # cut by max_tokens: text
    text = (
        '[{"name": "get_time", "parameters": {"zone": 2}}, '
        '{"name": "get_weather", "parameters": {"city": "A", "unit": "c"}}]'
    )
    assert [c.name for c in REQUIRED.parse(text).calls] == ["get_time", "get_weather"]
    assert REQUIRED.parse(text).content is None
    _check_stream_matches_whole(REQUIRED, text)


def test_the_required_schema_takes_exactly_the_calls_of_the_tools() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = required_schema([T.WEATHER, T.TIME], parallel=True)
    ok = [
        {"name": "get_time", "parameters": {"zone": 2}},
        {"name": "get_weather", "parameters": {"city": "A", "unit": "c"}},
    ]
    jsonschema.validate(ok, schema)
    for bad in (
        [],
        [{"name": "get_time", "parameters": {"zone": 99}}],
        [{"name": "x", "parameters": {}}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    with pytest.raises(jsonschema.ValidationError):  # one call only
        jsonschema.validate(ok, required_schema([T.WEATHER, T.TIME], parallel=False))


# --------------------------------------------------------------------------- reasoning


def test_reasoning_splits_whole_and_streamed_as_the_template_opens_it() -> None:
    prompt = ChatTemplate(T.QWEN3_THINKING, SPECIAL).render([{"role": "user", "content": "Hi"}])
    assert prompt_opens_thinking(prompt)
    assert not prompt_opens_thinking(prompt + "\n\n</think>\n\n")
    cases = [
        (True, "Let me think.\nOK.</think>\n\nHello!", ("Let me think.\nOK.", "\n\nHello!")),
        (True, "still thinking <", ("still thinking <", "")),
        (False, "\n<think>hm</think>Hi", ("hm", "Hi")),
        (False, "Hi <think>no</think>", (None, "Hi <think>no</think>")),
        (False, "<thin", (None, "<thin")),
    ]
    for inside, text, want in cases:
        split = Reasoning(inside)
        assert split.parse(text) == want
        for size in (1, 2, 3, 50):
            stream = split.stream()
            got = [p for i in range(0, len(text), size) for p in stream.feed(text[i : i + size])]
            got += stream.finish()
            reasoning = "".join(t for kind, t in got if kind == "reasoning")
            content = "".join(t for kind, t in got if kind == "content")
            assert (reasoning or None, content) == (want[0] or None, want[1]), (text, size)


def test_streamed_pieces_of_random_sizes_join_to_the_whole_parse() -> None:
    rng = random.Random(0)
    text = _turn("hermes", "Let me check.", CALLS)
    for _ in range(50):
        sizes = [rng.randint(1, 9) for _ in range(20)]
        content, calls = _streamed(FORMATS["hermes"], _pieces(text, sizes))
        assert content.strip() == "Let me check." and len(calls) == 2
        assert [json.loads(c["arguments"]) for c in calls] == [
            c["function"]["arguments"] for c in CALLS
        ]


# ------------------------------------------------------------------- the tool grammars


def _accepts(grammars: Any, tok: Any, spec: Any, text: str) -> bool:
    from torch_tensorrt_dist.generation.grammar import GrammarError

    matcher = grammars.compile(spec)
    try:
        for t in tok.encode(text, add_special_tokens=False):
            matcher.accept(t)
    except GrammarError:
        return False
    return matcher.is_finished


def test_tool_grammars_take_compact_calls_and_start_after_the_reasoning() -> None:
    from dataclasses import replace

    pytest.importorskip("llguidance")
    from torch_tensorrt_dist.generation.grammar import Grammars, GrammarSpec
    from torch_tensorrt_dist.models.demo import demo_checkpoint_path
    from torch_tensorrt_dist.models.tokenizer import load_tokenizer
    from torch_tensorrt_dist.serving.tools.forced import named_schema

    tok = load_tokenizer(demo_checkpoint_path(), vocab_size=1024)
    grammars = Grammars.for_tokenizer(tok, vocab_size=1024, eos_ids=(1,))
    named = GrammarSpec.json_schema(named_schema(T.WEATHER))
    required = GrammarSpec.json_schema(required_schema([T.WEATHER, T.TIME], parallel=True))
    assert _accepts(grammars, tok, named, '{"city": "Oslo", "unit": "c"}')
    assert not _accepts(grammars, tok, named, '{"city":  "Oslo", "unit": "c"}')  # compact only
    assert not _accepts(grammars, tok, named, '{"city": "Oslo", "unit": "k"}')
    calls = '[{"name": "get_time", "parameters": {"zone": 3}}]'
    assert _accepts(grammars, tok, required, calls)
    assert not _accepts(
        grammars, tok, required, '[{"name": "get_time", "parameters": {"zone": 30}}]'
    )
    thinking = replace(required, after="</think>")
    assert GrammarSpec.from_json(json.loads(json.dumps(thinking.to_json()))) == thinking
    assert _accepts(grammars, tok, thinking, "Hmm, {not json} </thin </think>" + calls)
    assert not _accepts(grammars, tok, thinking, calls)  # the reasoning must end first
    assert not _accepts(grammars, tok, thinking, "ok</think>{}")
    for spec, good, bad in [
        (GrammarSpec.regex("[0-9]{2}/[a-z]"), "12/x", "1/x"),
        (GrammarSpec.choice(["yes", 'n"o']), 'n"o', "maybe"),
        (GrammarSpec.json_object(), '{"a": [1]}', "[1]"),
    ]:
        after = replace(spec, after="</think>")
        assert _accepts(grammars, tok, after, "a/b</think>" + good)
        assert not _accepts(grammars, tok, after, "a/b</think>" + bad)


def test_chat_output_splits_reasoning_then_reads_calls_whole_and_streamed() -> None:
    from torch_tensorrt_dist.serving.chat_output import ChatOutput

    call_text = '<tool_call>\n{"name": "get_time", "arguments": {"zone": 1}}\n</tool_call>'
    text = "Paris? Use the tool.</think>\n\n" + call_text
    out = ChatOutput(FORMATS["hermes"], Reasoning(inside=True))
    message, called = out.message(text)
    assert called and out.finish_reason("stop", called) == "tool_calls"
    assert out.finish_reason("length", called) == "length"
    assert ChatOutput(Named("f")).finish_reason("stop", True) == "stop"  # OpenAI's, vLLM's
    assert message["reasoning_content"] == "Paris? Use the tool." and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_time", "arguments": '{"zone": 1}'}
    for size in (1, 3, 8):
        stream = out.stream()
        deltas = [d for i in range(0, len(text), size) for d in stream.feed(text[i : i + size])]
        deltas += stream.finish()
        assert stream.called
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Paris? Use the tool."
        assert "".join(d.get("content", "") for d in deltas).strip() == ""
        args = [
            d["tool_calls"][0]["function"].get("arguments", "") for d in deltas if "tool_calls" in d
        ]
        assert "".join(args) == '{"zone": 1}'
    plain, called = ChatOutput(None, Reasoning(inside=False)).message("Hello")
    assert plain == {"role": "assistant", "content": "Hello", "reasoning_content": None}


def test_without_parallel_tool_calls_auto_keeps_the_first_call() -> None:
    from torch_tensorrt_dist.serving.chat_output import ChatOutput

    text = _turn("hermes", "", CALLS)
    out = ChatOutput(FORMATS["hermes"], parallel=False)
    message, _ = out.message(text)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    stream = out.stream()
    deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish()
    assert {d["tool_calls"][0]["index"] for d in deltas if "tool_calls" in d} == {0}
