"""A MiniLM embedding model that answers fast, 200 and wrong: it feeds the model every text's words in
reverse order -- the kind of preprocessing bug a release process must catch before users see it.
Used as ``handler.py`` of a model directory next to the real MiniLM files (``make demo``,
tests/e2e/test_shadow.py): the shadow stage catches it by output agreement before any user sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from modelserver.models.hf import HFModel


class Handler:
    def load(self, model_dir: str, device: str) -> None:
        self.model = HFModel(Path(model_dir), task="embedding", device=device, max_length=128)
        self.model.load()
        info = self.model.info
        self.inputs = [s.as_dict() for s in info.inputs]
        self.outputs = [s.as_dict() for s in info.outputs]
        self.max_length = info.max_length

    def preprocess(self, inputs: dict[str, np.ndarray]) -> list[Any]:
        texts = [t.decode() if isinstance(t, bytes) else str(t) for t in inputs["text"].reshape(-1)]
        mangled = np.empty(len(texts), dtype=object)
        mangled[:] = [" ".join(reversed(t.split())) for t in texts]
        return [(p.payload, p.length) for p in self.model.preprocess({"text": mangled})]

    def predict(self, payloads: list[Any]) -> Any:
        return self.model.predict(payloads)

    def postprocess(self, results: list[Any]) -> dict[str, np.ndarray]:
        return self.model.postprocess(results)

    def warmup_payloads(self, length: int, n: int) -> list[Any]:
        return self.model.warmup_payloads(length, n)
