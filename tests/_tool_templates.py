# ruff: noqa: E501  (templates are text: their lines are as the model sees them)
"""Chat templates of the three tool-calling families, written for the tests in the shape of
the families' public templates: the tool list in the system (or last user) turn, an assistant
turn's ``tool_calls`` in the family's own format, ``tool`` messages as the family returns them."""

from __future__ import annotations

#: Hermes 2 Pro / Qwen2.5: <tool_call> tags, tool results inside <tool_response>
HERMES = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

Call functions by answering with JSON inside <tool_call></tool_call> tags. Functions:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' %}<|im_start|>assistant
{% if m.content %}{{ m.content }}{% endif %}
{% for tc in m.tool_calls or [] %}{% set f = tc.function if tc.function is defined else tc %}
{% if m.content or not loop.first %}{{ '\n' }}{% endif %}<tool_call>
{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

#: Llama 3.1: the answer is {"name", "parameters"}; built-in tools after <|python_tag|>
LLAMA3 = """\
{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
To call a function, answer with JSON only: {"name": its name, "parameters": an object of its arguments}.

{% for t in tools %}{{ t | tojson(indent=4) }}

{% endfor %}<|eot_id|>{% endif %}
{% for m in messages %}
{% if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

{% for tc in m.tool_calls %}{% if tc.function.name == 'brave_search' %}<|python_tag|>{% endif %}\
{{ '{"name": "' + tc.function.name + '", "parameters": ' + (tc.function.arguments | tojson) + '}' }}\
{% if not loop.last %}; {% endif %}{% endfor %}<|eom_id|>
{% elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

#: Mistral v0.3: [AVAILABLE_TOOLS] before the last user turn, [TOOL_CALLS] and a JSON list
MISTRAL = """\
{{ bos_token }}{% for m in messages %}
{% if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]
{% elif m.role == 'assistant' and m.tool_calls %}[TOOL_CALLS] [\
{% for tc in m.tool_calls %}{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}, "id": "{{ tc.id }}"}\
{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}
{% elif m.role == 'tool' %}[TOOL_RESULTS] {"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{% endif %}
{% endfor %}"""

#: Qwen3: a reasoning block opened by the generation prompt; Hermes tool calls after it
QWEN3_THINKING = HERMES.replace(
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}

#: the serving tests' checkpoint (tests/test_serve_tools.py): Hermes calls, the tools' names
#: only (the demo model has 256 positions; its tokenizer spends about a token per character of
#: JSON), a <think> block opened where chat_template_kwargs ask
SERVER = """\
{% if tools %}<|system|>
Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}
Call as <tool_call>{"name": ..., "arguments": ...}</tool_call></s>
{% endif %}
{% for m in messages %}
{% if m.role == 'assistant' and m.tool_calls %}<|assistant|>
{% for tc in m.tool_calls %}<tool_call>{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}</tool_call>{% endfor %}</s>
{% elif m.role == 'tool' %}<|tool|>
{{ m.content }}</s>
{% else %}<|{{ m.role }}|>
{{ m.content }}</s>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>
{% if enable_thinking %}<think>
{% endif %}{% endif %}"""

#: Mistral's v11 templates: [TOOL_CALLS]name[ARGS]{arguments} per call
MISTRAL_V11 = """\
{{ bos_token }}{% for m in messages %}
{% if m.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]
{% elif m.role == 'assistant' and m.tool_calls %}\
{% for tc in m.tool_calls %}[TOOL_CALLS]{{ tc.function.name }}[ARGS]{{ tc.function.arguments | tojson }}{% endfor %}{{ eos_token }}
{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}
{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]
{% endif %}
{% endfor %}"""
