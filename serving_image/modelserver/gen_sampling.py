"""Next tokens of a batch of sequences, each row with its own sampling (modelserver.gen_own_engine).

Greedy rows take the highest logit (``argmax``, as ``generate(do_sample=False)``); sampled rows divide by
their temperature, keep their top-k and top-p (nucleus) and draw from their own ``torch.Generator`` -- a
request's ``seed`` makes its sampled answer reproducible whatever else runs beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """One sequence's sampling: ``greedy``, else temperature / top-k (0: off) / top-p and a generator."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    @classmethod
    def of(cls, greedy: bool, temperature: float, top_k: int, top_p: float, seed: int | None) -> RowSampling:
        if greedy:
            return cls()
        gen = torch.Generator()
        if seed is None:
            gen.seed()  # a fresh random state
        else:
            gen.manual_seed(seed)
        return cls(False, float(temperature), int(top_k), float(top_p), gen)


def filtered(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``logits`` (1-D) with what top-k and top-p leave out set to -inf (pure)."""
    out = logits
    if 0 < top_k < out.shape[-1]:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        ordered, idx = torch.sort(out, descending=True)
        cum = torch.softmax(ordered, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(ordered, dim=-1) >= top_p  # keep the smallest set reaching top_p
        out = out.scatter(-1, idx, ordered.masked_fill(drop, float("-inf")))
    return out


def next_tokens(logits: torch.Tensor, rows: list[RowSampling]) -> list[int]:
    """One token per row of ``logits`` ``[B, vocab]``."""
    chosen = logits.argmax(dim=-1)
    for i, r in enumerate(rows):
        if r.greedy:
            continue
        row = filtered(logits[i].float() / max(r.temperature, 1e-5), r.top_k, r.top_p)
        probs = torch.softmax(row, dim=-1)
        chosen[i] = torch.multinomial(probs, 1, generator=r.generator)[0]
    return [int(t) for t in chosen.tolist()]
