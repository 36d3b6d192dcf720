"""Chat templates: a checkpoint's ``chat_template`` rendered with jinja2 as transformers does.

    template = load_chat_template(checkpoint_dir)       # None when the model has none
    text = template.render(messages)                    # the prompt, generation prompt added
    text = template.render(messages, tools=tools)       # with OpenAI's tool list (takes_tools)
    ids = tokenizer.encode(text, add_special_tokens=False)

Where transformers looks: ``chat_template.jinja`` beside the tokenizer, else the
``chat_template`` of ``tokenizer_config.json`` (a string, or a list of named templates: the one
named ``default``). The environment is transformers': a sandbox with ``trim_blocks``,
``lstrip_blocks``, loop controls, a ``{% generation %}`` block that renders its body, and the
``raise_exception``, ``strftime_now`` and ``tojson`` helpers; the named special tokens
(``bos_token``, ``eos_token``...) of ``tokenizer_config.json`` are template variables.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from torch_tensorrt_dist.errors import CheckpointError, ConfigError

__all__ = ["ChatTemplate", "load_chat_template"]

_SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def _token_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])  # a serialised AddedToken
    return None


def _compile(source: str) -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # {% generation %}...{% endgeneration %}: the body as is
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise CheckpointError(f"the chat template does not parse: {exc}") from exc


@dataclass
class ChatTemplate:
    """A compiled chat template and the special tokens it may use."""

    source: str
    special: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._template = _compile(self.source)

    @cached_property
    def takes_tools(self) -> bool:
        """Whether the template reads the ``tools`` variable (renders a tool list; parsed
        once)."""
        from jinja2 import meta

        return "tools" in meta.find_undeclared_variables(
            self._template.environment.parse(self.source)
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages`` (ConfigError when the template refuses them);
        ``tools``: OpenAI's tool list, as transformers passes it (None: no tools);
        ``variables``: more template variables (vLLM's ``chat_template_kwargs``)."""
        import jinja2

        try:
            return str(
                self._template.render(
                    **(variables or {}),
                    messages=messages,
                    tools=tools,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **self.special,
                )
            )
        except jinja2.exceptions.TemplateError as exc:
            raise ConfigError(f"the chat template refused the messages: {exc}") from exc


def load_chat_template(path: str | Path | None) -> ChatTemplate | None:
    """The checkpoint's chat template, or None when it has none."""
    if path is None:
        return None
    root = Path(path)
    config: dict[str, Any] = {}
    cfg_file = root / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            config = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from exc
    source: Any = None
    if (root / "chat_template.jinja").is_file():
        source = (root / "chat_template.jinja").read_text()
    else:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: transformers' default is "default"
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        return None
    special = {k: t for k in _SPECIAL if (t := _token_text(config.get(k))) is not None}
    return ChatTemplate(source, special)
