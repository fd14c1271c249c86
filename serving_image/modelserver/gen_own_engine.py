"""This server's own continuous-batching loop (``--engine own``), in place of transformers'
``ContinuousBatchingManager`` and with the same methods modelserver.gen_engine calls on it
(``add_request``, ``register_result_handler``, ``cancel_request``, ``is_running``, ``stop``).

One thread runs the model; each step is **one forward** over

1. the running sequences' last tokens (their decode step; their caches in slots ``0..D-1`` of a
   :class:`~modelserver.gen_slots.SlotCache`, each row at its own position), and
2. newcomers' prompt chunks, in arrival order, laid end to end within what is left of the per-step token
   budget (``max_batch_tokens``): a long prompt is prefilled over several steps, so running streams keep
   getting a token every step, and many short prompts share the forward -- one pass over the weights (at
   one thread a forward costs ~10 ms before its first token; 16 prompt tokens 16 ms, 128 tokens 42 ms).
   The chunks sit in slots ``D, D+1, ...``; a sequence whose prompt is in samples its first token and
   joins the decode rows; only the step's last chunk can be a prompt's part, and it goes on first in the
   next step.

A step with no chunk is a decode forward alone, the rows ``[D, 1]`` (row by row or batched, see
:data:`PER_ROW_MIN_GAIN`).

A finished or cancelled sequence leaves at the end of the step (cancel: at the next step, its slot is free
at once); the last running sequence's cache moves into its slot, so the rows stay compact. Each row
samples with its own settings and generator (modelserver.gen_sampling).

**Every sequence ends with an answer or an error**, and a failure ends only the sequences it must: a row
whose sampling raises ends alone (with an error output, its slot freed); a step that raises (its forward)
ends the sequences in it -- the running rows and the prompt chunks it took from the queue, which then sit
in neither :attr:`OwnEngine.decoding` nor :attr:`OwnEngine.prefilling` -- and the queue runs on. When the
loop stops, whatever it still holds or has queued ends with an error, so no reader waits for an output
that will never come (its place in modelserver.gen_engine's gate and counts are freed by that output).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import gen_slots
from .gen_sampling import RowSampling, next_tokens

log = logging.getLogger("modelserver.generation")


@dataclass
class Output:
    """What a result handler gets (the fields of the manager's ``GenerationOutput`` that are read)."""

    request_id: str
    generated_tokens: list[int]
    finished: bool = False
    error: str | None = None

    def is_finished(self) -> bool:
        return self.finished


@dataclass(eq=False)
class Sequence:
    rid: str
    tokens: list[int]  # the prompt, then each generated token
    prompt_len: int
    max_new: int
    eos: frozenset[int]
    sampling: RowSampling
    cached: int = 0  # positions written in the cache (running: every token but the last)
    sent: int = 0  # generated tokens already handed out
    error: str | None = None  # its sampling raised: it ends with this error at the end of the step
    ended: bool = False  # its last output (an answer or an error) is sent

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def done(self) -> bool:
        new = len(self.tokens) - self.prompt_len
        return self.error is not None or new >= self.max_new or (new > 0 and self.tokens[-1] in self.eos)

    def take(self, token: int | Exception) -> None:
        """The row's sampled token, or the exception its sampling raised (it then ends with an error)."""
        if isinstance(token, Exception):
            self.error = f"{type(token).__name__}: {token}"
        else:
            self.tokens.append(token)


@dataclass
class _Inbox:
    lock: threading.Lock = field(default_factory=threading.Lock)
    added: list[Sequence] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    wake: threading.Event = field(default_factory=threading.Event)
    closed: bool = False  # the loop has ended: nothing more is taken (add_request answers None)


def _eos_set(eos: int | list[int] | None) -> frozenset[int]:
    """The ids that end a sequence; a negative id is none (transformers' manager reads it so too, and
    modelserver.gen_engine passes -1 for a request that ignores EOS)."""
    if eos is None:
        return frozenset()
    return frozenset(t for t in ([eos] if isinstance(eos, int) else eos) if t >= 0)


#: a decode step attends row by row (each row over its own context) when its longest context is more than
#: this many positions over the mean; closer, one batched call over the longest is cheaper. Measured on one
#: thread (the bench model, 32 rows; batched / row by row, ms a step): gap 0 25.0 / 27.9 (contexts 64) and
#: 36.7 / 39.6 (300); gap 33-35 29.0 / 29.8 and 40.2 / 41.0; gap 57-78 32.3 / 30.7 and 43.4 / 42.9; gap
#: 110-126 37.9 / 34.0 and 50.8 / 47.4
PER_ROW_MIN_GAIN = 48


def per_row_contexts(cached: list[int], min_gain: float = PER_ROW_MIN_GAIN) -> list[int] | None:
    """Each row's context length for a decode step (its positions so far and the new one) when attending
    row by row pays -- the longest more than ``min_gain`` over the mean (:data:`PER_ROW_MIN_GAIN`; -1:
    always); None: one batched call over the longest."""
    longest = max(cached)
    if longest - sum(cached) / len(cached) <= min_gain:
        return None
    return [c + 1 for c in cached]


class OwnEngine:
    """Slot-based continuous batching of one causal LM; ``slots`` sequences of up to ``max_len`` tokens."""

    seeds_per_request = True  # a sampled sequence draws from its own generator (modelserver.gen_engine)

    def __init__(
        self,
        model: Any,
        *,
        kv_cache_tokens: int,
        max_batch_tokens: int,
        max_sequences: int,
        max_context: int = 0,
    ) -> None:
        """``max_context`` tokens per slot (0: the cache's tokens / ``max_sequences``); as many slots as the
        cache then holds, at most ``max_sequences``."""
        cfg = model.config
        gen_slots.register()
        self._attn_before = cfg._attn_implementation
        model.set_attn_implementation(gen_slots.ATTN_NAME)  # without slot_cache=True it is sdpa
        self.model = model.eval()
        positions = int(getattr(cfg, "max_position_embeddings", kv_cache_tokens))
        wanted = max_context or kv_cache_tokens // max(1, max_sequences)
        self.max_len = max(1, min(wanted, positions, kv_cache_tokens))
        self.slots = max(1, min(max_sequences, kv_cache_tokens // self.max_len))
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        param = next(model.parameters())
        self.cache = gen_slots.SlotCache(
            cfg.num_hidden_layers, self.slots, self.max_len, kv_heads, head_dim, param.dtype, param.device
        )
        self.device = param.device
        self.max_batch_tokens = max_batch_tokens
        self.per_row_min_gain: float = PER_ROW_MIN_GAIN
        self.decoding: list[Sequence] = []  # row i = slot i
        self.prefilling: Sequence | None = None  # in slot len(decoding)
        self.queue: deque[Sequence] = deque()
        self._stepping: list[Sequence] = []  # the sequences in the current step (what its failure ends)
        self.handlers: dict[str, tuple[Callable[[Any], None], asyncio.AbstractEventLoop]] = {}
        self._inbox = _Inbox()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.steps = 0
        self.forwards = 0  # model forwards (decode and prefill)

    # -- what modelserver.gen_engine calls (the manager's names) ---------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="modeldeploy-generation", daemon=True)
        self._thread.start()

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def stop(self, block: bool = True, timeout: float | None = None) -> None:
        self._stopping = True
        self._inbox.wake.set()
        if block and self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():  # the model is as it was given (another engine may take it)
                self.model.set_attn_implementation(self._attn_before)

    def register_result_handler(self, rid: str, handler: Callable[[Any], None]) -> None:
        """``handler`` gets each :class:`Output` of ``rid`` on the calling event loop."""
        self.handlers[rid] = (handler, asyncio.get_running_loop())

    def add_request(
        self, tokens: list[int], request_id: str, max_new_tokens: int, streaming: bool = True,
        eos_token_id: int | list[int] | None = None, temperature: float = 1.0, top_k: int = 0,
        top_p: float = 1.0, seed: int | None = None,
    ) -> str | None:  # fmt: skip
        if not self.is_running():
            return None
        greedy = top_k == 1 or temperature == 0.0
        sampling = RowSampling.of(greedy, temperature, top_k, top_p, seed)
        seq = Sequence(
            request_id, list(tokens), len(tokens), max_new_tokens, _eos_set(eos_token_id), sampling
        )
        with self._inbox.lock:
            if self._inbox.closed:  # the loop ended since is_running(): nothing would answer it
                return None
            self._inbox.added.append(seq)
        self._inbox.wake.set()
        return request_id

    def cancel_request(self, rid: str) -> None:
        self.handlers.pop(rid, None)
        with self._inbox.lock:
            self._inbox.cancelled.append(rid)
        self._inbox.wake.set()

    def kv_cache_usage(self) -> float:
        """Share of the cache's slots held by a sequence (what admission to the cache sees)."""
        return (len(self.decoding) + (self.prefilling is not None)) / self.slots

    def cached_tokens(self) -> int:
        """Positions written in the cache by the sequences that hold a slot."""
        held = self.decoding + ([self.prefilling] if self.prefilling else [])
        return sum(s.cached for s in held)

    # -- the loop ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._take_inbox()
                if not self.decoding and self.prefilling is None and not self.queue:
                    self._inbox.wake.wait(0.05)
                    self._inbox.wake.clear()
                    continue
                try:
                    with torch.inference_mode():
                        self.step()
                except Exception as e:  # a failed step ends its sequences, the loop goes on
                    log.exception("generation step failed")
                    self._fail_step(f"{type(e).__name__}: {e}")
        finally:
            with self._inbox.lock:
                self._inbox.closed = True
            self._take_inbox()
            self._fail_all("the generation engine stopped")

    def _take_inbox(self) -> None:
        with self._inbox.lock:
            added, self._inbox.added = self._inbox.added, []
            cancelled, self._inbox.cancelled = self._inbox.cancelled, []
        self.queue.extend(added)
        for rid in cancelled:
            self._drop(rid)

    def _drop(self, rid: str) -> None:
        for s in list(self.queue):
            if s.rid == rid:
                self.queue.remove(s)
        if self.prefilling is not None and self.prefilling.rid == rid:
            self.prefilling = None
        for i in reversed(range(len(self.decoding))):
            if self.decoding[i].rid == rid:
                self._free(i)

    def _free(self, i: int) -> None:
        """Row ``i`` leaves: the last row's cache moves into its slot, a prefilling one moves down too."""
        last = len(self.decoding) - 1
        if i != last:
            self.cache.move(last, i, self.decoding[last].cached)
            self.decoding[i] = self.decoding[last]
        self.decoding.pop()
        if self.prefilling is not None:
            self.cache.move(last + 1, last, self.prefilling.cached)

    def _fail_all(self, error: str) -> None:
        """The loop ends: every sequence it holds, runs or has queued ends with ``error``."""
        held = [*self._stepping, *self.decoding, *([self.prefilling] if self.prefilling else []), *self.queue]
        self.decoding, self.prefilling, self._stepping = [], None, []
        self.queue.clear()
        self._fail(held, error)

    def _fail_step(self, error: str) -> None:
        """A step raised: the sequences in it (its running rows, its prompt chunks) end with ``error``; the
        queue is not touched, and a prefilling sequence that was not in the step keeps its cache (moved to
        slot 0, the running rows being gone)."""
        failed = [s for s in self._stepping if not s.ended]
        self._stepping = []
        kept = self.prefilling if self.prefilling is not None and self.prefilling not in failed else None
        if kept is not None and self.decoding:
            try:
                self.cache.move(len(self.decoding), 0, kept.cached)
            except Exception:  # its cache is lost with the step: it ends too
                log.exception("moving a prefilling sequence after a failed step failed")
                failed.append(kept)
                kept = None
        failed += [s for s in self.decoding if s not in failed]
        self.decoding, self.prefilling = [], kept
        self._fail(failed, error)

    def _fail(self, seqs: list[Sequence], error: str) -> None:
        for s in seqs:
            if not s.ended:  # once each (a sequence may be listed twice), never after its answer
                self._send(s, Output(s.rid, s.generated, True, error))

    def step(self) -> None:
        """One forward: the running rows' decode and, within what is left of the step's token budget, as
        many newcomers' prompt chunks as it holds -- or the decode alone when nothing waits."""
        self.steps += 1
        self._stepping = list(self.decoding)
        chunks = self._chunks(self.max_batch_tokens - len(self.decoding))
        self._stepping += [seq for seq, _ in chunks]  # popped from the queue: held by this step alone
        if chunks:
            self._prefill(chunks)
        elif self.decoding:
            self._decode()
        self._finish()
        self._stepping = []

    def _chunks(self, budget: int) -> list[tuple[Sequence, int]]:
        """The step's prefill: the sequence whose prompt is half in first, then newcomers in arrival order
        while a slot is free, each with as much of its prompt as the budget leaves. Only the last can be
        left half in, so the finished ones take slots ``D, D+1, ...`` in order and the half one the next."""
        out: list[tuple[Sequence, int]] = []
        pending = [self.prefilling] if self.prefilling is not None else []
        while budget > 0:
            if pending:
                seq = pending.pop()
            elif self.queue and len(self.decoding) + len(out) < self.slots:
                seq = self.queue.popleft()
            else:
                break
            n = min(budget, len(seq.tokens) - seq.cached)
            out.append((seq, n))
            budget -= n
        return out

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        keep: int | torch.Tensor = 1,
        **slots: Any,
    ) -> torch.Tensor:
        """The logits of the ``keep`` positions; ``slots``: ``slot_rows`` (decode, each row's context) or
        ``slot_segments`` (prefill chunks) for the attention (modelserver.gen_slots)."""
        self.forwards += 1
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=self.cache,
            use_cache=True, logits_to_keep=keep, slot_cache=True, **slots,
        )  # fmt: skip
        return out.logits

    def _decode(self) -> None:
        rows = self.decoding
        ids = torch.tensor([[s.tokens[-1]] for s in rows], device=self.device)
        cached = [s.cached for s in rows]
        pos = torch.tensor(cached, device=self.device)
        rows_ctx = per_row_contexts(cached, self.per_row_min_gain)
        logits = self._forward(ids, pos[:, None], self.cache.for_decode(pos), slot_rows=rows_ctx)[:, -1]
        for s, t in zip(rows, next_tokens(logits, [s.sampling for s in rows]), strict=True):
            s.cached += 1
            s.take(t)

    def _prefill(self, chunks: list[tuple[Sequence, int]]) -> None:
        """One forward over the running rows' last tokens (their decode step) and the chunks, laid end to
        end, each chunk written to its slot (``D``, ``D+1``, ...); a sequence whose prompt is in samples its
        first token and joins the decode rows. One pass over the weights, not two: at one thread a forward
        costs ~10 ms before its first token."""
        rows = list(self.decoding)
        d = len(rows)
        segments = [(d + i, seq.cached, n) for i, (seq, n) in enumerate(chunks)]
        ids = [s.tokens[-1] for s in rows] + [
            t for seq, n in chunks for t in seq.tokens[seq.cached : seq.cached + n]
        ]
        pos = [s.cached for s in rows] + [p for _, a, n in segments for p in range(a, a + n)]
        keep = list(range(d)) + [d + e - 1 for e in itertools.accumulate(n for _, n in chunks)]
        decode_pos = torch.tensor(pos[:d], device=self.device) if d else None
        logits = self._forward(
            torch.tensor([ids], device=self.device), torch.tensor([pos], device=self.device),
            self.cache.for_prefill(segments, decode_pos), torch.tensor(keep, device=self.device),
            slot_segments=[(i, s.cached, 1) for i, s in enumerate(rows)] + segments,
        )[0]  # fmt: skip
        for s, t in zip(rows, next_tokens(logits[:d], [s.sampling for s in rows]), strict=True):
            s.cached += 1
            s.take(t)
        self.prefilling = None
        done: list[tuple[int, Sequence]] = []
        for i, (seq, n) in enumerate(chunks):
            seq.cached += n
            if seq.cached == len(seq.tokens):  # the prompt is in: its first (next) token
                done.append((d + i, seq))
            else:
                self.prefilling = seq  # the last chunk (see _chunks)
        if done:
            at = torch.tensor([i for i, _ in done], device=self.device)
            for (_, seq), t in zip(done, next_tokens(logits[at], [s.sampling for _, s in done]), strict=True):
                seq.take(t)  # one whose sampling raised joins too: _finish ends it and frees its slot
                self.decoding.append(seq)

    def _finish(self) -> None:
        """Hand out the step's tokens; finished rows leave (from the last, so indices hold) before their
        last output is sent: a client that has its answer finds the slot free."""
        outputs: list[tuple[Sequence, Output]] = []
        for i in reversed(range(len(self.decoding))):
            s = self.decoding[i]
            done = s.done() or s.cached >= self.max_len
            if len(s.tokens) - s.prompt_len > s.sent or done:
                s.sent = len(s.tokens) - s.prompt_len
                outputs.append((s, Output(s.rid, s.generated, done, s.error)))
            if done:
                self._free(i)
        for s, out in reversed(outputs):
            self._send(s, out)

    def _send(self, seq: Sequence, out: Output) -> None:
        """Hand ``out`` to the sequence's handler; a finished one is its last (the handler goes)."""
        if out.finished:
            seq.ended = True
            entry = self.handlers.pop(seq.rid, None)
        else:
            entry = self.handlers.get(seq.rid)
        if entry is not None:
            handler, loop = entry
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(handler, out)


def build_own_engine(
    model: Any, *, kv_cache_tokens: int, max_batch_tokens: int, max_sequences: int, max_context: int = 0
) -> OwnEngine:
    engine = OwnEngine(
        model,
        kv_cache_tokens=kv_cache_tokens,
        max_batch_tokens=max_batch_tokens,
        max_sequences=max_sequences,
        max_context=max_context,
    )
    engine.start()
    log.info(
        "own generation engine started",
        extra={"slots": engine.slots, "max_len": engine.max_len, "kv_cache_mb": engine.cache.nbytes / 2**20},
    )
    return engine
