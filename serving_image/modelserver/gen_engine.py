"""The continuous-batching engine for text generation, driven from the event loop, with this server's
admission in front of it. Two loops run the model (``--engine``): this server's own
(modelserver.gen_own_engine: a slot-based KV cache, one batched decode forward per step plus prefill
chunks within the step's token budget, a generator per sampled sequence) or transformers'
``ContinuousBatchingManager`` (a paged KV cache; the same scheduling). Both are driven through the
manager's methods (``add_request``, ``register_result_handler``, ``cancel_request``); the figures of both,
side by side, are in docs/server.md (``make bench-generate``). What the loops lack, this module adds:

* **Bounds before admission.** A request whose prompt plus ``max_tokens`` does not fit the context or the
  KV cache would stop the manager's loop for every request ("no requests can be scheduled"); it is
  refused here with the limit named (:class:`~modelserver.errors.InvalidInput`, 400). Past
  ``max_waiting`` sequences not yet started, a request gets :class:`GenerationQueueFull` (429 with
  ``Retry-After``).
* **A freed slot on disconnect.** Leaving :meth:`GenerationEngine.stream` before the end (the client went
  away, a stop string was found) cancels the request in the loop, which frees its slot or cache blocks.
* **Per-request sampling**: temperature, top-p, top-k (the own engine per row, the manager through its
  per-request processors).
  Greedy decoding is top-k 1 (the highest logit, deterministic), so greedy and sampled requests share one
  batch. The own engine draws each sampled sequence from its own generator, seeded by the request's
  ``seed``; the manager seeds one generator for all requests, so with it a ``seed`` for a sampled request
  is refused (greedy needs none).
* **Counts** for the metrics: waiting (admitted, no token yet) and running sequences, KV cache use.
* **Every stream ends**, and frees its place in the gate and its count: with its answer, with the error
  output the loop sends for a sequence that failed, or -- when the loop stopped without one (its thread
  died) -- with :class:`GenerationUnavailable` within :data:`LIVENESS_S`.
* **A reader that does not read holds one output**, not one per step: outputs are cumulative (each carries
  all the attempt's tokens, in both loops), so a stream keeps only the latest (:class:`_Latest`); queueing
  each would hold the square of the answer's length (~67 MB for a 4k-token answer of a stalled client).

* **Priorities, deadlines and preemption by recompute** (modelserver.gen_schedule): both loops schedule
  first-come first-served, so this engine hands them at most ``max_running`` sequences at a time, chosen
  by a :class:`~modelserver.gen_schedule.Gate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput, ServerError
from .gen_schedule import Gate, Seat

log = logging.getLogger("modelserver.generation")


class GenerationQueueFull(ServerError):
    """Too many sequences wait for the engine: 429 with Retry-After."""

    status = 429
    reason = "queue_full"

    def __init__(self, waiting: int) -> None:
        super().__init__(f"{waiting} sequences are waiting for the generation engine; retry later", 1.0)


class GenerationUnavailable(ServerError):
    """The engine's loop is not running (it stopped, or the server drains): 503."""

    status = 503
    reason = "unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, 5.0)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, from the settings and the model's config."""

    context: int  # prompt + generated tokens, at most (the model's positions, and the KV cache)
    max_tokens: int  # generated tokens per request, at most
    max_waiting: int  # sequences admitted and not yet started, at most
    max_running: int = 32  # sequences the loop runs at once (the gate's places)
    priority_levels: int = 3  # priorities 1 (the highest) .. this, as the encoder queue's
    default_priority: int = 2  # of requests that do not set one
    max_timeout_s: float = 60.0  # a request's timeout_ms, capped


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    greedy: bool = False
    seed: int | None = None  # a sampled answer's own generator (the own engine only)
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens past EOS (fixed-length benchmarks)

    def processor_kwargs(self) -> dict[str, Any]:
        """The manager's per-request processor arguments (exact types: it refuses an int temperature)."""
        if self.greedy:
            return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
        return {"temperature": float(self.temperature), "top_k": int(self.top_k), "top_p": float(self.top_p)}


@dataclass
class Step:
    """New tokens of one sequence; ``finished`` on its last step (``reason``: ``stop`` at EOS, else
    ``length``)."""

    tokens: list[int]
    finished: bool = False
    reason: str | None = None


def schedule_of(limits: Limits, priority: int, timeout_ms: float | None) -> tuple[int, float | None]:
    """(priority, seconds to wait for a place) of a request's ``priority`` (0: the default) and
    ``timeout_ms`` (capped), or :class:`InvalidInput` naming the field (pure)."""
    p = priority or limits.default_priority
    if not 1 <= p <= limits.priority_levels:
        raise InvalidInput(f"priority: 1 (the highest) .. {limits.priority_levels}, or 0 for the default")
    timeout = None if timeout_ms is None else min(timeout_ms / 1000.0, limits.max_timeout_s)
    return p, timeout


def check(limits: Limits, prompt_tokens: int, max_tokens: int) -> None:
    """Refuse, naming the limit, what could not be served (pure)."""
    if prompt_tokens == 0:
        raise InvalidInput("the prompt is empty")
    if max_tokens < 1:
        raise InvalidInput("max_tokens must be at least 1")
    if max_tokens > limits.max_tokens:
        raise InvalidInput(f"max_tokens {max_tokens} is over this server's limit of {limits.max_tokens}")
    if prompt_tokens + max_tokens > limits.context:
        raise InvalidInput(
            f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is over the context of"
            f" {limits.context} tokens"
        )


#: the EOS id of a request that ignores EOS: one no token has (transformers' manager reads a negative id as
#: "no EOS"; so does modelserver.gen_own_engine). None would not do: the manager takes its default for it
NO_EOS = -1

#: seconds a stream waits for an output before it checks that the loop still runs
LIVENESS_S = 1.0


class _Latest:
    """A stream's latest output from the loop (outputs are cumulative: the latest has every token of the
    earlier ones) and whether its seat was asked to yield (modelserver.gen_schedule)."""

    def __init__(self) -> None:
        self.output: Any = None
        self.preempted = False
        self.ready = asyncio.Event()

    def put(self, output: Any) -> None:
        self.output = output
        self.ready.set()

    def preempt(self) -> None:
        self.preempted = True
        self.ready.set()


class GenerationEngine:
    """One ``ContinuousBatchingManager`` for one model; :meth:`stream` per request, on the event loop.
    A :class:`~modelserver.gen_schedule.Gate` of ``limits.max_running`` places decides which sequences the
    manager runs (priorities, deadlines, preemption by recompute)."""

    def __init__(
        self, manager: Any, limits: Limits, eos_token_id: int | list[int] | None, aging_s: float = 0.1
    ) -> None:
        self.manager = manager
        self.limits = limits
        self.eos_token_id = eos_token_id
        self.gate = Gate(limits.max_running, aging_s)
        self.waiting = 0
        self.running = 0
        self._ids = itertools.count()

    @property
    def seeds_per_request(self) -> bool:
        """Whether the engine gives each sampled sequence its own generator (modelserver.gen_own_engine)."""
        return bool(getattr(self.manager, "seeds_per_request", False))

    def kv_cache_usage(self) -> float | None:
        """Share of the KV cache in use: the own engine's slots, the manager's blocks (None when the
        manager does not tell)."""
        own = getattr(self.manager, "kv_cache_usage", None)
        if own is not None:
            return float(own())
        with contextlib.suppress(AttributeError, TypeError, ZeroDivisionError):
            cache = self.manager.batch_processor.cache
            pool = cache.pool
            total = pool.num_sectors if hasattr(pool, "num_sectors") else cache.num_blocks
            return 1.0 - pool.num_free_sectors / total
        return None

    def admit(self, prompt_tokens: int, sampling: Sampling) -> None:
        check(self.limits, prompt_tokens, sampling.max_tokens)
        if sampling.seed is not None and not sampling.greedy and not self.seeds_per_request:
            raise InvalidInput(
                "seed: a per-request seed for a sampled answer (temperature > 0) needs --engine own (this"
                " server runs transformers' manager, one generator for all sequences); use temperature 0"
            )
        if not self.manager.is_running():
            raise GenerationUnavailable("the generation engine is not running")
        if self.waiting >= self.limits.max_waiting:
            raise GenerationQueueFull(self.waiting)

    async def stream(
        self, prompt: list[int], sampling: Sampling, priority: int = 1, timeout_s: float | None = None
    ) -> AsyncGenerator[Step, None]:
        """The new tokens of ``prompt``'s answer, step by step. Leaving early cancels the sequence.
        ``priority`` 1 is the highest; ``timeout_s`` bounds the wait for a place (504), not the answer."""
        self.admit(len(prompt), sampling)
        seat = self.gate.seat(priority, timeout_s)
        self.waiting += 1
        started = False
        generated: list[int] = []
        try:
            await self.gate.enter(seat)
            while True:
                attempt = self._attempt(seat, prompt + generated, sampling, len(generated))
                async with contextlib.aclosing(attempt):  # an early end cancels the sequence at once
                    async for new, finished in attempt:
                        if not started and (new or finished):
                            started = True
                            self.waiting -= 1
                            self.running += 1
                        generated += new
                        if new or finished:
                            reason = None
                            if finished:
                                reason = "length" if len(generated) >= sampling.max_tokens else "stop"
                            yield Step(new, finished, reason)
                        if finished:
                            return
                await self.gate.yield_place(seat)  # preempted: wait for a place again, then go on
        finally:
            self.gate.leave(seat)
            if started:
                self.running -= 1
            else:
                self.waiting -= 1

    async def _attempt(
        self, seat: Seat, tokens: list[int], sampling: Sampling, done: int
    ) -> AsyncGenerator[tuple[list[int], bool], None]:
        """One run of the sequence in the manager, from ``tokens`` (the prompt and the ``done`` tokens
        already sent): (new tokens, finished) until it finishes or its seat is asked to yield."""
        if seat.asked_to_yield:  # chosen as a victim between its admission and this attempt
            return
        rid = f"g{next(self._ids)}"
        latest = _Latest()
        self.manager.register_result_handler(rid, latest.put)
        seat.on_preempt = latest.preempt
        finished = False
        sent = 0
        extra = sampling.processor_kwargs()
        if sampling.seed is not None and not sampling.greedy:
            extra["seed"] = sampling.seed  # a preempted sequence resumes from the seed's first draw
        try:
            added = self.manager.add_request(
                tokens,
                request_id=rid,
                max_new_tokens=sampling.max_tokens - done,
                streaming=True,
                eos_token_id=NO_EOS if sampling.ignore_eos else self.eos_token_id,
                **extra,
            )
            if added is None:
                raise GenerationUnavailable("the generation engine refused the request (its loop stopped)")
            while not finished:
                await self._next(latest)
                latest.ready.clear()
                out = latest.output
                if out is not None:
                    # a failed output's tokens go out first: a slow reader's latest output can be the
                    # failing one, holding tokens it has not been handed yet
                    finished = out.is_finished() and not out.error
                    if len(out.generated_tokens) > sent or finished:
                        new = list(out.generated_tokens[sent:])
                        sent += len(new)
                        yield new, finished
                    if out.error:
                        raise ServerError(f"generation failed: {out.error}")
                if latest.preempted and not finished:
                    return
        finally:
            seat.on_preempt = None
            if not finished:
                self._cancel(rid)

    async def _next(self, latest: _Latest) -> None:
        """Wait for the stream's next output (or its preemption); :class:`GenerationUnavailable` when the
        loop has stopped without sending one (an output that came meanwhile is read first)."""
        while not latest.ready.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LIVENESS_S):
                    await latest.ready.wait()
            if not latest.ready.is_set() and not self.manager.is_running():
                raise GenerationUnavailable("the generation engine stopped before this answer's end")

    def _cancel(self, rid: str) -> None:
        """Free the sequence's cache blocks; its handler goes too (the manager keeps it otherwise)."""
        with contextlib.suppress(Exception):
            self.manager.cancel_request(rid)
        router = getattr(self.manager, "output_router", None)
        if router is not None:
            with router._lock:
                router.result_handlers.pop(rid, None)


def build_manager(
    model: Any, *, kv_cache_tokens: int, page_size: int, max_batch_tokens: int, max_sequences: int
) -> Any:
    """Start a ``ContinuousBatchingManager`` with a KV cache of ``kv_cache_tokens`` (``page_size`` each
    block) and a per-step budget of ``max_batch_tokens`` (prefill chunks and decode tokens together).
    Always sized explicitly: on CPU the manager would otherwise take 60 % of the machine's memory."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    base = model.generation_config
    # sampling on, with non-neutral values, so that the per-request processors exist (greedy = top-k 1)
    gen = GenerationConfig(
        do_sample=True,
        temperature=0.7,
        top_k=50,
        top_p=0.95,
        eos_token_id=base.eos_token_id,
        pad_token_id=base.pad_token_id if base.pad_token_id is not None else base.eos_token_id,
        bos_token_id=base.bos_token_id,
    )
    cb = ContinuousBatchingConfig(
        page_size=page_size,
        num_blocks=max(1, kv_cache_tokens // page_size),
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_sequences,
        per_request_processors=True,
        auto_switch_to_flash=False,
        use_cuda_graph=False,
        use_async_batching=False,
        scheduler_type="fifo",
        seed=0,
    )
    t0 = time.monotonic()
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    log.info(
        "generation engine started",
        extra={
            "kv_cache_tokens": kv_cache_tokens,
            "max_batch_tokens": max_batch_tokens,
            "s": time.monotonic() - t0,
        },
    )
    return manager
