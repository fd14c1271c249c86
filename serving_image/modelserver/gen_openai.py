"""The OpenAI-compatible generation API's requests and answers (pure: no I/O, no model).

``POST /v1/completions`` and ``POST /v1/chat/completions`` take the fields users already send:
``max_tokens`` (chat: or ``max_completion_tokens``), ``temperature`` (0 = greedy), ``top_p``, ``top_k``,
``stop`` (up to 4 strings), ``seed``, ``stream`` (server-sent events, ``stream_options.include_usage``),
``n`` (1 only). Any other field is refused with 400 naming it (a field we would silently ignore --
``logprobs``, ``presence_penalty`` -- would change what the user gets without telling them).

This server's own fields: ``priority`` (1 is the highest, 0 the server's default; the encoders'
``parameters.priority``) and ``timeout_ms`` (how long the request may wait for a place in the engine:
504 past it; a stream that has started is never cut by it). modelserver.gen_schedule says what they do.

``seed``: with the own engine (``--engine own``) a sampled answer (``temperature`` > 0) is drawn from its
own generator seeded with it, so the same seed gives the same answer; transformers' manager seeds one
generator for all sequences, so there the engine refuses it (400, modelserver.gen_engine). With
``temperature`` 0 (greedy, always reproducible) it is accepted and changes nothing.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import InvalidInput
from .gen_engine import Sampling

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


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
    # this server's own (the encoder parameters' names and meaning, not vLLM's "lower runs first")
    priority: int = Field(0, ge=0, description="1 is the highest; 0: the server's default")
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
        return Sampling(max_tokens, self.temperature, self.top_p, top_k, greedy=greedy, seed=self.seed)


class CompletionRequest(_Common):
    prompt: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    @property
    def wanted_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse(kind: type[_Common], doc: Any) -> Any:
    """The request, or :class:`InvalidInput` naming each bad field (``field: message``)."""
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object")
    try:
        return kind.model_validate(doc)
    except ValidationError as e:
        parts = []
        for err in e.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "not a supported field"
            parts.append(f"{loc}: {msg}" if loc else msg)
        raise InvalidInput("; ".join(parts)) from None


class TextAssembler:
    """Turns a growing token list into text to send: whole characters only (a byte-level BPE token can end
    inside a UTF-8 sequence), held back while it could be the start of a stop string, cut at a stop."""

    def __init__(self, decode: Any, stops: list[str]) -> None:
        self.decode = decode
        self.stops = stops
        self.tokens: list[int] = []
        self.sent = ""
        self.stopped = False

    def feed(self, new: list[int], final: bool = False) -> str:
        self.tokens += new
        text = self.decode(self.tokens)
        for s in self.stops:
            i = text.find(s)
            if i >= 0:
                text, self.stopped, final = text[:i], True, True
        if not final:
            if text.endswith("\ufffd"):
                text = text.rstrip("\ufffd")
            hold = max((len(s) - 1 for s in self.stops), default=0)
            for k in range(min(hold, len(text)), 0, -1):
                if any(s.startswith(text[-k:]) for s in self.stops):
                    text = text[:-k]
                    break
        out = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += out
        return out


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


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
