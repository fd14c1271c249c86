"""Which generation sequence runs, which waits and which yields its place: priorities, deadlines and
preemption by recompute in front of transformers' first-come first-served manager.

The manager runs at most ``slots`` sequences (``--max-running-sequences``); a :class:`Gate` decides which
ones. The decisions are pure functions of the seats (:func:`most_urgent`, :func:`victim`); the gate only
carries them out on the event loop.

* **Priorities** as the encoder queue has them (modelserver.batching): 1 is the highest; a waiting seat's
  urgency is its virtual arrival ``arrival + (priority - 1) * aging``, so a low-priority sequence that has
  waited long enough goes before a newcomer (nothing starves in the queue).
* **Deadlines**: a request's ``timeout_ms`` bounds its wait for a place, not its answer -- a stream that
  has started is never cut by its deadline. A seat still waiting at its deadline leaves with 504.
* **Preemption by recompute** (vLLM's ``RECOMPUTE`` mode): when a seat arrives and every place is held,
  and a running seat has a strictly lower priority, that seat is asked to yield (:meth:`Seat.preempt`).
  Its stream cancels its sequence in the manager (the cache blocks are freed at once), waits again with
  its original arrival (it goes back first among its priority), and on its return is added again as its
  prompt plus the tokens it had already sent, asking only for the rest: the client sees a pause, never
  a repeated or a lost token. One sequence is preempted for one newcomer, the latest-admitted of the
  lowest priority (the least work lost).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ServerError


class GenerationDeadline(ServerError):
    """The request waited its whole ``timeout_ms`` for a place in the engine: 504."""

    status = 504
    reason = "timeout"

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"deadline: no place in the generation engine within {timeout_s * 1000:.0f} ms")


@dataclass(eq=False)
class Seat:
    """One sequence's place: waiting, or holding one of the gate's slots."""

    priority: int  # 1 = the highest
    arrival: float  # time.monotonic() of the request
    deadline: float | None = None  # until the first admission only
    order: int = 0  # ties: first come first served
    running: bool = False
    preemptions: int = 0
    on_preempt: Callable[[], None] | None = None  # set by the stream that holds the seat
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    asked_to_yield: bool = False

    def urgency(self, aging_s: float) -> tuple[float, int]:
        return (self.arrival + (self.priority - 1) * aging_s, self.order)

    def preempt(self) -> None:
        if not self.asked_to_yield:
            self.asked_to_yield = True
            if self.on_preempt is not None:
                self.on_preempt()


def most_urgent(waiting: list[Seat], aging_s: float) -> Seat | None:
    """The seat that gets the next free place (pure)."""
    return min(waiting, key=lambda s: s.urgency(aging_s), default=None)


def victim(running: list[Seat], newcomer: Seat) -> Seat | None:
    """The running seat that yields its place to ``newcomer``, or None (pure): among those of a strictly
    lower priority than the newcomer's and not already yielding, the lowest priority; then the
    latest-admitted (the least work lost)."""
    lower = [s for s in running if s.priority > newcomer.priority and not s.asked_to_yield]
    return max(lower, key=lambda s: (s.priority, s.order), default=None)


class Gate:
    """At most ``slots`` seats run at once; the others wait by urgency."""

    def __init__(self, slots: int, aging_s: float = 0.1) -> None:
        self.slots = slots
        self.aging_s = aging_s
        self.waiting: list[Seat] = []
        self.running: list[Seat] = []
        self.preemptions = 0
        self.on_preemption: Callable[[], None] | None = None  # a metric's inc
        self._order = itertools.count()

    def seat(self, priority: int, timeout_s: float | None = None) -> Seat:
        now = time.monotonic()
        deadline = now + timeout_s if timeout_s is not None else None
        return Seat(priority=priority, arrival=now, deadline=deadline, order=next(self._order))

    async def enter(self, seat: Seat) -> None:
        """Wait for a place; :class:`GenerationDeadline` past the seat's deadline (it then holds none)."""
        seat.admitted.clear()
        self.waiting.append(seat)
        self._fill()
        # preempt only for the seat that would get the freed place (not for one that waits behind an
        # older, aged waiter: that would cut a sequence to run another of no higher priority)
        if not seat.admitted.is_set() and most_urgent(self.waiting, self.aging_s) is seat:
            yielding = victim(self.running, seat)
            if yielding is not None:
                yielding.preempt()
        if seat.admitted.is_set():
            return
        timeout = None if seat.deadline is None else max(0.0, seat.deadline - time.monotonic())
        try:
            await asyncio.wait_for(seat.admitted.wait(), timeout)
        except TimeoutError:
            if seat.admitted.is_set():  # admitted in the same instant: keep the place
                return
            self.waiting.remove(seat)
            raise GenerationDeadline(timeout or 0.0) from None
        except BaseException:
            self.leave(seat)
            raise

    async def yield_place(self, seat: Seat) -> None:
        """A preempted seat gives its place up and waits again, with its first arrival and no deadline
        (its stream has started)."""
        self.preemptions += 1
        seat.preemptions += 1
        if self.on_preemption is not None:
            self.on_preemption()
        seat.deadline = None
        self._free(seat)  # the place goes to a waiter before this seat waits again
        seat.asked_to_yield = False
        await self.enter(seat)

    def leave(self, seat: Seat) -> None:
        """The seat's stream ended (finished, failed or cut): its place goes to the most urgent waiter."""
        if seat in self.waiting:
            self.waiting.remove(seat)
        self._free(seat)

    def _free(self, seat: Seat) -> None:
        if seat in self.running:
            self.running.remove(seat)
            seat.running = False
        self._fill()

    def _fill(self) -> None:
        while len(self.running) < self.slots and (nxt := most_urgent(self.waiting, self.aging_s)) is not None:
            self.waiting.remove(nxt)
            nxt.running = True
            self.running.append(nxt)
            nxt.admitted.set()
