"""Rollout notifications: webhooks told of a rollout's events, never in its way.

* **What** (pure): :func:`notification_type` maps the Events a reconcile posts to the notification types
  a user subscribes to (``Started``, ``ShadowResult``, ``StepAdvanced``, ``Promoted``, ``RolledBack``,
  ``FailedBack``, ``Paused``, ``FallbackOn``, ``FallbackOff``); :func:`body` renders one in the
  webhook's ``format``: ``json`` (our document), ``slack`` (an incoming-webhook ``text``), or
  ``cloudevents`` (CloudEvents 1.0, structured JSON mode).
* **Signed**: with the operator's signing key (a mounted Secret, ``--notification-signing-key-file``),
  each POST carries ``X-ModelDeploy-Timestamp: <unix seconds>`` and ``X-ModelDeploy-Signature-256:
  v1=<hex HMAC-SHA256 of "<timestamp>.<purpose>.<body>">`` (:func:`signed_headers`; purpose
  ``notification`` here, ``gate`` for a gate's ask) under a key derived for the ModelDeployment's
  namespace (:func:`namespace_key`; ``kubectl modeldeploy notification-key`` prints it for a team): a
  team can check what it receives (:func:`verify`, the receiver's side, docs/security.md), cannot sign for
  another namespace, and refuses a capture replayed after :data:`TOLERANCE` or presented as the other
  purpose. The operator reads no Secret through the API (docs/security.md).
* **Never in the way** (I/O): :class:`Notifier` queues deliveries for a thread of its own (a bounded
  queue; when full, a delivery is dropped and counted) and returns at once; each delivery is tried up
  to ``attempts`` times with exponential backoff, each try bounded by the webhook's ``timeout`` (connect
  to the last byte of the answer, whose body is not read), no redirects. A receiver that is down, answers
  500 or hangs costs its own deliveries and nothing else. Counted in
  ``modeldeploy_notifications_total{result}``.
* **Where**: a webhook whose host matches none of ``--notification-allowed-hosts`` (when set) is refused,
  counted (``result="refused"``) and logged: the operator's network position is not the author's. So is a
  URL that does not parse (one stored before the CRD refused it): it is never sent to, and the other
  webhooks are served as usual.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp

from . import metrics
from .api import WebhookSpec, parse_duration
from .api_base import url_origin, url_unparsable
from .api_rollout import NotificationType
from .loop_thread import LoopThread

log = logging.getLogger(__name__)


#: Event reasons (what a reconcile posts) -> the notification they are
BY_REASON: dict[str, NotificationType] = {
    "CanaryStarted": "Started",
    "ShadowPassed": "ShadowResult",
    "ShadowSkipped": "ShadowResult",
    "StepAdvanced": "StepAdvanced",
    "Promoted": "Promoted",
    "RolledBack": "RolledBack",
    "Aborted": "RolledBack",
    "FailedBack": "FailedBack",
    "AnalysisPaused": "Paused",
    "FallbackActivated": "FallbackOn",
    "FallbackDeactivated": "FallbackOff",
}
SIGNATURE_HEADER = "X-ModelDeploy-Signature-256"
TIMESTAMP_HEADER = "X-ModelDeploy-Timestamp"
SOURCE = "modeldeploy"

#: what a signed POST is, signed with it: a notification's signature never verifies as a gate's ask
Purpose = Literal["notification", "gate"]

#: how far (seconds) a receiver lets a signature's timestamp be from its own clock, either way (Stripe's
#: and Standard Webhooks' default): a capture is refused once older, and the operator signs each try anew
TOLERANCE = 300.0


@dataclass(frozen=True)
class Webhook:
    """Where to tell, how, and what (``events`` empty: every type)."""

    url: str
    format: Literal["json", "slack", "cloudevents"] = "json"
    events: tuple[str, ...] = ()
    timeout: float = 5.0


@dataclass(frozen=True)
class Notification:
    type: NotificationType
    namespace: str
    name: str
    reason: str  # the Event's reason
    message: str
    severity: Literal["Normal", "Warning"]
    time: datetime
    id: str


def notification_type(reason: str, message: str) -> NotificationType | None:
    """The notification an Event is, if any (a rollback in the shadow stage is the shadow's result)."""
    kind = BY_REASON.get(reason)
    if kind == "RolledBack" and "shadow stage failed" in message:
        return "ShadowResult"
    return kind


def wanted(hook: Webhook, kind: NotificationType) -> bool:
    return not hook.events or kind in hook.events


def document(n: Notification) -> dict[str, Any]:
    """The ``json`` format."""
    return {
        "type": n.type,
        "reason": n.reason,
        "severity": n.severity,
        "namespace": n.namespace,
        "name": n.name,
        "message": n.message,
        "time": n.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "id": n.id,
        "source": SOURCE,
    }


def body(n: Notification, fmt: str) -> tuple[bytes, str]:
    """(body, content type) of ``n`` in the webhook format ``fmt``."""
    doc = document(n)
    if fmt == "slack":
        mark = ":warning:" if n.severity == "Warning" else ":white_check_mark:"
        payload: dict[str, Any] = {
            "text": f"{mark} ModelDeployment {n.namespace}/{n.name}: {n.type}: {n.message}"
        }
        return json.dumps(payload).encode(), "application/json"
    if fmt == "cloudevents":
        payload = {
            "specversion": "1.0",
            "type": f"io.modeldeploy.rollout.{n.type[0].lower()}{n.type[1:]}",
            "source": f"/apis/modeldeploy.io/v1alpha1/namespaces/{n.namespace}/modeldeployments/{n.name}",
            "id": n.id,
            "time": doc["time"],
            "subject": n.name,
            "datacontenttype": "application/json",
            "data": doc,
        }
        return json.dumps(payload).encode(), "application/cloudevents+json"
    return json.dumps(doc).encode(), "application/json"


def namespace_key(master: bytes, namespace: str) -> bytes:
    """The signing key of one namespace's notifications, derived from the operator's key."""
    return hmac.new(master, b"modeldeploy-notifications:" + namespace.encode(), hashlib.sha256).digest()


def _mac(key: bytes, timestamp: str, purpose: str, data: bytes) -> str:
    signed = f"{timestamp}.{purpose}.".encode() + data
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def signed_headers(key: bytes, purpose: Purpose, data: bytes, now: float | None = None) -> dict[str, str]:
    """The headers that sign ``data`` as ``purpose`` at ``now`` (default: the wall clock, which the
    receiver compares with its own)."""
    timestamp = str(int(time.time() if now is None else now))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: "v1=" + _mac(key, timestamp, purpose, data)}


def verify(
    key: bytes,
    purpose: Purpose,
    headers: Mapping[str, str],
    data: bytes,
    now: float | None = None,
    tolerance: float = TOLERANCE,
) -> bool:
    """The receiver's check (docs/security.md shows it without this package): ``data`` was signed with
    ``key`` as ``purpose`` (a gate endpoint passes ``"gate"``) within ``tolerance`` seconds of ``now``.
    ``headers`` as received, any case. Not a replay cache: a receiver that must act once per POST also
    remembers the signatures it took within the tolerance."""
    lower = {k.lower(): v for k, v in headers.items()}
    timestamp = lower.get(TIMESTAMP_HEADER.lower(), "")
    given = lower.get(SIGNATURE_HEADER.lower(), "")
    if not timestamp.isdigit() or not given.startswith("v1="):
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance:
        return False
    return hmac.compare_digest(given[3:], _mac(key, timestamp, purpose, data))


def notification_for(
    namespace: str, name: str, reason: str, severity: str, message: str, now: datetime
) -> Notification | None:
    kind = notification_type(reason, message)
    if kind is None:
        return None
    sev: Literal["Normal", "Warning"] = "Warning" if severity == "Warning" else "Normal"
    return Notification(kind, namespace, name, reason, message[:4096], sev, now, str(uuid.uuid4()))


def host_allowed(url: str, patterns: Sequence[str]) -> bool:
    """Whether ``url``'s host matches one of ``patterns`` (fnmatch, case-insensitive); none: any host.
    Never raises: a URL that does not parse has no host to allow, whatever the patterns."""
    if url_unparsable(url) is not None:
        return False
    host = (urlsplit(url).hostname or "").lower()
    return not patterns or any(fnmatch.fnmatchcase(host, p.lower()) for p in patterns)


async def post(url: str, data: bytes, headers: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """One POST under one total deadline (connect to the status line), no redirects, the body not read:
    (the status, or None when there was none, and a one-line reason)."""
    try:
        async with asyncio.timeout(timeout), aiohttp.ClientSession() as session:
            resp = await session.post(url, data=data, headers=headers, allow_redirects=False)
            resp.close()
    except TimeoutError:
        return None, f"no answer within {timeout:g}s"
    except (aiohttp.ClientError, OSError, ValueError) as e:
        return None, " ".join(f"{type(e).__name__}: {e}".split())[:200]
    return resp.status, f"HTTP {resp.status}"


def own_webhooks(raw: dict[str, Any]) -> list[Webhook]:
    """A ModelDeployment's ``spec.rollout.notifications`` (as admitted; one that does not parse: none)."""
    out = []
    for item in ((raw.get("spec") or {}).get("rollout") or {}).get("notifications") or []:
        try:
            w = WebhookSpec.model_validate(item)
        except ValueError as e:
            log.warning("notifications: a webhook that does not parse is skipped: %s", e)
            continue
        out.append(Webhook(w.url, w.format, tuple(w.events), parse_duration(w.timeout)))
    return out


class Notifier:
    """Delivers notifications from a thread with its own event loop; :meth:`send` never waits."""

    def __init__(
        self,
        signing_key: bytes | None = None,
        *,
        attempts: int = 3,
        backoff: float = 1.0,
        queue_size: int = 1000,
        concurrency: int = 16,
        allowed_hosts: Sequence[str] = (),
    ) -> None:
        self.signing_key = signing_key
        # host patterns (fnmatch) a webhook may name; empty: any (docs/security.md, finding 8)
        self.allowed_hosts = tuple(allowed_hosts)
        self.attempts, self.backoff = attempts, backoff
        self.queue_size, self.concurrency = queue_size, concurrency
        self._pending = 0
        self._lock = threading.Lock()
        self._thread = LoopThread("modeldeploy-notifications")
        self._limit = asyncio.Semaphore(concurrency)

    def start(self) -> Notifier:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._thread.stop(timeout)

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def send(self, n: Notification, hooks: Sequence[Webhook]) -> None:
        """Queue ``n`` for each of ``hooks`` that wants it; returns at once (a full queue drops, counted)."""
        for hook in hooks:
            if not wanted(hook, n.type):
                continue
            unparsable = url_unparsable(hook.url)
            if unparsable is not None:  # stored before the CRD refused it: never sent to, never raised
                metrics.NOTIFICATIONS.labels(result="refused").inc()
                log.warning("notifications: not sent to a webhook URL that does not parse (%s)", unparsable)
                continue
            if not host_allowed(hook.url, self.allowed_hosts):
                metrics.NOTIFICATIONS.labels(result="refused").inc()
                log.warning("notifications: %s is not an allowed host; not sent", url_origin(hook.url))
                continue
            with self._lock:
                full = self._pending >= self.queue_size or not self._thread.running
                if not full:
                    self._pending += 1
            if full:
                metrics.NOTIFICATIONS.labels(result="dropped").inc()
                log.warning("notifications: queue full, dropped %s for %s/%s", n.type, n.namespace, n.name)
                continue
            self._thread.submit(self._deliver(n, hook))

    async def _deliver(self, n: Notification, hook: Webhook) -> None:
        data, content_type = body(n, hook.format)
        key = None if self.signing_key is None else namespace_key(self.signing_key, n.namespace)
        try:
            async with self._limit:
                result = await self._tries(hook, data, content_type, key)
        finally:
            with self._lock:
                self._pending -= 1
        metrics.NOTIFICATIONS.labels(result=result).inc()

    async def _tries(self, hook: Webhook, data: bytes, content_type: str, key: bytes | None) -> str:
        why = ""
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            started = time.monotonic()
            headers = {"Content-Type": content_type, "User-Agent": "modeldeploy-operator"}
            if key is not None:  # signed at each try: a receiver's tolerance counts from the try
                headers.update(signed_headers(key, "notification", data))
            status, why = await post(hook.url, data, headers, hook.timeout)
            if status is not None and 200 <= status < 300:
                return "delivered"
            metrics.NOTIFICATION_ATTEMPTS.labels(result="failed").inc()
            log.info(
                "notification to %s failed (%s, %.1fs)", url_origin(hook.url), why, time.monotonic() - started
            )
        log.warning(
            "notification to %s given up after %d tries: %s", url_origin(hook.url), self.attempts, why
        )
        return "failed"


def add_key_parser(sub: Any) -> None:
    """``kubectl modeldeploy notification-key``: a namespace's signing key, for its team (no cluster)."""
    p = sub.add_parser(
        "notification-key",
        help="print a namespace's notification signing key (hex), derived from the operator's key file",
    )
    p.add_argument("--key-file", required=True, help="the operator's key (the chart's signing key Secret)")
    p.add_argument("-n", "--namespace", required=True)
    p.set_defaults(func=_print_key, no_cluster=True)


def _print_key(_kube: Any, args: Any) -> int:
    with open(args.key_file, "rb") as f:
        print(namespace_key(f.read(), args.namespace).hex())
    return 0
