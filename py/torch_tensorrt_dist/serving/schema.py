"""The HTTP API's requests, one definition each: pydantic models of OpenAI's (and vLLM's) fields,
from which the sampling settings and the grammar flow to every rank.

    req = parse_request(body, chat=False)    # CompletionRequest; RequestError(400) naming the field
    cfg = req.sampling()                     # SamplingConfig: every field of it the request has
    grammar = req.grammar()                  # (GrammarSpec, the field it came from) or None

Each field is declared once, with its type, default and check. The sampling settings are
declared by :class:`~torch_tensorrt_dist.generation.sampling.SamplingConfig` itself: each of its
fields is a request field of the same name, default and check (``sampling.check_field``), except
the few whose HTTP form differs and which are declared here (``HTTP_FORM``: OpenAI's temperature
range, ``top_k`` -1, the seed rank 0 picks, ``logprobs``' two shapes). They flow into the
settings by name (:meth:`RequestFields.sampling`), and the settings travel to every rank as JSON
(``SamplingConfig.to_json``): a new sampling setting is one edit, its ``SamplingConfig`` field
and its check; the HTTP field, the control channel and every rank's settings follow.

The checks are this package's validators (``request_fields.py``, ``validation.py``,
``sampling.check_field``), so every refusal says what was found and what is accepted;
pydantic's error becomes a 400 in OpenAI's body whose ``param`` names the field the client sent
(``max_completion_tokens`` where that is what it sent). A ``null`` is the field's default.
Unknown fields are ignored; fields this server cannot honour (``request_fields.UNSUPPORTED``) are
refused by name unless left at their default.
"""

from __future__ import annotations

from dataclasses import Field as DataclassField
from dataclasses import fields
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    create_model,
    model_validator,
)

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.grammar import GrammarSpec
from torch_tensorrt_dist.generation.sampling import (
    LOGPROBS_MAX,
    SamplingConfig,
    check_field,
    check_top_p,
)
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.request_fields import (
    MAX_STOP_CHARS,
    StreamOptions,
    check_completion_logprobs,
    check_guided_choice,
    check_guided_json,
    check_guided_regex,
    check_messages,
    check_model,
    check_prompts,
    check_response_format,
    check_stop,
    check_stream_options,
    check_temperature,
    check_top_k,
    unsupported_field,
)
from torch_tensorrt_dist.serving.tool_fields import (
    ToolChoice,
    check_chat_template_kwargs,
    check_message_tool_calls,
    check_tool_choice,
    check_tools,
)
from torch_tensorrt_dist.serving.tools.forced import named_schema, required_schema
from torch_tensorrt_dist.validation import check_bool, check_int, check_seed

__all__ = [
    "HTTP_FORM",
    "MAX_STOP_CHARS",
    "ChatRequest",
    "CompletionRequest",
    "FieldError",
    "Params",
    "RequestFields",
    "parse_request",
]

_GRAMMAR_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice")
_SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingConfig))
#: ``SamplingConfig`` fields whose HTTP form differs from the config's (declared in
#: ``_Fields``); every other one is a request field as the config declares it
HTTP_FORM = ("temperature", "top_k", "top_p", "seed", "logprobs")


class FieldError(ConfigError):
    """A refusal that involves several fields; ``param`` names the one to change."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _int(name: str, low: int, high: int | None = None) -> Any:
    return PlainValidator(lambda v: check_int(v, name=name, low=low, high=high))


def _bool(name: str) -> Any:
    return PlainValidator(lambda v: check_bool(v, name=name))


def _sampling(name: str) -> Any:
    """The check of ``SamplingConfig`` field ``name`` (the same field, the same message)."""
    return PlainValidator(lambda v: check_field(name, v))


class _Fields(BaseModel):
    """The fields both endpoints take that ``SamplingConfig`` does not declare as they are
    sent (see :data:`RequestFields`)."""

    model_config = ConfigDict(extra="ignore", arbitrary_types_allowed=True)
    chat: ClassVar[bool] = False

    model: Annotated[str | None, PlainValidator(check_model)] = None
    max_tokens: Annotated[int | None, _int("max_tokens", 1)] = None
    temperature: Annotated[float, PlainValidator(check_temperature)] = 1.0
    top_p: Annotated[float, PlainValidator(check_top_p)] = 1.0
    top_k: Annotated[int | None, PlainValidator(check_top_k)] = None
    seed: Annotated[int | None, PlainValidator(check_seed)] = None
    stop: Annotated[tuple[str, ...], PlainValidator(check_stop)] = ()
    n: Annotated[int, _int("n", 1)] = 1
    best_of: Annotated[int | None, _int("best_of", 1)] = None
    stream: Annotated[bool, _bool("stream")] = False
    stream_options: Annotated[StreamOptions | None, PlainValidator(check_stream_options)] = None
    response_format: Annotated[GrammarSpec | None, PlainValidator(check_response_format)] = None
    guided_json: Annotated[GrammarSpec | None, PlainValidator(check_guided_json)] = None
    guided_regex: Annotated[GrammarSpec | None, PlainValidator(check_guided_regex)] = None
    guided_choice: Annotated[GrammarSpec | None, PlainValidator(check_guided_choice)] = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ConfigError("the request body must be a JSON object")
        return {k: v for k, v in data.items() if v is not None}

    @model_validator(mode="after")
    def _together(self) -> _Fields:
        """What a field means beside the others."""
        if self.best_of is not None and self.best_of < self.n:
            raise FieldError("best_of", f"best_of ({self.best_of}) must be >= n ({self.n})")
        if self.stream and self.sequences > self.n:
            raise FieldError(
                "best_of",
                f"best_of ({self.best_of}) > n ({self.n}) cannot be streamed: the best "
                "sequences are known only at the end; leave stream unset or best_of <= n",
            )
        given = [name for name in _GRAMMAR_FIELDS if getattr(self, name) is not None]
        if len(given) > 1:
            raise FieldError(given[1], f"give one of {' or '.join(given)}, not both")
        return self

    @property
    def sequences(self) -> int:
        """Sequences generated per prompt: ``best_of``, else ``n``."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def max_new(self) -> int | None:
        """Tokens to generate at most (None: what the KV cache leaves after the prompt)."""
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The field ``max_new`` came from."""
        return "max_tokens"

    @property
    def top_logprobs_asked(self) -> int | None:
        """Alternatives per token the client asked to see (None: no logprobs)."""
        return None

    def sampling(self) -> SamplingConfig:
        """The sampling settings: every ``SamplingConfig`` field this request has, by name
        (the seed aside: rank 0 picks it where the request gives none)."""
        mine = type(self).model_fields
        values = {name: getattr(self, name) for name in _SAMPLING_FIELDS if name in mine}
        values["seed"] = 0
        values["top_p"] = self.top_p if self.top_p < 1.0 else None
        values["logprobs"] = self.top_logprobs_asked
        if values["logprobs"] is None and self.sequences > self.n:
            values["logprobs"] = 0  # best_of ranks the sequences by their logprobs
        return SamplingConfig(**values)

    def grammar(self) -> tuple[GrammarSpec, str] | None:
        """The grammar the output must match, and the field it came from."""
        for name in _GRAMMAR_FIELDS:
            spec = getattr(self, name)
            if spec is not None:
                return spec, name
        return None


def _config_field(f: DataclassField[Any]) -> tuple[Any, Any]:
    """A ``SamplingConfig`` field as a request field: its check, its default."""
    return Annotated[Any, _sampling(f.name)], f.default


if TYPE_CHECKING:  # the fields added below are read by name only (``sampling()``)
    RequestFields = _Fields
else:
    RequestFields = create_model(
        "RequestFields",
        __base__=_Fields,
        __module__=__name__,
        **{f.name: _config_field(f) for f in fields(SamplingConfig) if f.name not in HTTP_FORM},
    )
    RequestFields.__doc__ = """The fields both endpoints take (OpenAI's, and vLLM's sampling
    extensions): ``_Fields`` and every ``SamplingConfig`` field outside ``HTTP_FORM``."""


class CompletionRequest(RequestFields):
    """``POST /v1/completions``."""

    prompt: Annotated[tuple[str | tuple[int, ...], ...], PlainValidator(check_prompts)] = Field(
        None, validate_default=True
    )
    max_tokens: Annotated[int | None, _int("max_tokens", 1)] = 16  # OpenAI's default
    echo: Annotated[bool, _bool("echo")] = False
    logprobs: Annotated[int | None, PlainValidator(check_completion_logprobs)] = None

    @property
    def prompts(self) -> tuple[str | tuple[int, ...], ...]:
        return self.prompt

    @model_validator(mode="after")
    def _echo(self) -> CompletionRequest:
        if self.echo and self.logprobs is not None:
            raise FieldError(
                "echo",
                "echo with logprobs asks for the prompt's logprobs, which this server does not "
                "compute; ask for one of them",
            )
        return self

    @property
    def top_logprobs_asked(self) -> int | None:
        return self.logprobs


class ChatRequest(RequestFields):
    """``POST /v1/chat/completions``."""

    chat: ClassVar[bool] = True

    messages: Annotated[list[dict[str, Any]], PlainValidator(check_messages)] = Field(
        None, validate_default=True
    )
    max_completion_tokens: Annotated[int | None, _int("max_completion_tokens", 1)] = None
    logprobs: Annotated[bool, _bool("logprobs")] = False
    top_logprobs: Annotated[int | None, _int("top_logprobs", 0, LOGPROBS_MAX)] = None

    @model_validator(mode="after")
    def _chat(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise FieldError("top_logprobs", "top_logprobs needs logprobs: true")
        return self

    # -- tools (serving/tool_fields.py; the calls' formats: serving/tools/)
    tools: Annotated[list[dict[str, Any]] | None, PlainValidator(check_tools)] = None
    tool_choice: Annotated[ToolChoice | None, PlainValidator(check_tool_choice)] = None
    parallel_tool_calls: Annotated[bool, _bool("parallel_tool_calls")] = True
    chat_template_kwargs: Annotated[
        dict[str, Any] | None, PlainValidator(check_chat_template_kwargs)
    ] = None

    @model_validator(mode="after")
    def _tools(self) -> ChatRequest:
        check_message_tool_calls(self.messages)
        choice = self.tool_choice
        if choice is None or choice.mode in ("none", "auto"):
            return self
        if not self.tools:
            raise FieldError("tool_choice", f"tool_choice {choice.mode!r} needs tools; give tools")
        names = [t["function"]["name"] for t in self.tools]
        if choice.function is not None and choice.function not in names:
            raise FieldError(
                "tool_choice",
                f"tool_choice names {choice.function!r}, which is not in tools "
                f"({', '.join(names)})",
            )
        given = [name for name in _GRAMMAR_FIELDS if getattr(self, name) is not None]
        if given:
            raise FieldError(
                given[0], f"give {given[0]} or tool_choice {choice.mode!r} (a grammar), not both"
            )
        return self

    @property
    def tool_mode(self) -> str:
        """``none`` (no tools, or ``tool_choice`` "none"), ``auto``, ``required`` or
        ``function`` (a named one)."""
        if not self.tools:
            return "none"
        return self.tool_choice.mode if self.tool_choice is not None else "auto"

    def tool_grammar(self) -> GrammarSpec | None:
        """The grammar of the calls ``tool_choice`` forces (required or named), else None."""
        tools, choice = self.tools or [], self.tool_choice
        if self.tool_mode == "required":
            return GrammarSpec.json_schema(
                required_schema(tools, parallel=self.parallel_tool_calls)
            )
        if self.tool_mode == "function" and choice is not None:
            tool = next(t for t in tools if t["function"]["name"] == choice.function)
            return GrammarSpec.json_schema(named_schema(tool))
        return None

    def grammar(self) -> tuple[GrammarSpec, str] | None:
        spec = self.tool_grammar()
        return (spec, "tool_choice") if spec is not None else super().grammar()

    @property
    def max_new(self) -> int | None:
        """``max_tokens``, else ``max_completion_tokens`` (None: what the cache leaves)."""
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def max_tokens_param(self) -> str:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return "max_tokens"

    @property
    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def _first_error(exc: ValidationError) -> RequestError:
    """Pydantic's first error as our 400: our check's message, the field the client sent."""
    err = exc.errors(include_url=False)[0]
    loc = err.get("loc", ())
    cause = (err.get("ctx") or {}).get("error")
    param = getattr(cause, "param", None) or (str(loc[0]) if loc else None)
    if isinstance(cause, Exception):
        message = str(cause)
    else:
        where = ".".join(str(part) for part in loc)
        message = f"{where}: {err.get('msg', 'invalid')}" if where else str(err.get("msg"))
    return RequestError(400, message, param=param)


def parse_request(body: Any, *, chat: bool) -> CompletionRequest | ChatRequest:
    """Check a ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body."""
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    name = unsupported_field(body, chat=chat)
    if name is not None:
        raise RequestError(
            400, f"{name} is not supported by this server; leave it unset", param=name
        )
    model: type[CompletionRequest | ChatRequest] = ChatRequest if chat else CompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _first_error(exc) from None


#: either request (what the limits and the handler take)
Params = CompletionRequest | ChatRequest
