"""Next tokens of a batch of sequences, each row with its own sampling (modelserver.gen_own_engine).

Greedy rows take the highest logit (``argmax``, as ``generate(do_sample=False)``); sampled rows divide by
their temperature, keep their top-k and top-p (nucleus) and draw from their own ``torch.Generator`` -- a
request's ``seed`` makes its sampled answer reproducible whatever else runs beside it.

Whatever a request's settings, a sampled row keeps at least its most likely token (as transformers'
``min_tokens_to_keep=1`` and vLLM): a ``top_p`` that is 0 in float32 (``1e-46`` passes a ``> 0`` check) would
otherwise filter every token out. A row whose distribution is still not one (non-finite logits) takes its
most likely token; and a row whose sampling raises fails alone (:func:`next_tokens`), never its batch.
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
    """``logits`` (1-D) with what top-k and top-p leave out set to -inf; the most likely token always stays
    (pure)."""
    out = logits
    if 0 < top_k < out.shape[-1]:
        kth = torch.topk(out, top_k).values[-1]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p < 1.0:
        ordered, idx = torch.sort(out, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(-1) - probs >= top_p  # keep the smallest set reaching top_p ...
        drop[..., 0] = False  # ... and never less than the first: a top_p that rounds to 0 keeps it
        out = out.scatter(-1, idx, ordered.masked_fill(drop, float("-inf")))
    return out


def sample(logits: torch.Tensor, r: RowSampling) -> int:
    """One token of a sampled row (``logits`` 1-D); its most likely token where its filtered logits make no
    distribution (NaN or infinite logits: ``multinomial`` would raise, or on a GPU assert)."""
    probs = torch.softmax(filtered(logits.float() / max(r.temperature, 1e-5), r.top_k, r.top_p), dim=-1)
    total = float(probs.sum())  # a NaN or inf anywhere makes the sum so: one reduction, no check per token
    if not 0.0 < total < float("inf"):
        return int(logits.argmax())
    return int(torch.multinomial(probs, 1, generator=r.generator)[0])


def next_tokens(logits: torch.Tensor, rows: list[RowSampling]) -> list[int | Exception]:
    """One token per row of ``logits`` ``[B, vocab]``, or the exception that row's sampling raised: a row
    fails alone, its batch goes on (modelserver.gen_own_engine ends only that row's sequence)."""
    chosen: list[int | Exception] = list(logits.argmax(dim=-1).tolist())
    for i, r in enumerate(rows):
        if r.greedy:
            continue
        try:
            chosen[i] = sample(logits[i], r)
        except Exception as e:  # a bad row's settings must not fail the batch's other rows
            chosen[i] = e
    return chosen
