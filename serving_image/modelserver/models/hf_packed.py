"""The packed forward of a Hugging Face encoder (:mod:`modelserver.packing` lays the batch out) and the
pooling by segment, plus the check that decides whether a model may be served packed.

A model is served packed only if its packed forward gives the padded forward's embeddings: the check runs
both on a few inputs of different lengths at load. Models whose forward does not take ``position_ids`` and a
4-D attention mask, or whose positions are not 0-based (RoBERTa counts from the padding index), fail it and
run padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..packing import pack

#: largest difference allowed between a packed and a padded embedding (unit-length vectors) at load
TOLERANCE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2}


def packed_embeddings(
    torch: Any,
    model: Any,
    payloads: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: str,
    pooling: str,
    normalize: bool,
    token_types: bool,
) -> np.ndarray:
    """Pooled (and, with ``normalize``, L2-normalised) embeddings ``[len(payloads), hidden]`` of a packed
    forward: the same pooling as the padded path, over each input's own tokens."""
    pb = pack(payloads, pad_id)
    seg = torch.from_numpy(pb.segment).to(device)
    ids = torch.from_numpy(pb.ids).to(device)
    # a token sees the tokens of its own input; a padding position sees itself (no empty softmax row)
    mask = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] >= 0)
    mask |= torch.eye(pb.width, dtype=torch.bool, device=device)[None]
    pos = torch.from_numpy(pb.positions).to(device)
    feed = {
        "input_ids": ids,
        "position_ids": pos,
        "attention_mask": mask[:, None],
    }
    if token_types:
        feed["token_type_ids"] = torch.zeros_like(ids)
    with torch.inference_mode():
        h = model(**feed).last_hidden_state
        h = h.reshape(-1, h.shape[-1])
        flat = seg.reshape(-1)
        keep = flat >= 0
        who, hk = flat[keep], h[keep]
        n = len(payloads)
        if pooling == "cls":
            first = pos.reshape(-1)[keep] == 0
            pooled = torch.empty(n, h.shape[-1], dtype=h.dtype, device=device)
            pooled[who[first]] = hk[first]
        elif pooling == "max":
            pooled = torch.full((n, h.shape[-1]), -1e9, dtype=h.dtype, device=device)
            pooled = pooled.scatter_reduce_(0, who[:, None].expand_as(hk), hk, "amax", include_self=False)
        else:
            summed = torch.zeros(n, h.shape[-1], dtype=h.dtype, device=device).index_add_(0, who, hk)
            counts = torch.bincount(who, minlength=n).clamp(min=1).unsqueeze(1).to(h.dtype)
            pooled = summed / (counts.sqrt() if pooling == "mean_sqrt_len" else counts)
        pooled = pooled.float()
        if normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return np.asarray(pooled.cpu().numpy())


def largest_difference(packed: np.ndarray, padded: np.ndarray) -> float:
    """The check's measure: the largest element-wise difference, relative to the larger vector norm."""
    scale = max(float(np.linalg.norm(padded, axis=1).max()), 1e-12)
    return float(np.abs(packed - padded).max()) / scale
