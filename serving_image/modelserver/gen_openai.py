"""The OpenAI-compatible generation API's requests and answers (pure: no I/O, no model).

``POST /v1/completions`` and ``POST /v1/chat/completions`` take the fields users already send:
``max_tokens`` (chat: or ``max_completion_tokens``), ``temperature`` (0 = greedy), ``top_p``, ``top_k``,
``stop`` (up to 4 strings), ``seed``, ``stream`` (server-sent events, ``stream_options.include_usage``;
vLLM's ``stream_options.continuous_usage_stats``: every chunk carries the usage so far), ``n`` (1 only),
vLLM's ``ignore_eos`` (run to ``max_tokens`` past the EOS, for fixed-length benchmarks: guidellm sends it).
Any other field is refused with 400 naming it (a field we would silently ignore -- ``logprobs``,
``presence_penalty`` -- would change what the user gets without telling them).

This server's own fields: ``priority`` (1 is the highest, 0 the caller's level; the encoders'
``parameters.priority``; a body may only lower its request's priority, modelserver.gen_app says why) and
``timeout_ms`` (how long the request may wait for a place in the engine: 504 past it; a stream that has
started is never cut by it). modelserver.gen_schedule says what they do.

Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}`` (:func:`error_doc`, the one
place that turns an error of :mod:`modelserver.errors` into it): ``type`` by the status as OpenAI's clients
know it (``invalid_request_error``, ``not_found_error``, ``rate_limit_exceeded``, ``server_error``),
``param`` the request field it is about when there is one, ``code`` OpenAI's when it has one
(``context_length_exceeded``, ``model_not_found``), else the error's reason.

``seed``: with the own engine (``--engine own``) a sampled answer (``temperature`` > 0) is drawn from its
own generator seeded with it, so the same seed gives the same answer; transformers' manager seeds one
generator for all sequences, so there the engine refuses it (400, modelserver.gen_engine). With
``temperature`` 0 (greedy, always reproducible) it is accepted and changes nothing.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import InvalidInput, NotFound, ServerError
from .gen_engine import Sampling
from .models.wordcount import exceeds_words

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    # vLLM's: every chunk carries the usage so far (with include_usage; guidellm reads it per chunk)
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 or -1: off (vLLM's -1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=1, description="one answer per request")
    user: str | None = None
    ignore_eos: bool = Field(False, description="vLLM's: run to max_tokens past the EOS")
    # this server's own (the encoder parameters' names and meaning, not vLLM's "lower runs first")
    priority: int = Field(
        0,
        ge=0,
        description="1 is the highest; 0: the caller's level (the server's default, or the gateway's"
        " x-modeldeploy-priority header); a body may only lower it",
    )
    timeout_ms: float | None = Field(
        None, gt=0, description="the longest wait for a place in the engine (504 past it), not for the answer"
    )

    @model_validator(mode="after")
    def _consistent(self) -> _Common:
        stops = self.stops()
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self, max_tokens: int) -> Sampling:
        top_k = max(self.top_k, 0)
        greedy = self.temperature == 0.0
        return Sampling(
            max_tokens,
            self.temperature,
            self.top_p,
            top_k,
            greedy=greedy,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )

    @property
    def usage_options(self) -> tuple[bool, bool]:
        """(a usage chunk at the end, usage in every chunk): vLLM's continuous stats need include_usage."""
        opts = self.stream_options
        if opts is None or not opts.include_usage:
            return False, False
        return True, opts.continuous_usage_stats

    @property
    def wanted_tokens(self) -> int | None:
        """The answer's length the request asked for, if it did."""
        return self.max_tokens

    @property
    def tokens_field(self) -> str:
        """The field that sets the answer's length, as errors name it."""
        return "max_tokens"

    #: the field holding the prompt's text, as errors name it
    prompt_field: ClassVar[str] = "prompt"

    def text(self) -> str:
        """The text the prompt is made of (before a chat template), for the checks before tokenizing."""
        raise NotImplementedError


class CompletionRequest(_Common):
    prompt: str

    def text(self) -> str:
        return self.prompt


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    prompt_field: ClassVar[str] = "messages"

    @property
    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def tokens_field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"

    def text(self) -> str:
        return "\n".join(m.content for m in self.messages)  # a line break: no word spans two messages


# -- errors -----------------------------------------------------------------------------------------------
#: OpenAI's error type by status (its clients raise by status, and show the type)
ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_exceeded",
}
#: the request fields an error message may start with (``seed: ...``): the error's ``param``
FIELDS = frozenset(CompletionRequest.model_fields) | frozenset(ChatRequest.model_fields)
_PREFIX = re.compile(r"^([A-Za-z_]\w*)[\w.]*:")


class FieldError(InvalidInput):
    """A 400 about one field of the request: ``param`` names it, ``code`` is OpenAI's when it has one."""

    def __init__(self, param: str | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class ModelNotFound(NotFound):
    param = "model"
    code = "model_not_found"


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def param_of(e: ServerError) -> str | None:
    """The request field an error is about: the one it was raised with, else the field its message
    starts with (the engine's ``seed: ...``, ``priority: ...``), else None."""
    param = getattr(e, "param", None)
    if param is not None:
        return str(param)
    m = _PREFIX.match(str(e))
    return m.group(0)[:-1] if m is not None and m.group(1) in FIELDS else None


def error_fields(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def error_doc(e: ServerError) -> dict[str, Any]:
    """OpenAI's error object for ``e``: every refusal of the /v1 routes, streamed or not."""
    return error_fields(e.status, str(e), param_of(e), getattr(e, "code", None) or e.reason)


def parse(kind: type[_Common], doc: Any) -> Any:
    """The request, or :class:`FieldError` naming each bad field (``field: message``; ``param``: the
    first one)."""
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object")
    try:
        return kind.model_validate(doc)
    except ValidationError as e:
        parts, first = [], None
        for err in e.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "not a supported field"
            parts.append(f"{loc}: {msg}" if loc else msg)
            first = first or loc or None
        raise FieldError(first, "; ".join(parts)) from None


# -- the prompt's length, before tokenizing ------------------------------------------------------------------
#: the most characters Unicode normalization folds into one (NFC: a Hangul syllable of three jamo)
FOLD = 3


def longest_token(tokenizer: Any) -> int | None:
    """The most characters one token stands for, from the vocabulary's strings (byte-level BPE: a
    character per byte; SentencePiece: ``▁`` for a space, ``<0x41>`` for one byte); None when unknown."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, TypeError, NotImplementedError):
        return None
    return max((len(t) for t in vocab), default=0) or None


def check_length(field: str, text: str, context: int, max_tokens: int, longest: int | None) -> None:
    """Refuse, naming ``field``, a text too long for the context whatever the tokenizer makes of it --
    found without tokenizing, at a cost that does not grow with what was sent past the limit.

    Two lower bounds on the token count: the words that hold a letter or a digit (each is at least one
    token: modelserver.models.wordcount, the encoders' check), and the characters other than spaces, tabs
    and line breaks (which a normalizer or the template may drop), each token standing for at most
    ``longest`` of them, times :data:`FOLD` for normalization. The second finds a prompt of one endless word,
    which the first does not: tokenizing 4 MiB of it took 10 s of CPU and 700 MB."""
    room = max(0, context - max_tokens)  # tokens left for the prompt
    over = f"with max_tokens ({max_tokens}) it is over the context of {context} tokens"
    if longest is not None and len(text) > room * longest * FOLD:
        solid = len(text) - sum(text.count(c) for c in " \t\r\n")  # C loops, no copy
        if solid > room * longest * FOLD:
            raise FieldError(
                field,
                f"{field}: {solid} characters are more than {room} tokens can hold (at most"
                f" {longest * FOLD} characters a token): {over}",
                "context_length_exceeded",
            )
    if exceeds_words(text, room):
        raise FieldError(
            field,
            f"{field}: more than {room} words, each at least one token: {over}",
            "context_length_exceeded",
        )


# -- a chat's prompt --------------------------------------------------------------------------------------
#: where a message's special-token text waits, while the template is rendered, for the tokenizer: a
#: private-use plane of Unicode (no tokenizer gives its characters a meaning)
_PRIVATE = range(0xF0000, 0xFFFFE)


class ChatPrompts:
    """A chat's prompt tokens: the messages through the tokenizer's chat template -- the template's own
    special tokens (role markers, BOS, EOS) parsed, the messages' text kept text.

    ``apply_chat_template`` renders the template to one string and tokenizes it, so a message's text that
    spells a special token (``<|system|>``, ``</s>``) becomes that token: a user message can then end its
    own turn and open a ``system`` one. Unless ``parse_specials`` (the old behaviour), such text is
    tokenized as text: each special token's text in a message is swapped for a private-use character, the
    template rendered, the result split at the special tokens (all the template's now) and each piece
    between them, the text put back, tokenized with ``split_special_tokens``. That is how the tokenizer
    itself splits at special tokens, so with no such text in the messages (the common case, which takes
    ``apply_chat_template`` unchanged) nothing differs. A tokenizer whose pieces tokenize differently alone
    than after a special token (a SentencePiece one that adds a leading space to each call) could not be
    followed exactly: there, such a message is refused (400, naming it) rather than tokenized differently."""

    def __init__(self, tokenizer: Any, parse_specials: bool = False) -> None:
        self.tokenizer = tokenizer
        self.parse_specials = parse_specials
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        names = {t.content for t in added.values() if getattr(t, "special", False)}
        names |= set(getattr(tokenizer, "all_special_tokens", []) or [])
        ordered = sorted((n for n in names if n), key=len, reverse=True)  # the longest match first
        self.specials = re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None
        self.exact = self.specials is not None and self._pieces_are_exact(ordered[0])

    def __call__(self, messages: list[dict[str, Any]]) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise FieldError("messages", "messages: this model has no chat template; use /v1/completions")
        found = [] if self.parse_specials or self.specials is None else self._with_specials(messages)
        if not found:
            return self._template(messages, tokenize=True)
        if not self.exact:
            i, name = found[0]
            raise FieldError(
                f"messages.{i}.content",
                f"messages.{i}.content: holds {name!r}, a special token of this model, which this server"
                " keeps as text and cannot tokenize as text exactly for this tokenizer",
            )
        return self._as_text(messages)

    def _with_specials(self, messages: list[dict[str, Any]]) -> list[tuple[int, str]]:
        assert self.specials is not None
        found = []
        for i, m in enumerate(messages):
            hit = self.specials.search(m["content"])
            if hit is not None:
                found.append((i, hit.group(0)))
        return found

    def _template(self, messages: list[dict[str, Any]], tokenize: bool) -> Any:
        out = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=tokenize)
        if not tokenize:
            return str(out)
        return list(out if isinstance(out, list) else out["input_ids"])

    def _ids(self, text: str) -> list[int]:
        """``text`` as text: special-token spellings in it stay plain tokens."""
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def _as_text(self, messages: list[dict[str, Any]]) -> list[int]:
        assert self.specials is not None
        everything = "".join(m["content"] for m in messages)
        free = (chr(c) for c in _PRIVATE if chr(c) not in everything)
        hold: dict[str, str] = {}  # special token's text -> its stand-in
        for name in dict.fromkeys(self.specials.findall(everything)):
            hold[name] = next(free)
        masked = [
            {**m, "content": self.specials.sub(lambda h: hold[h.group(0)], m["content"])} for m in messages
        ]
        back = {v: k for k, v in hold.items()}
        stand_ins = re.compile("[" + "".join(back) + "]")
        ids: list[int] = []
        for i, piece in enumerate(self.specials.split(self._template(masked, tokenize=False))):
            if i % 2:  # a special token: the template's own
                ids.append(int(self.tokenizer.convert_tokens_to_ids(piece)))
            elif piece:
                ids += self._ids(stand_ins.sub(lambda h: back[h.group(0)], piece))
        return ids

    def _pieces_are_exact(self, special: str) -> bool:
        """Whether text tokenizes the same alone as after a special token (how :meth:`_as_text` cuts)."""
        text = f"a b{special} c\nd "
        try:
            whole = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            before, after = text.split(special)
            pieces = [*self._ids(before), self.tokenizer.convert_tokens_to_ids(special), *self._ids(after)]
        except Exception:  # a tokenizer that cannot say: refuse rather than guess
            return False
        return whole == pieces


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def model_card(name: str, version: str, created: int) -> dict[str, Any]:
    """One entry of ``/v1/models`` (``created``: when this server started serving it)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "modeldeploy", "version": version}


def usage_chunk(rid: str, model: str, kind: str, use: dict[str, int]) -> dict[str, Any]:
    """The usage event at the end of a stream (``stream_options.include_usage``): no choices."""
    created = int(time.time())
    return {"id": rid, "object": kind, "created": created, "model": model, "choices": [], "usage": use}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    rid: str, model: str, text: str, reason: str | None, use: dict[str, int] | None
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": reason, "logprobs": None}],
    }
    if use is not None:
        doc["usage"] = use
    return doc


def chat(rid: str, model: str, text: str, reason: str | None, use: dict[str, int] | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": reason}],
    }
    if use is not None:
        doc["usage"] = use
    return doc


def chat_chunk(rid: str, model: str, delta: dict[str, str], reason: str | None) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": reason}],
    }
