"""An asyncio event loop in a daemon thread of its own: where the operator's network I/O other than the
apiserver runs (Prometheus measurements, notifications, gates), so that no reconcile worker ever waits on
it. Callers in any thread hand it coroutines with :meth:`LoopThread.submit`; :meth:`LoopThread.stop`
cancels what runs and returns within its timeout whatever the other side does."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        ready.wait(5)

    @property
    def running(self) -> bool:
        return self.loop is not None and self.loop.is_running()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run ``coro`` in the loop; the future is done when it is (never wait on it from a reconcile)."""
        assert self.loop is not None, f"{self.name} is not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 2.0, before: Callable[[], Awaitable[Any]] | None = None) -> None:
        """Cancel every task, then run ``before`` (e.g. closing clients) and stop the loop; returns within
        about ``timeout`` (the thread is a daemon)."""
        loop = self.loop
        if loop is None or not loop.is_running():
            return

        async def shutdown() -> None:
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()
            if before is not None:
                await before()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout)
        except Exception as e:  # something that would not stop in time: the loop goes anyway
            log.warning("%s: shutdown: %s", self.name, e)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)
