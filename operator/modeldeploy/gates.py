"""Asking the rollout's gates off the reconcile path: a thread with its own event loop POSTs to them.

A reconcile never waits on a gate (as it never waits on Prometheus; :mod:`modeldeploy.measurements`). The
rollout state machine (:mod:`modeldeploy.gate_stage`) calls :meth:`GateAsker.ask`, which returns at once
the newest finished answer of that gate for that revision (None before the first), and asks again in the
background when that answer is older than ``refresh`` seconds -- one ask per gate at a time, at most
``concurrency`` at once. A finished answer that differs from the one before asks for a reconcile of its
owner through ``on_done(namespace, name)``.

An ask is a POST of ``{"namespace", "name", "revision", "gate"}`` (JSON; signed like the notifications
when the operator has a signing key) with the gate's ``timeout`` as its total deadline (connect to the
answer's status line), no redirects, the answer's body not read. Exactly 200 opens the gate; anything else
-- another status (a 204 or a 302 included), no answer in time, a refused connection -- keeps it closed,
with a one-line reason. A gate whose host is not in ``--notification-allowed-hosts`` (when set) is
closed without being asked. A gate that hangs costs its own rollout a wait, and nothing else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from .api import GateName
from .api_base import url_origin
from .loop_thread import LoopThread
from .notify import SIGNATURE_HEADER, host_allowed, namespace_key, post, signature
from .rollout_types import GateAnswer

log = logging.getLogger(__name__)

Slot = tuple[str, str, str, str, str, float]  # (namespace, name, revision, gate, url, timeout)


@dataclass
class _Done:
    answer: GateAnswer
    finished: float  # the asker's clock


class GateAsker:
    """Asks gates in a thread of its own; reconciles read the newest answers
    (:class:`rollout_types.Gates`)."""

    def __init__(
        self,
        on_done: Callable[[str, str], object] | None = None,
        *,
        allowed_hosts: Sequence[str] = (),
        signing_key: bytes | None = None,
        refresh: float = 2.5,
        max_age: float = 120.0,
        concurrency: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_done = on_done
        # host patterns (fnmatch) a gate may name; empty: any (the notifications' list, docs/security.md 8)
        self.allowed_hosts = tuple(allowed_hosts)
        self.signing_key = signing_key
        self.refresh, self.max_age, self.concurrency = refresh, max_age, concurrency
        self._clock = clock
        self._lock = threading.Lock()
        self._done: dict[Slot, _Done] = {}
        self._running: dict[Slot, Future[None]] = {}
        self._thread = LoopThread("modeldeploy-gates")
        self._limit = asyncio.Semaphore(concurrency)

    # -------------------------------------------------------------------------------- lifecycle
    def start(self) -> GateAsker:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel every ask; returns within ``timeout`` whatever the gates do (the thread is a daemon)."""
        self._thread.stop(timeout)

    # -------------------------------------------------------------------------------- reads (any thread)
    def ask(
        self, namespace: str, name: str, revision: str, gate: GateName, url: str, timeout: float
    ) -> GateAnswer | None:
        """The newest answer (None before the first, or when older than ``max_age``); asked again in the
        background when older than ``refresh``. Never waits."""
        if not host_allowed(url, self.allowed_hosts):
            return GateAnswer(False, f"host {url_origin(url)} is not allowed (--notification-allowed-hosts)")
        slot: Slot = (namespace, name, revision, gate, url, timeout)
        with self._lock:
            done = self._done.get(slot)
            now = self._clock()
            if done is None or now - done.finished > self.refresh:
                self._submit(slot)
            if done is None or now - done.finished > self.max_age:
                return None
            return done.answer

    def in_flight(self) -> int:
        with self._lock:
            return len(self._running)

    # -------------------------------------------------------------------------------- the loop
    def _submit(self, slot: Slot) -> None:
        """With the lock held: ask ``slot`` unless it is being asked."""
        if slot in self._running or not self._thread.running:
            return
        self._running[slot] = self._thread.submit(self._ask(slot))

    async def _ask(self, slot: Slot) -> None:
        namespace, name, revision, gate, url, timeout = slot
        try:
            async with self._limit:
                answer = await self._post(namespace, name, revision, gate, url, timeout)
        finally:
            with self._lock:
                self._running.pop(slot, None)
        with self._lock:
            before = self._done.get(slot)
            self._done[slot] = _Done(answer, self._clock())
            self._forget_old()
        log.info("gate %s of %s/%s (%s): %s", gate, namespace, name, url_origin(url), answer.reason)
        if self.on_done is not None and (before is None or before.answer != answer):
            try:
                self.on_done(namespace, name)
            except Exception as e:  # the reconcile is also requeued by its own timer
                log.warning("gates: on_done %s/%s: %s", namespace, name, e)

    async def _post(
        self, namespace: str, name: str, revision: str, gate: str, url: str, timeout: float
    ) -> GateAnswer:
        data = json.dumps({"namespace": namespace, "name": name, "revision": revision, "gate": gate}).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "modeldeploy-operator"}
        if self.signing_key is not None:
            headers[SIGNATURE_HEADER] = signature(namespace_key(self.signing_key, namespace), data)
        status, why = await post(url, data, headers, timeout)
        return GateAnswer(status == 200, why)

    def _forget_old(self) -> None:
        """With the lock held: drop answers nobody asked for within ``max_age`` (bounded memory)."""
        now = self._clock()
        for slot in [s for s, d in self._done.items() if now - d.finished > self.max_age]:
            del self._done[slot]
