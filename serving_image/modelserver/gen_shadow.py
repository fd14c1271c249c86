"""The shadow mirror of a generation server: copies of answered *greedy* requests to the shadow revision,
compared by what the two revisions wrote.

Which requests are copied: only those whose own decoding is greedy (``temperature: 0``), and only once
their answer is complete (finished by EOS, a stop string or ``max_tokens``; a stream the client cut is
not copied). A greedy answer is the model's deterministic answer, so this server's answer *is* the
reference and the comparison costs it nothing but the copy; a sampled answer differs between two runs of
the same weights, and forcing greedy on both sides would make the stable compute a second answer for every
copy. (vLLM users get the same choice from ``temperature: 0`` in their evaluation traffic.) The copy is
the same request, with ``stream: false``, the same ``max_tokens`` the stable used (its default filled
in) and the same stop strings.

How two answers are compared (``compare.method``, :class:`~modelserver.compare.CompareSpec`):

* ``exact``: the same text;
* ``tokenAgreement`` (and ``auto``): both texts tokenized with this server's tokenizer, the share of
  positions that hold the same token, up to the shorter answer (two empty answers agree); a copy agrees
  when the share is at least ``minTokenAgreement``. ``modelserver_shadow_similarity`` gets the share.

Everything else -- the shadow file, where copies may go, the bounded queue, the counting in
``modelserver_shadow_requests_total{result}`` -- is :class:`~modelserver.shadow.ShadowMirror`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from .shadow import SHADOW_HEADER, MirrorConfig, ShadowMirror

log = logging.getLogger("modelserver.shadow")

#: request fields a copy does not carry: how the answer is delivered or scheduled, not what it says
_NOT_COPIED = ("stream", "stream_options", "seed", "priority", "timeout_ms", "max_completion_tokens")


def token_agreement(ours: list[int], theirs: list[int]) -> float:
    """The share of positions holding the same token, up to the shorter answer (pure)."""
    n = min(len(ours), len(theirs))
    if n == 0:
        return 1.0 if not ours and not theirs else 0.0
    return sum(1 for a, b in zip(ours, theirs, strict=False) if a == b) / n


def copy_request(doc: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The request a copy sends (pure): the same prompt or messages and stops, greedy, whole, and the
    ``max_tokens`` this server used."""
    out = {k: v for k, v in doc.items() if k not in _NOT_COPIED and v is not None}
    out.update({"temperature": 0.0, "stream": False, "max_tokens": max_tokens})
    return out


def answer_text(doc: Any) -> str:
    """The text of an OpenAI completion or chat completion answer; ValueError if it has none."""
    try:
        choice = doc["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"no answer text in the shadow's response: {type(e).__name__}: {e}") from None
    if not isinstance(text, str):
        raise ValueError("the shadow's answer text is not a string")
    return text


@dataclass(frozen=True)
class AnswerCopy:
    config: MirrorConfig
    path: str  # /v1/completions or /v1/chat/completions
    body: bytes
    request_id: str
    answer: str  # what this server wrote


class GenerationMirror(ShadowMirror):
    """Copies answered greedy generation requests and compares the answers (see the module doc)."""

    def __init__(
        self, model_name: str, metrics: Any, tokenize: Callable[[str], list[int]], **kw: Any
    ) -> None:
        super().__init__(model_name, metrics, **kw)
        self.tokenize = tokenize

    def offer_answer(self, path: str, doc: dict[str, Any], max_tokens: int, answer: str, rid: str) -> None:
        """Maybe copy one complete greedy answer (``sample_rate`` of them); O(1), never raises."""
        config = self.config
        if (
            config is None
            or float(doc.get("temperature", 1.0)) != 0.0
            or self._sample() >= config.sample_rate
        ):
            return
        body = orjson.dumps(copy_request(doc, max_tokens))
        try:
            self._queue.put_nowait(AnswerCopy(config, path, body, rid, answer))
        except asyncio.QueueFull:
            self._metrics_of(config.revision)[0]["dropped"].inc()

    async def send(self, copy: Any) -> str:
        """Send one copy, compare the answers, count; returns the result label."""
        cfg: MirrorConfig = copy.config
        results, similarity, _ = self._metrics_of(cfg.revision)
        headers = {"content-type": "application/json", SHADOW_HEADER: "1", "x-request-id": copy.request_id}
        answer = await self._round_trip(cfg, copy.path, copy.body, headers)
        if isinstance(answer, str):
            return answer
        status, _, content = answer
        try:
            if status != 200:
                raise ValueError(f"the shadow answered {status}")
            theirs = answer_text(orjson.loads(content))
        except (ValueError, orjson.JSONDecodeError) as e:
            log.info("shadow %s: %s", cfg.revision, e)
            results["error"].inc()
            return "error"
        agree, share = self._compare(copy.answer, theirs, cfg)
        similarity.observe(share)
        results["agree" if agree else "disagree"].inc()
        if not agree:
            log.info(
                "shadow disagrees",
                extra={"request_id": copy.request_id, "shadow_revision": cfg.revision, "agreement": share},
            )
        return "agree" if agree else "disagree"

    def _compare(self, ours: str, theirs: str, cfg: MirrorConfig) -> tuple[bool, float]:
        if cfg.compare.method == "exact":
            same = ours == theirs
            return same, 1.0 if same else 0.0
        share = token_agreement(self.tokenize(ours), self.tokenize(theirs))
        return share >= cfg.compare.min_token_agreement, share
