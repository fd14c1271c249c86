"""A built-in model without weights or torch: for overhead benchmarks, smoke tests and cluster tests.

URI ``noop://[anything][?options]`` (or ``--model-format noop``). Input ``text`` (BYTES, [-1]); outputs
``echo`` (BYTES, the text back) and ``length`` (INT64, the number of whitespace-separated words + 2, which
is also the item's length for batching; longer than ``--max-sequence-length`` (default 512) -> 413).

Options (query string), all deterministic:

* ``delay_ms``: sleep per batch; ``item_ms``: extra sleep per item; ``token_us``: sleep per padded token
  (simulates a model whose cost grows with batch size x padded length).
* ``fail_rate``: fraction (0..1) of *inputs* that fail with a model error (500); which ones is decided by
  a hash of the text, so the same text always fails or always succeeds. ``fail_text``: inputs containing
  this substring fail.
* ``oom_tokens``: a batch with more padded tokens than this raises an out-of-memory error (the server then
  splits it).
* ``skew``: added to every ``length`` output: a model that answers fast, 200, and wrong (the shadow
  stage's negative control).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from ..batching import InputTooLong
from ..errors import ModelLoadError
from .base import ModelInfo, Prepared, ServedModel, TensorSpec, batch_size_of, texts_of


class NoopModel(ServedModel):
    def __init__(self, uri: str = "noop://", max_length: int = 0) -> None:
        q = parse_qs(urlsplit(uri).query) if uri else {}

        def num(name: str, default: float) -> float:
            try:
                return float(q[name][0]) if name in q else default
            except ValueError as e:
                raise ModelLoadError(f"noop model option {name}: not a number") from e

        self.delay_s = num("delay_ms", 0.0) / 1000.0
        self.item_s = num("item_ms", 0.0) / 1000.0
        self.token_s = num("token_us", 0.0) / 1e6
        self.fail_rate = num("fail_rate", 0.0)
        self.oom_tokens = int(num("oom_tokens", 0))
        self.skew = int(num("skew", 0))
        self.fail_text = q.get("fail_text", [""])[0]
        self.max_length = max_length or 512

    def load(self) -> None:
        self.info = ModelInfo(
            platform="modelserver_noop",
            inputs=[TensorSpec("text", "BYTES", [-1])],
            outputs=[TensorSpec("echo", "BYTES", [-1]), TensorSpec("length", "INT64", [-1])],
            max_length=self.max_length,
        )

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[Prepared]:
        batch_size_of(inputs, self.info.inputs)
        texts = texts_of(inputs["text"], "text")
        out = []
        for i, t in enumerate(texts):
            n = len(t.split()) + 2
            if n > self.max_length:
                raise InputTooLong(
                    f"input {i} has {n} tokens, more than the maximum sequence length {self.max_length}"
                )
            out.append(Prepared(payload=t, length=n, cache_key=t))
        return out

    def _fails(self, text: str) -> bool:
        if self.fail_text and self.fail_text in text:
            return True
        return self.fail_rate > 0 and (zlib.crc32(text.encode()) % 10000) < self.fail_rate * 10000

    def predict(self, payloads: list[Any]) -> Sequence[dict[str, Any]]:
        lengths = [min(len(t.split()) + 2, self.max_length) for t in payloads]
        padded = max(lengths) * len(payloads)
        if self.oom_tokens and padded > self.oom_tokens and len(payloads) > 1:
            raise MemoryError(f"simulated out of memory at {padded} padded tokens")
        sleep = self.delay_s + self.item_s * len(payloads) + self.token_s * padded
        if sleep > 0:
            time.sleep(sleep)
        if any(self._fails(t) for t in payloads):
            raise RuntimeError("simulated model failure")
        return [
            {"echo": t, "length": np.int64(n + self.skew)} for t, n in zip(payloads, lengths, strict=True)
        ]

    def postprocess(self, results: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
        return {
            "echo": np.array([r["echo"] for r in results], dtype=object),
            "length": np.array([r["length"] for r in results], dtype=np.int64),
        }

    def warmup_payloads(self, length: int, n: int) -> list[Any]:
        return [" ".join(["w"] * max(0, length - 2))] * n
