"""The own generation engine's KV cache (modelserver.gen_own_engine): one preallocated tensor per layer for
keys and one for values, ``[slots, kv_heads, max_len, head_dim]``, a sequence in one slot.

Slot-based, not paged: the running sequences are kept compact in slots ``0..D-1`` (a finished one's place
is taken by the last one, its cache moved), so one decode step reads the cache as views
``[:D, :, :L]`` (L: the longest running sequence) with no copy. A paged cache has to gather every running
sequence's blocks into a contiguous tensor per layer and step for attention outside a paged kernel -- on
CPU, transformers' manager flattens the batch into one ragged sequence instead, and its attention then
costs every query against every sequence's keys (measured: 54 % of its step at 32 streams, docs/server.md).
The price of slots: every sequence may be as long as ``max_len`` (the cache's tokens / slots), so the
context is that, not the whole cache.

The model's own forward is used (any Hugging Face decoder whose attention calls ``past_key_values.update``
and the attention interface): :class:`SlotCache` is the ``past_key_values`` -- its ``update`` writes each
row's new keys and values at that row's own position (advanced indexing) and returns the views -- and
:func:`slot_attention` the attention function, registered as ``modeldeploy_slots``: grouped-query
attention without repeating the keys (the query heads of one KV head are folded into the query length).
A decode step whose contexts differ attends **row by row, each row over its own context** (``slot_rows``:
each row's length), with no mask: one batched attention over ``[:D, :, :L]`` costs every row the longest
row's context, and its boolean mask sends it down the slower masked kernel -- measured on one thread, 32
rows of a 4-KV-head model with contexts of mean 215 and longest 768: 3.1 ms per layer batched and masked,
1.2 ms row by row (when row by row pays: modelserver.gen_own_engine.PER_ROW_MIN_GAIN). A prefill forward
carries several prompts' chunks laid end to end (``slot_segments``: each one's slot, start and length),
each attending causally to its own slot. Called without ``slot_cache=True`` it is transformers' sdpa.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

ATTN_NAME = "modeldeploy_slots"


class SlotCache:
    """Keys and values of up to ``slots`` sequences of up to ``max_len`` tokens, per layer."""

    def __init__(
        self, layers: int, slots: int, max_len: int, kv_heads: int, head_dim: int, dtype: Any, device: Any
    ) -> None:
        shape = (slots, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slots, self.max_len = slots, max_len
        self._rows: torch.Tensor | None = None  # decode: the rows 0..D-1 ...
        self._positions: torch.Tensor | None = None  # ... and each row's position
        self._segments: list[tuple[int, int, int]] = []  # prefill: (slot, start, n) of each chunk
        self._view = 0  # decode: the key length the attention sees (0: a prefill forward)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    # -- what the next forward writes ----------------------------------------------------------------
    def for_decode(self, positions: torch.Tensor) -> torch.Tensor:
        """Rows ``0..len(positions)-1`` each write one token at its position; the boolean mask
        ``[D, 1, 1, L]`` (a row sees its own positions up to the new one)."""
        d = int(positions.shape[0])
        self._rows = torch.arange(d, device=positions.device)
        self._positions = positions
        self._view = int(positions.max()) + 1
        seen = torch.arange(self._view, device=positions.device)
        return (seen[None, :] <= positions[:, None]).view(d, 1, 1, self._view)

    def for_prefill(
        self, segments: list[tuple[int, int, int]], decode_positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One forward writes several prompts' chunks, laid end to end: ``segments`` lists each one's
        ``(slot, start, n)`` in that order. With ``decode_positions``, the row starts with one token of each
        running row ``0..D-1`` at its position (their decode step rides along, :func:`slot_attention` gets
        them as segments ``(i, position, 1)`` before the chunks). Returns a 4-D placeholder mask: the
        attention builds each segment's own causal mask, and a 4-D mask keeps transformers from building one
        for the whole row."""
        if decode_positions is not None:
            self._rows = torch.arange(int(decode_positions.shape[0]), device=decode_positions.device)
            self._positions = decode_positions
        else:
            self._rows = self._positions = None
        self._segments = segments
        self._view = 0
        return torch.ones(1, 1, 1, 1, dtype=torch.bool)

    # -- the Cache interface the model calls -----------------------------------------------------------
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self._view:  # decode: key_states [D, kv_heads, 1, head_dim]
            keys[self._rows, :, self._positions] = key_states[:, :, 0]
            values[self._rows, :, self._positions] = value_states[:, :, 0]
            d = key_states.shape[0]
            return keys[:d, :, : self._view], values[:d, :, : self._view]
        off = 0  # prefill: key_states [1, kv_heads, N, head_dim], the decode rows' tokens first
        if self._rows is not None:
            off = int(self._rows.shape[0])
            keys[self._rows, :, self._positions] = key_states[0, :, :off].transpose(0, 1)
            values[self._rows, :, self._positions] = value_states[0, :, :off].transpose(0, 1)
        for s, a, n in self._segments:
            keys[s, :, a : a + n] = key_states[0, :, off : off + n]
            values[s, :, a : a + n] = value_states[0, :, off : off + n]
            off += n
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._view  # decode: the longest row's context; prefill: unused (positions are given)

    # -- slots ------------------------------------------------------------------------------------------
    def move(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions into slot ``dst`` (compaction)."""
        if src == dst or length <= 0:
            return
        for t in self.keys + self.values:
            t[dst, :, :length] = t[src, :, :length]


def slot_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over slot views: query ``[B, H, q, d]``, keys ``[B, kv, L, d]``; returns
    ``[B, q, H, d]``. The ``H / kv`` query heads of a KV head are folded into the query length, so the keys
    are never repeated (transformers' sdpa repeats them per layer when there is a mask)."""
    if not kwargs.pop("slot_cache", False):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    rows: list[int] | None = kwargs.pop("slot_rows", None)
    segments: list[tuple[int, int, int]] | None = kwargs.pop("slot_segments", None)
    if segments is not None:
        return _segments_attention(query, key, value, segments, scaling), None
    b, h, q, d = query.shape
    kv = key.shape[1]
    g = h // kv
    folded = query.reshape(b, kv, g * q, d)
    if rows is not None and q == 1:  # decode: each row over its own context, no mask
        out = torch.cat(
            [
                F.scaled_dot_product_attention(
                    folded[i : i + 1], key[i : i + 1, :, :n], value[i : i + 1, :, :n], scale=scaling
                )
                for i, n in enumerate(rows)
            ]
        )
        return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None
    mask = attention_mask
    if mask is not None and g > 1 and q > 1:
        mask = mask.unsqueeze(2).expand(b, 1, g, q, mask.shape[-1]).reshape(b, 1, g * q, mask.shape[-1])
    out = F.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


def _segments_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    segments: list[tuple[int, int, int]],
    scaling: float | None,
) -> torch.Tensor:
    """Several segments in one row (query ``[1, H, N, d]``, the layer's whole cache as keys): prompt chunks
    and decode rows (segments of one token); each segment's queries attend causally to its own slot's
    positions up to its own; ``[1, N, H, d]``."""
    outs, off = [], 0
    for s, a, n in segments:
        q = query[:, :, off : off + n]
        k, v = key[s : s + 1, :, : a + n], value[s : s + 1, :, : a + n]
        if a == 0:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scaling, enable_gqa=True)
        elif n == 1:  # a decode row: every position up to its own
            out = F.scaled_dot_product_attention(q, k, v, scale=scaling, enable_gqa=True)
        else:
            seen = torch.arange(a + n, device=q.device)
            mask = seen[None, :] <= torch.arange(a, a + n, device=q.device)[:, None]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling, enable_gqa=True)
        outs.append(out)
        off += n
    return torch.cat(outs, dim=2).transpose(1, 2).contiguous()


def register() -> None:
    """Make ``modeldeploy_slots`` an attention implementation (and its masks sdpa's); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTN_NAME, slot_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
