"""The shadow mirror: copy a sample of answered requests to a shadow revision and compare the answers.

A stable server copies ``sample_rate`` of the infer requests it has *answered* (the copy is offered after
the response is sent, so it never delays the user) to the shadow revision's Service, compares the two
outputs (:mod:`modelserver.compare`) and counts the result in
``modelserver_shadow_requests_total{shadow_revision, result}``:

* ``agree`` / ``disagree``: the shadow answered 200 and the outputs do / do not agree
  (``modelserver_shadow_similarity`` gets the similarity);
* ``error``: the shadow answered non-200, or an unreadable response, or the connection failed;
* ``timeout``: no answer within the copy's timeout;
* ``dropped``: the bounded copy queue was full: the copy was never sent.

The shadow's answer is never returned to anybody. Which revision to copy to comes from a file -- in a
pod, a downward-API volume of the pod annotation ``modeldeploy.io/shadow`` that the operator sets --
re-read every second (:meth:`ShadowMirror.watch`), so the stable pods learn of a shadow, or of its end,
without a restart. ``modelserver_shadow_active{shadow_revision}`` is 1 while copying: the operator starts
the shadow clock only once every stable server reports it.

The file holds JSON (empty: no shadow)::

    {"revision": "5d4c...", "sampleRate": 0.2, "timeoutMs": 5000,
     "url": "http://minilm-5d4c....team-a.svc.cluster.local:8080",
     "compare": {"method": "auto", "minCosine": 0.99, "rtol": 0.001, "atol": 1e-05}}

**Where copies go is this server's to decide, not the file's.** Users' request bodies are copied, so a
file (a pod annotation: anyone who may patch the pod can write it) must not be able to send them
anywhere. The server builds the target from its own setting ``MODELSERVER_SHADOW_SERVICE`` -- in a pod,
``http://<its ModelDeployment>-{revision}.<its namespace>.svc.<cluster domain>:8080``, written by the
operator into the pod template -- and the file's ``revision``, which must be a DNS label (so it can only
name a sibling revision Service of the same ModelDeployment in the same namespace). The file's ``url``
is optional (the operator writes it for servers of older images, which read it): when present it must be
the URL the server built, else the whole file is refused. A refused file is logged, counted in
``modelserver_shadow_refused_total{reason}`` and copies nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from .compare import CompareSpec, CustomCompare, compare_outputs
from .errors import InvalidInput
from .metrics import Metrics
from .protocol import decode_response

log = logging.getLogger("modelserver.shadow")

#: header on every copy: the shadow's own logs (and tests) can tell copies from user requests
SHADOW_HEADER = "x-modeldeploy-shadow"
QUEUE_SIZE = 256
CONCURRENCY = 8
WATCH_PERIOD_S = 1.0


#: how a copy is sent: (url, body, headers) -> (status, lower-case headers, body); raises OSError or
#: aiohttp.ClientError when nothing came back
Post = Callable[[str, bytes, dict[str, str]], Awaitable[tuple[int, dict[str, str], bytes]]]


class AiohttpPost:
    """Copies over aiohttp: one pooled session (``concurrency`` connections per target).

    Why not httpx (the client the tests use): measured on this machine, a POST with a 384-float answer
    cost ~0.97 ms of CPU (client and a loopback server) with httpx's AsyncClient and ~0.22 ms with
    aiohttp's ClientSession; at sampleRate 0.2 the stable server pays that on every fifth request
    (docs/server.md, "Shadow copies: cost")."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    async def __call__(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=self.concurrency), trust_env=False
            )
        async with self._session.post(url, data=body, headers=headers) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class MirrorConfigError(ValueError):
    """The shadow file does not hold a valid mirror target. ``reason`` is the metric label: ``invalid``
    (unreadable or out-of-range values), ``revision`` (not a DNS label), ``url`` (a URL other than the
    one this server builds), ``no_service`` (this server was given no shadow service)."""

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


REFUSAL_REASONS = ("invalid", "revision", "url", "no_service")

#: a revision names a Service ``<ModelDeployment>-<revision>``: an RFC 1123 label (lower-case
#: alphanumerics and '-', at most 63 characters), so it cannot add a host, a port, a path or a scheme
_REVISION = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
REVISION_PLACEHOLDER = "{revision}"


def shadow_url(service: str, revision: str) -> str:
    """The URL copies to ``revision`` go to: ``service`` (this server's setting) with ``{revision}``
    replaced. Raises :class:`MirrorConfigError` unless ``revision`` is a DNS label."""
    if not service:
        raise MirrorConfigError(
            "this server was given no shadow service (MODELSERVER_SHADOW_SERVICE), so it copies nowhere",
            "no_service",
        )
    if not isinstance(revision, str) or not _REVISION.fullmatch(revision):
        raise MirrorConfigError(
            f"revision must be a DNS label (a-z, 0-9, '-', at most 63), got {revision!r}", "revision"
        )
    return service.replace(REVISION_PLACEHOLDER, revision).rstrip("/")


@dataclass(frozen=True)
class MirrorConfig:
    url: str
    revision: str
    sample_rate: float
    timeout_s: float = 5.0
    compare: CompareSpec = field(default_factory=CompareSpec)

    @classmethod
    def parse(cls, text: str, service: str) -> MirrorConfig | None:
        """The target in the shadow file, built from ``service`` (:func:`shadow_url`); None when the
        file is empty (no shadow)."""
        if not text.strip():
            return None
        try:
            doc = orjson.loads(text)
            if not isinstance(doc, dict):
                raise MirrorConfigError("the shadow file must hold a JSON object")
            revision = doc["revision"]
            url = shadow_url(service, revision)
            given = doc.get("url")
            if given is not None and (not isinstance(given, str) or given.rstrip("/") != url):
                raise MirrorConfigError(
                    f"url {given!r} is not this server's shadow service for revision {revision!r} ({url});"
                    " copies go only to the URL the server builds",
                    "url",
                )
            rate = float(doc.get("sampleRate", 0.0))
            if not 0.0 <= rate <= 1.0:
                raise MirrorConfigError(f"sampleRate must be within [0, 1], got {rate}")
            timeout = float(doc.get("timeoutMs", 5000.0)) / 1000.0
            if timeout <= 0:
                raise MirrorConfigError("timeoutMs must be > 0")
            c = doc.get("compare") or {}
            spec = CompareSpec(
                method=c.get("method", "auto"),
                min_cosine=float(c.get("minCosine", 0.99)),
                rtol=float(c.get("rtol", 1.0e-3)),
                atol=float(c.get("atol", 1.0e-5)),
                min_token_agreement=float(c.get("minTokenAgreement", 0.9)),
            )
        except MirrorConfigError:
            raise
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise MirrorConfigError(f"invalid shadow target: {type(e).__name__}: {e}") from None
        return cls(url=url, revision=revision, sample_rate=rate, timeout_s=timeout, compare=spec)


@dataclass(frozen=True)
class Copy:
    """One answered request to send again: its body, and this server's outputs to compare with."""

    config: MirrorConfig
    body: bytes
    header_length: str | None
    request_id: str
    outputs: dict[str, np.ndarray]


class ShadowMirror:
    """Copies, compares, counts. ``offer`` is O(1) and never raises or blocks."""

    def __init__(
        self,
        model_name: str,
        metrics: Metrics,
        *,
        classification: bool = False,
        custom: CustomCompare | None = None,
        queue_size: int = QUEUE_SIZE,
        concurrency: int = CONCURRENCY,
        sample: Callable[[], float] = random.random,
        post: Post | None = None,
        service: str = "",
    ) -> None:
        self.model_name = model_name
        self.service = service  # MODELSERVER_SHADOW_SERVICE: where copies may go (shadow_url)
        self.metrics = metrics
        self.classification = classification
        self.custom = custom
        self.concurrency = concurrency
        self._sample = sample
        self._aiohttp: AiohttpPost | None = None
        if post is None:
            post = self._aiohttp = AiohttpPost(concurrency)
        self._post: Post = post
        self.config: MirrorConfig | None = None
        # Copy, or a subclass's own kind of copy (modelserver.gen_shadow.AnswerCopy), which its send() takes
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=queue_size)
        self._workers: list[asyncio.Task[None]] = []
        self._children: dict[str, tuple[dict[str, Any], Any, Any]] = {}
        self._disagreements = 0

    # -- configuration ----------------------------------------------------------------------------------
    def configure(self, config: MirrorConfig | None) -> None:
        """Start copying to ``config`` (or stop, with None). Copies already queued are still sent."""
        old = self.config
        self.config = config
        if config == old:
            return
        if config is None:
            log.info("shadow mirror off", extra={"was": old.revision if old else None})
            self.metrics.set_shadow_active(None)
            return
        self._metrics_of(config.revision)
        if not self._workers:
            self._workers = [
                asyncio.get_running_loop().create_task(self._work(), name=f"shadow-{i}")
                for i in range(self.concurrency)
            ]
        self.metrics.set_shadow_active(config.revision, config.sample_rate)
        log.info(
            "shadow mirror on",
            extra={"url": config.url, "revision": config.revision, "sample_rate": config.sample_rate},
        )

    @property
    def active(self) -> bool:
        return self.config is not None

    async def watch(self, path: Path, period: float = WATCH_PERIOD_S) -> None:
        """Follow the shadow file (a downward-API volume: replaced atomically by the kubelet)."""
        last: str | None = None
        while True:
            try:
                text = path.read_text()
            except FileNotFoundError:
                # never there: no shadow; there before: the kubelet's atomic swap (a reader can resolve
                # the old ..data directory just as it is removed) -- the last text stands
                text = last if last is not None else ""
            except OSError as e:
                log.warning("cannot read the shadow file %s: %s", path, e)
                text = last or ""
            if text != last:
                last = text
                try:
                    self.configure(MirrorConfig.parse(text, self.service))
                except MirrorConfigError as e:
                    log.error("shadow file %s refused: %s; not copying", path, e)
                    self.metrics.refuse_shadow(e.reason)
                    self.configure(None)
            await asyncio.sleep(period)

    # -- the hot path -----------------------------------------------------------------------------------
    def offer(
        self, body: bytes, header_length: str | None, request_id: str, outputs: dict[str, np.ndarray]
    ) -> None:
        """Maybe copy one answered request (``sample_rate`` of them); a full queue drops the copy."""
        config = self.config
        if config is None or self._sample() >= config.sample_rate:
            return
        try:
            self._queue.put_nowait(Copy(config, body, header_length, request_id, outputs))
        except asyncio.QueueFull:
            self._metrics_of(config.revision)[0]["dropped"].inc()

    # -- the copies ---------------------------------------------------------------------------------------
    def _metrics_of(self, revision: str) -> tuple[dict[str, Any], Any, Any]:
        m = self._children.get(revision)
        if m is None:
            m = self._children[revision] = self.metrics.shadow_children(revision)
        return m

    async def _work(self) -> None:
        while True:
            copy = await self._queue.get()
            try:
                await self.send(copy)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one copy stop the worker
                log.exception("shadow copy failed")
            finally:
                self._queue.task_done()

    async def _round_trip(
        self, cfg: MirrorConfig, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes] | str:
        """POST one copy to the shadow within its timeout (the whole round trip, not per socket read):
        the answer, or the result label ``timeout``/``error`` already counted. Times what came back."""
        results, _, duration = self._metrics_of(cfg.revision)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with asyncio.timeout(cfg.timeout_s):
                answer = await self._post(f"{cfg.url}{path}", body, headers)
        except TimeoutError:
            results["timeout"].inc()
            return "timeout"
        except (OSError, aiohttp.ClientError) as e:
            log.debug("shadow copy %s: %s", headers.get("x-request-id"), e)
            results["error"].inc()
            return "error"
        duration.observe(loop.time() - t0)
        return answer

    async def send(self, copy: Copy) -> str:
        """Send one copy, compare, count; returns the result label."""
        cfg = copy.config
        results, similarity, _ = self._metrics_of(cfg.revision)
        headers = {"content-type": "application/json", SHADOW_HEADER: "1", "x-request-id": copy.request_id}
        if copy.header_length is not None:
            headers["inference-header-content-length"] = copy.header_length
            headers["content-type"] = "application/octet-stream"
        answer = await self._round_trip(cfg, f"/v2/models/{self.model_name}/infer", copy.body, headers)
        if isinstance(answer, str):
            return answer
        status, resp_headers, content = answer
        if status != 200:
            results["error"].inc()
            return "error"
        try:
            theirs = decode_response(content, resp_headers.get("inference-header-content-length"))
        except InvalidInput as e:
            log.info("shadow %s: unreadable response: %s", cfg.revision, e)
            results["error"].inc()
            return "error"
        got = compare_outputs(
            copy.outputs, theirs, cfg.compare, classification=self.classification, custom=self.custom
        )
        similarity.observe(got.similarity)
        if got.agree:
            results["agree"].inc()
            return "agree"
        results["disagree"].inc()
        self._disagreements += 1
        if self._disagreements <= 10 or self._disagreements % 100 == 0:
            log.info(
                "shadow disagrees",
                extra={
                    "request_id": copy.request_id,
                    "shadow_revision": cfg.revision,
                    "reason": got.reason[:300],
                    "disagreements": self._disagreements,
                },
            )
        return "disagree"

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for queued copies to be sent."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)

    async def close(self) -> None:
        for t in self._workers:
            t.cancel()
        for t in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._workers = []
        if self._aiohttp is not None:
            await self._aiohttp.close()
