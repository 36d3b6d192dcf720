"""A checked request made ready for the step loop: prompt ids, token limits, sampling settings
and grammar, checked against the model (rank 0's HTTP layer, in a worker thread).

    check_counts(req, model)                        # n / best_of / prompts: before any work
    ready = prepare(req, model)                     # templates, tokenizer, grammar: RequestError
    subs = ready.submissions(req, sink)             # one per prompt, best_of (or n) sequences each

Templates, the tokenizer and the grammar compiler take time: ``prepare`` runs in a worker thread
(the tokenizer and llguidance release the interpreter lock), except for a short request
without a grammar (:func:`inline`: at most ``INLINE_CHARS`` characters of prompt and
``INLINE_MESSAGES`` messages, at most about 0.6 ms of template and tokenizer on the loop), which
the hop to a worker and back would delay more than its work. The grammar is compiled here once
and followed for its first tokens (``Grammars.check``: a grammar no text satisfies, or one
beyond the engine's size limits, is the client's 400 with the engine's reason, before any
step), and compiled again on every rank when the request joins (the same spec compiles alike
there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.grammar import Grammars, GrammarSpec
from torch_tensorrt_dist.generation.sampling import SamplingConfig
from torch_tensorrt_dist.models.tokenizer import Tokenizer
from torch_tensorrt_dist.serving.bridge import Sink, Submission
from torch_tensorrt_dist.serving.chat import ChatTemplate
from torch_tensorrt_dist.serving.chat_output import ChatOutput
from torch_tensorrt_dist.serving.limits import RequestLimits, check_fit, prompt_chars
from torch_tensorrt_dist.serving.protocol import RequestError
from torch_tensorrt_dist.serving.reasoning import END, Reasoning, prompt_opens_thinking
from torch_tensorrt_dist.serving.schema import ChatRequest, Params
from torch_tensorrt_dist.serving.tool_fields import template_messages
from torch_tensorrt_dist.serving.tools import CallFormat
from torch_tensorrt_dist.serving.tools.forced import REQUIRED, Named

__all__ = [
    "INLINE_CHARS",
    "INLINE_MESSAGES",
    "Prepared",
    "ServedModel",
    "check_counts",
    "inline",
    "prepare",
]

#: the most prompt characters (or token ids) of a request prepared on the event loop: the
#: bench checkpoint's tokenizer took 0.3 ms for 1,024 characters, the test checkpoint's
#: template and tokenizer 0.6 ms for 16 messages of 64; a request took 0.7-5 ms from its body
#: to its prepared ids through the worker on a server with 8 streaming clients
INLINE_CHARS = 1024
#: the most messages of a chat prepared on the event loop (the template renders each one)
INLINE_MESSAGES = 16


@dataclass
class ServedModel:
    """What the HTTP layer knows of the model: names, tokenizer, template and limits."""

    name: str
    tokenizer: Tokenizer
    chat: ChatTemplate | None
    cache_len: int
    vocab_size: int
    check: Callable[[int, int], None]
    """``check(prompt_len, max_new_tokens)``: ConfigError when the graphs cannot run it."""
    limits: RequestLimits
    rows: int = 1
    """Rows a step runs (``--max-batch-size``): the most sequences of one prompt (``n``)."""
    max_queue: int = 64
    """Sequences that may wait (``--max-queue``): the most of one request (prompts x n)."""
    grammars: Grammars | None = None
    """The grammar engine of structured output (None: not available, ``grammar_error``)."""
    grammar_error: str = "the grammar engine was not built"
    eos_ids: tuple[int, ...] = ()
    """The model's end-of-text ids (what ``min_tokens`` holds back besides ``stop_token_ids``)."""
    tool_format: CallFormat | None = None
    """How "auto" reads the model's tool calls (``--tool-call-parser``, else the template's)."""
    reasoning: bool = False
    """Split ``<think>`` reasoning into ``reasoning_content`` (``--reasoning-parser``)."""


def check_counts(req: Params, model: ServedModel) -> None:
    """``n`` / ``best_of`` within the rows a step runs, the sequences within the queue."""
    if req.sequences > model.rows:
        name = "best_of" if req.best_of is not None else "n"
        raise RequestError(
            400,
            f"{name}={req.sequences} asks for {req.sequences} sequences of one prompt at once; "
            f"this server runs at most {model.rows} (--max-batch-size {model.rows})",
            param=name,
        )
    prompts = 1 if req.chat else len(req.prompts)  # type: ignore[union-attr]
    if prompts * req.sequences > model.max_queue:
        name = "best_of" if req.best_of is not None else "n"
        what = f"{prompts} prompts x {name}={req.sequences}" if prompts > 1 else f"{name}"
        raise RequestError(
            400,
            f"this request asks for {what} = {prompts * req.sequences} sequences; this "
            f"server queues at most {model.max_queue} (--max-queue {model.max_queue})",
            param="prompt" if prompts > 1 else name,
        )


@dataclass(frozen=True)
class Prepared:
    """What the step loop needs of a request, per prompt and in common."""

    prompts: list[tuple[int, ...]]
    echo: list[str]
    """Each prompt's text as ``echo`` returns it ("" without ``echo``)."""
    max_new: list[int]
    sampling: SamplingConfig
    grammar: GrammarSpec | None
    grammar_param: str | None
    output: ChatOutput | None = None
    """How a chat's text becomes its message (tools, reasoning); None: all content."""

    def submissions(self, req: Params, sink: Sink) -> list[Submission]:
        """One submission per prompt, sharing ``sink``: ``req.sequences`` sequences each,
        indexed prompt-major (``Piece.index``)."""
        k = req.sequences
        return [
            Submission(
                ids,
                max_new,
                self.sampling,
                req.seed,
                req.stop,
                sink,
                n=k,
                index=i * k,
                grammar=self.grammar,
                grammar_param=self.grammar_param,
            )
            for i, (ids, max_new) in enumerate(zip(self.prompts, self.max_new))
        ]


def inline(req: Params) -> bool:
    """Whether ``req`` is prepared on the event loop: no grammar to compile, at most
    ``INLINE_CHARS`` characters of prompts (all messages' content for a chat) and, for a chat,
    at most ``INLINE_MESSAGES`` messages and no tools."""
    if isinstance(req, ChatRequest) and (len(req.messages) > INLINE_MESSAGES or req.tools):
        return False  # many messages, or tools (their schemas are rendered too)
    return req.grammar() is None and prompt_chars(req) <= INLINE_CHARS


def prepare(req: Params, model: ServedModel) -> Prepared:
    """Tokenize, check the limits, build the sampling settings and compile the grammar."""
    output = None
    if isinstance(req, ChatRequest):
        rendered, chat_ids = _chat_ids(req, model)
        prompts, echo = [tuple(chat_ids)], [""]
        output = _chat_output(req, model, rendered)
    else:
        prompts, echo = [], []
        for k, prompt in enumerate(req.prompts):
            ids = _prompt_ids(prompt, model, "prompt" if len(req.prompts) == 1 else f"prompt[{k}]")
            prompts.append(ids)
            text = prompt if isinstance(prompt, str) else model.tokenizer.decode(list(ids))
            echo.append(text if req.echo else "")
    what = "messages" if req.chat else "prompt"
    max_new = []
    for ids in prompts:
        m = check_fit(len(ids), req, cache_len=model.cache_len)
        try:
            model.check(len(ids), m)  # the compiled buckets (artifacts)
        except ConfigError as exc:
            raise RequestError(400, str(exc), param=what) from exc
        max_new.append(m)
    sampling = req.sampling()
    try:
        sampling.check_for(
            vocab_size=model.vocab_size, max_new_tokens=min(max_new), eos_ids=model.eos_ids
        )
    except ConfigError as exc:  # "logit_bias holds ...", "min_tokens (9) exceeds max_tokens"
        name = str(exc).split(" ", 1)[0]
        raise RequestError(400, str(exc), param=name) from exc
    found = req.grammar()
    if found is None:
        return Prepared(prompts, echo, max_new, sampling, None, None, output)
    spec, param = found
    if output is not None and output.reasoning is not None and output.reasoning.inside:
        spec = replace(spec, after=END)  # the grammar starts once the reasoning has ended
    _compile(spec, param, model, req)
    return Prepared(prompts, echo, max_new, sampling, spec, param, output)


def _chat_output(req: ChatRequest, model: ServedModel, prompt: str) -> ChatOutput | None:
    """How the answer's text becomes its message (None: all of it is content)."""
    mode = req.tool_mode
    calls: CallFormat | Named | None = None
    if mode == "auto":
        if model.tool_format is None:
            raise RequestError(
                400,
                f'tool_choice "auto" (the default with tools) reads the model\'s own tool calls, '
                f"and the format of model {model.name!r} is not known from its chat template; "
                "start the server with --tool-call-parser hermes|llama3_json|mistral, or send "
                'tool_choice "required" or a named function',
                param="tool_choice",
            )
        calls = model.tool_format
    elif mode == "required":
        calls = REQUIRED
    elif mode == "function" and req.tool_choice is not None:
        calls = Named(str(req.tool_choice.function))
    reasoning = Reasoning(prompt_opens_thinking(prompt)) if model.reasoning else None
    if calls is None and reasoning is None:
        return None
    return ChatOutput(calls, reasoning, parallel=req.parallel_tool_calls)


def _compile(spec: GrammarSpec, param: str, model: ServedModel, req: Params) -> None:
    """A grammar the engine cannot compile, that no text satisfies, or that fails within its
    first tokens (the engine's size limits: ``Grammars.check``) is the client's 400, with the
    engine's reason (for a tool's grammar, naming the tool whose parameters the engine refused),
    before any step."""
    if model.grammars is None:
        raise RequestError(
            400,
            f"{param}: structured output is not available here ({model.grammar_error})",
            param=param,
        )
    try:
        model.grammars.check(spec)
    except ConfigError as exc:  # GrammarError: the engine's reason
        if param == "tool_choice" and isinstance(req, ChatRequest):
            param = _refused_tool(req, model.grammars) or param
        raise RequestError(400, f"{param}: {exc}", param=param) from exc


def _refused_tool(req: ChatRequest, grammars: Grammars) -> str | None:
    """The first ``tools[i].function.parameters`` the grammar engine refuses alone."""
    choice = req.tool_choice.function if req.tool_choice is not None else None
    for i, tool in enumerate(req.tools or []):
        fn = tool["function"]
        if choice is not None and fn["name"] != choice:
            continue
        try:
            grammars.compile(GrammarSpec.json_schema(fn.get("parameters") or {}))
        except ConfigError:
            return f"tools[{i}].function.parameters"
    return None


def _chat_ids(req: ChatRequest, model: ServedModel) -> tuple[str, list[int]]:
    """The prompt's text and ids: the messages (and tools) through the chat template."""
    if model.chat is None:
        raise RequestError(
            400,
            f"model {model.name!r} has no chat template (no chat_template in its "
            "tokenizer_config.json); use /v1/completions",
            param="messages",
        )
    if req.tool_mode == "auto" and not model.chat.takes_tools:
        raise RequestError(
            400,
            f"the chat template of model {model.name!r} does not render tools, so the model "
            'cannot know them; send tool_choice "required" or a named function (a grammar '
            "forces the call), or use a checkpoint whose template takes tools",
            param="tools",
        )
    try:
        text = model.chat.render(
            template_messages(req.messages),
            tools=req.tools or None,
            variables=req.chat_template_kwargs,
        )
    except ConfigError as exc:
        raise RequestError(400, str(exc), param="messages") from exc
    except Exception as exc:  # the template's own error on these messages
        raise RequestError(
            400,
            f"the chat template failed on these messages ({type(exc).__name__}: {exc})",
            param="messages",
        ) from exc
    return text, _encode(text, model, special=False, param="messages")


def _prompt_ids(prompt: str | tuple[int, ...], model: ServedModel, what: str) -> tuple[int, ...]:
    if isinstance(prompt, str):
        return tuple(_encode(prompt, model, special=True, param="prompt"))
    bad = [i for i in prompt if not 0 <= i < model.vocab_size]
    if bad:
        raise RequestError(
            400, f"{what} holds token ids {bad[:4]} outside [0, {model.vocab_size})", param="prompt"
        )
    return prompt


def _encode(text: str, model: ServedModel, *, special: bool, param: str) -> list[int]:
    try:
        return model.tokenizer.encode(text, add_special_tokens=special)
    except ConfigError as exc:  # the byte tokenizer: a byte beyond the vocabulary
        raise RequestError(400, str(exc), param=param) from exc
