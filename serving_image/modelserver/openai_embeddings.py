"""OpenAI-compatible ``POST /v1/embeddings`` for embedding models (pure: the request and the answer).

The request is the one OpenAI's clients send: ``model``, ``input`` (a string or a list of strings),
``encoding_format`` (``float``, the default, or ``base64``: the little-endian float32 bytes), ``user``.
Token-id inputs and ``dimensions`` (shortened embeddings) are not supported and are refused with 400 naming
the field, as is any other field: an ignored field would change the answer without telling the user.

The texts go through the same queue, batching, priorities and limits as an OIP v2 infer request of the
model's ``text`` input (so ``maxBatchSize``, ``maxQueueSize``, the sequence-length limit and 429/503 with
``Retry-After`` hold for both); the answer's ``usage`` counts the tokens the model saw.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidInput
from .gen_openai import FieldError


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    input: str | list[str] = Field(description="a text, or a list of texts (not token ids)")
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None

    def texts(self) -> list[str]:
        texts = [self.input] if isinstance(self.input, str) else list(self.input)
        if not texts:
            raise InvalidInput("input: at least one text")
        if any(not t for t in texts):
            raise InvalidInput("input: the texts must not be empty")
        return texts


def parse(doc: Any) -> EmbeddingRequest:
    """The request, or :class:`~modelserver.gen_openai.FieldError` naming each bad field (``field: message``;
    ``param``: the first)."""
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object")
    try:
        return EmbeddingRequest.model_validate(doc)
    except ValidationError as e:
        parts, first = [], None
        for err in e.errors(include_url=False):
            loc = ".".join(str(p) for p in err["loc"][:1])  # the field, not pydantic's union branches
            msg = "not a supported field" if err["type"] == "extra_forbidden" else err["msg"]
            if loc == "input":
                msg = "a string or a list of strings (token ids are not supported)"
            parts.append(f"{loc}: {msg}")
            first = first or loc or None
        raise FieldError(first, "; ".join(dict.fromkeys(parts))) from None


def answer(model: str, vectors: np.ndarray, encoding: str, prompt_tokens: int) -> dict[str, Any]:
    """The OpenAI ``list`` of ``embedding`` objects, one per input, in order."""
    rows = np.asarray(vectors, dtype=np.float32)
    data = []
    for i, row in enumerate(rows):
        value: Any = (
            base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
            if encoding == "base64"
            else row.tolist()
        )
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
