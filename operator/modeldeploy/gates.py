"""Asking the rollout's gates off the reconcile path: a thread with its own event loop POSTs to them.

A reconcile never waits on a gate (as it never waits on Prometheus; :mod:`modeldeploy.measurements`). The
rollout state machine (:mod:`modeldeploy.gate_stage`) calls :meth:`GateAsker.ask`, which returns at once
the newest finished answer of that gate for that revision (None before the first), and asks again in the
background when that answer is older than ``refresh`` seconds -- one ask per gate at a time, at most
``concurrency`` at once. A finished answer that differs from the one before asks for a reconcile of its
owner through ``on_done(namespace, name)``.

An ask is a POST of ``{"namespace", "name", "revision", "gate"}`` (JSON; signed like the notifications
when the operator has a signing key, with the purpose ``gate``, so a captured notification never verifies
as an ask) with the gate's ``timeout`` as its total deadline (connect to the answer's status line), no
redirects, the answer's body not read. Exactly 200 opens the gate; anything else keeps it closed, with a
one-line reason that lands in the author's status and Events.

That reason is the class of the failure only: ``HTTP <status>`` when the gate answered, else one and the
same :func:`unreachable` text for a refused connection, a timeout, a DNS or TLS failure, told no sooner
than the timeout. The operator asks from its own network position, so an errno text ("connection
refused" here, a timeout there) or how soon it came would make gates a port scanner for the author; the
detail goes to the operator's log only (docs/security.md, finding 8). A gate whose host is not in
``--notification-allowed-hosts`` (when set), or whose URL does not parse (stored before the CRD refused
it), is closed without being asked. A gate that hangs costs its own rollout a wait, and nothing else.
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
from .api_base import url_origin, url_unparsable
from .loop_thread import LoopThread
from .notify import host_allowed, namespace_key, post, signed_headers
from .rollout_types import GateAnswer

log = logging.getLogger(__name__)

Slot = tuple[str, str, str, str, str, float]  # (namespace, name, revision, gate, url, timeout)


def unreachable(timeout: float) -> str:
    """A closed gate's reason when no HTTP answer came, whatever the cause."""
    return f"gate unreachable: no HTTP answer within {timeout:g}s (the operator's log says why)"


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
        background when older than ``refresh``. Never waits, never raises."""
        unparsable = url_unparsable(url)
        if unparsable is not None:
            return GateAnswer(False, f"spec.rollout.gates.{gate}.url does not parse: {unparsable}")
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
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with self._limit:
                answer = await self._post(namespace, name, revision, gate, url, timeout)
            if answer.reason == unreachable(timeout):
                # a refused connection is told no sooner than a timeout, so when the answer lands tells
                # no more than what it says (outside the limit: a slot is not held for the wait)
                await asyncio.sleep(max(0.0, started + timeout - loop.time()))
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
            headers.update(signed_headers(namespace_key(self.signing_key, namespace), "gate", data))
        status, why = await post(url, data, headers, timeout)
        if status is None:  # the detail (errno, TLS, DNS) for the operator's log only
            log.info("gate %s of %s/%s (%s): no HTTP answer: %s", gate, namespace, name, url_origin(url), why)
            return GateAnswer(False, unreachable(timeout))
        return GateAnswer(status == 200, f"HTTP {status}")

    def _forget_old(self) -> None:
        """With the lock held: drop answers nobody asked for within ``max_age`` (bounded memory)."""
        now = self._clock()
        for slot in [s for s, d in self._done.items() if now - d.finished > self.max_age]:
            del self._done[slot]
