"""Sequence packing for encoder batches: several inputs share one row of the forward pass.

A padded batch of ``n`` inputs runs ``n x L`` positions (``L`` the longest input) through every layer; short
texts of mixed lengths waste a third or more of them on padding. Packed, the inputs are laid end to end in
rows of ``width = max(longest, min_width)`` positions (first-fit decreasing), each token keeps its position
within its own input, and the attention mask lets a token see only the tokens of its own input. The linear
layers -- most of an encoder's time -- then run about as many positions as there are real tokens, and the
attention runs rows no wider than the padded batch's. Text-embeddings-inference and Hugging Face's
padding-free collator do the same on GPUs with variable-length attention kernels; on the CPU a block-diagonal
mask over short rows does it with the model's own forward (docs/server.md, "Sequence packing").

Pure functions (numpy): :func:`assign_rows` decides which input goes to which row, :func:`pack` builds the
arrays the model is fed. The torch forward and the pooling by segment live in
:mod:`modelserver.models.hf_packed`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: the narrowest row: below it, the rows are too short to hold more than one input, and a wider row's
#: attention is cheap next to its linear layers (MiniLM, short texts, measured in bench/results/serving.md)
PACK_MIN_WIDTH = 32


@dataclass(frozen=True)
class PackedBatch:
    """A batch laid out in rows: ``ids``, ``positions`` (each token's position within its own input, 0 on
    padding) and ``segment`` (the index of the input each token belongs to, -1 on padding), all
    ``[rows, width]``."""

    ids: np.ndarray
    positions: np.ndarray
    segment: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.ids.shape[0])

    @property
    def width(self) -> int:
        return int(self.ids.shape[1])


def row_width(lengths: Sequence[int], min_width: int = PACK_MIN_WIDTH) -> int:
    """The rows' width: the longest input, at least ``min_width``."""
    return max(max(lengths), min_width)


def assign_rows(lengths: Sequence[int], width: int) -> list[list[int]]:
    """First-fit decreasing: the inputs (by index), longest first, each into the first row with room left.
    Never more rows than inputs; every input in exactly one row; no row longer than ``width``."""
    if any(n > width for n in lengths):
        raise ValueError(f"an input of {max(lengths)} tokens does not fit a row of {width}")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        for r, left in enumerate(room):
            if n <= left:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(width - n)
    return rows


@functools.lru_cache(maxsize=64)
def positions(lengths: tuple[int, ...], min_width: int = PACK_MIN_WIDTH) -> int:
    """The positions a packed batch of ``lengths`` runs: its rows x the fullest row's length. Cached: the
    batching core asks it of one batch up to four times, on the event loop (the late-item check, the
    worker's prediction, the cost record, the padding metric)."""
    rows = assign_rows(lengths, row_width(lengths, min_width))
    return len(rows) * max(sum(lengths[i] for i in row) for row in rows)


def pack(payloads: Sequence[Sequence[int]], pad_id: int, min_width: int = PACK_MIN_WIDTH) -> PackedBatch:
    """The batch of token-id lists ``payloads`` packed into rows (see the module's docstring)."""
    lengths = [len(p) for p in payloads]
    if not lengths or min(lengths) < 1:
        raise ValueError("packing needs at least one input and no empty input")
    rows = assign_rows(lengths, row_width(lengths, min_width))
    used = max(sum(lengths[i] for i in row) for row in rows)  # no row is padded beyond the fullest
    ids = np.full((len(rows), used), pad_id, dtype=np.int64)
    positions = np.zeros((len(rows), used), dtype=np.int64)
    segment = np.full((len(rows), used), -1, dtype=np.int64)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            ids[r, at : at + n] = payloads[i]
            positions[r, at : at + n] = np.arange(n)
            segment[r, at : at + n] = i
            at += n
    return PackedBatch(ids=ids, positions=positions, segment=segment)
