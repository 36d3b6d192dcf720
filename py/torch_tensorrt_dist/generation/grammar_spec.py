"""What a request's output must match (structured output), as every rank receives it: a
:class:`GrammarSpec` (JSON object, JSON schema, regex or choice, optionally after a reasoning
model's ``</think>``), :class:`GrammarError` (a 400 with the engine's reason), and the
grammar text the engine compiles from a spec (llguidance's JSON options, its Lark dialect,
Rust ``regex`` escapes). The engine itself: :mod:`.grammar`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch_tensorrt_dist.errors import ConfigError

__all__ = [
    "JSON_OPTIONS",
    "KINDS",
    "GrammarError",
    "GrammarSpec",
    "after_lark",
    "describe",
    "literal",
    "own_options",
]

KINDS = ("json_object", "json_schema", "regex", "choice")
JSON_OPTIONS = {"whitespace_pattern": r"[\x20\x0A\x0D\x09]{0,16}"}
"""llguidance's JSON compile options: whitespace between tokens, bounded (see above)."""
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")
_WHAT = {
    "json_object": "the JSON object grammar",
    "json_schema": "the JSON schema",
    "regex": "the regex",
    "choice": "the choice list",
}


def describe(kind: str) -> str:
    """What a grammar of ``kind`` is called in an error ("the JSON schema")."""
    return _WHAT[kind]


class GrammarError(ConfigError):
    """A grammar the engine cannot compile or follow; ``reason`` is the engine's own text."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GrammarSpec:
    """What a request's output must match, as every rank receives it (:meth:`to_json`)."""

    kind: str
    """``json_object`` (any JSON object: OpenAI's json mode), ``json_schema``, ``regex`` or
    ``choice`` (exactly one of the strings: vLLM's ``guided_choice``)."""
    value: str | tuple[str, ...] = ""
    """The schema as JSON text, the regex, or the choices; empty for ``json_object``."""
    after: str = ""
    """Where the grammar starts: any text may come first, up to and including the first
    ``after`` (a reasoning model's ``</think>``); "": from the first token."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"grammar kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "choice":
            choices = self.value
            if isinstance(choices, str) or not isinstance(choices, Sequence) or not choices:
                raise ConfigError(
                    f"guided_choice must be a non-empty list of strings, got {choices!r}"
                )
            bad = [c for c in choices if not isinstance(c, str)]
            if bad:
                raise ConfigError(f"guided_choice must hold strings only, got {bad[0]!r}")
            object.__setattr__(self, "value", tuple(choices))
        elif not isinstance(self.value, str):
            raise ConfigError(f"a {self.kind} grammar is text, got {self.value!r}")

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: Any) -> GrammarSpec:
        """``schema``: a JSON schema as a dict (or bool) or as JSON text. The order of its
        ``properties`` is the order the output gives them in (llguidance), so it is kept."""
        if isinstance(schema, str):
            return cls("json_schema", schema)
        try:
            return cls("json_schema", json.dumps(schema, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise GrammarError(f"the JSON schema is not JSON: {exc}", reason=str(exc)) from None

    @classmethod
    def regex(cls, pattern: str) -> GrammarSpec:
        return cls("regex", pattern)

    @classmethod
    def choice(cls, choices: Sequence[str]) -> GrammarSpec:
        return cls("choice", choices if isinstance(choices, str) else tuple(choices))

    def to_json(self) -> dict[str, Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return {"kind": self.kind, "value": value, "after": self.after}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GrammarSpec:
        value = data.get("value", "")
        value = tuple(value) if isinstance(value, list) else value
        return cls(data["kind"], value, after=data.get("after", ""))


def literal(text: str) -> str:
    """``text`` as a regex that matches exactly it (Rust ``regex`` escapes)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def after_lark(spec: GrammarSpec) -> str:
    """``spec`` as a Lark grammar (llguidance's dialect) that any text up to and including the
    first ``spec.after`` precedes (a lazy lexeme: it ends at the first match)."""
    if spec.kind == "json_object" or spec.kind == "json_schema":
        text = "{}" if spec.kind == "json_object" else str(spec.value)
        schema: Any = {"type": "object"} if spec.kind == "json_object" else json.loads(text)
        if schema is True:
            schema = {}
        if isinstance(schema, dict):  # its own x-guidance options win (``own_options``)
            schema = {"x-guidance": JSON_OPTIONS, **schema}
        body = "%json " + json.dumps(schema)
    elif spec.kind == "regex":
        body = "/" + str(spec.value).replace("/", "\\/") + "/"
    else:
        body = " | ".join(json.dumps(c, ensure_ascii=False) for c in spec.value)
    prefix = literal(spec.after).replace("/", "\\/")
    return f"start: prefix body\nprefix[lazy]: /(?s:.*){prefix}/\nbody: {body}\n"


def own_options(schema: str) -> bool:
    """Whether a schema sets llguidance's JSON options itself (a top-level ``x-guidance``,
    as the tool-call grammars do: ``serving/tools/forced.py``)."""
    try:
        value = json.loads(schema)
    except ValueError:
        return False  # the engine says why
    return isinstance(value, dict) and "x-guidance" in value
