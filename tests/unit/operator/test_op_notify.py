"""Rollout notifications: which Events are which notification, the three body formats, the signature a
team can check with its namespace key, and delivery that never waits -- against real HTTP receivers on
127.0.0.1 that record, answer 500, or hang."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from localcluster.receiver import receivers
from md_canary import World, canary_md
from modeldeploy import metrics
from modeldeploy.api_base import INVALID_URL, url_origin
from modeldeploy.notify import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Notification,
    Notifier,
    Webhook,
    body,
    host_allowed,
    namespace_key,
    notification_for,
    own_webhooks,
    signed_headers,
    verify,
)

pytestmark = pytest.mark.timeout(30)

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
KEY = b"operator-signing-key"


@pytest.fixture
def serve() -> Iterator[Any]:
    with receivers() as start:
        yield start


@pytest.fixture
def notifier() -> Iterator[Notifier]:
    n = Notifier(KEY, attempts=3, backoff=0.05).start()
    yield n
    n.stop()


def promoted(ns: str = "team-a") -> Notification:
    n = notification_for(ns, "echo", "Promoted", "Normal", "revision 5d7f: every step passed", T0)
    assert n is not None
    return n


def wait_for(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def count(result: str) -> float:
    return metrics.NOTIFICATIONS.labels(result=result)._value.get()


# -- what -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "message", "kind"),
    [
        ("CanaryStarted", "revision a: step 1/3", "Started"),
        ("ShadowPassed", "revision a: shadow stage passed", "ShadowResult"),
        ("RolledBack", "revision a: shadow stage failed: agreement 0.2 < 0.9", "ShadowResult"),
        ("StepAdvanced", "revision a: step 2/3", "StepAdvanced"),
        ("Promoted", "revision a", "Promoted"),
        ("RolledBack", "revision a: error-rate 0.2 > 0.05", "RolledBack"),
        ("FailedBack", "revision a", "FailedBack"),
        ("AnalysisPaused", "revision a: 4/4 query errors", "Paused"),
        ("FallbackActivated", "no GPU pod in traffic", "FallbackOn"),
        ("FallbackDeactivated", "GPU pods back", "FallbackOff"),
        ("Created", "created Deployment", None),
        ("AnalysisPassed", "all checks passed", None),
    ],
)
def test_events_that_are_notifications(reason, message, kind):
    n = notification_for("ns", "m", reason, "Normal", message, T0)
    assert (n.type if n else None) == kind


def test_the_three_formats():
    n = promoted()
    data, ctype = body(n, "json")
    doc = json.loads(data)
    assert ctype == "application/json"
    assert doc["type"] == "Promoted" and doc["namespace"] == "team-a" and doc["name"] == "echo"
    assert doc["time"] == "2026-12-04T12:00:00Z" and doc["message"].startswith("revision 5d7f")
    slack = json.loads(body(n, "slack")[0])
    assert set(slack) == {"text"} and "team-a/echo: Promoted" in slack["text"]
    data, ctype = body(n, "cloudevents")
    ce = json.loads(data)
    assert ctype == "application/cloudevents+json"
    assert ce["specversion"] == "1.0" and ce["type"] == "io.modeldeploy.rollout.promoted"
    assert ce["source"] == "/apis/modeldeploy.io/v1alpha1/namespaces/team-a/modeldeployments/echo"
    assert ce["id"] == n.id and ce["data"]["type"] == "Promoted"


def test_a_modeldeployments_own_webhooks_come_from_its_spec():
    raw = {
        "spec": {
            "rollout": {
                "notifications": [
                    {
                        "url": "http://hooks.example/a",
                        "format": "slack",
                        "events": ["Promoted"],
                        "timeout": "2s",
                    },
                    {"url": "ftp://nope"},  # not admitted by the apiserver; skipped if it ever got here
                ]
            }
        }
    }
    assert own_webhooks(raw) == [Webhook("http://hooks.example/a", "slack", ("Promoted",), 2.0)]
    assert own_webhooks({"spec": {}}) == []


# -- delivery -------------------------------------------------------------------------------------------


def test_a_delivery_is_signed_now_as_a_notification_with_the_namespace_key_a_team_can_check(serve, notifier):
    r = serve()
    notifier.send(promoted("team-a"), [Webhook(r.url)])
    wait_for(lambda: r.got)
    _, headers, data = r.got[0]
    assert abs(int(headers[TIMESTAMP_HEADER.lower()]) - time.time()) < 5
    assert headers[SIGNATURE_HEADER.lower()].startswith("v1=")
    assert verify(namespace_key(KEY, "team-a"), "notification", headers, data)
    # another namespace's key does not verify it: a team cannot sign for another
    assert not verify(namespace_key(KEY, "team-b"), "notification", headers, data)
    assert json.loads(data)["type"] == "Promoted"


SECURITY_MD = Path(__file__).resolve().parents[3] / "docs" / "security.md"


def documented_verify() -> Callable[..., bool]:
    """The receiver's check as docs/security.md shows it (standard library only), run as written."""
    (code,) = [
        c for c in re.findall(r"```python\n(.*?)```", SECURITY_MD.read_text(), re.S) if "def verify" in c
    ]
    scope: dict[str, Any] = {}
    exec(compile(code, str(SECURITY_MD), "exec"), scope)
    return scope["verify_modeldeploy"]


@pytest.mark.parametrize("check", ["shipped", "documented"])
def test_a_late_replay_a_notification_shown_as_a_gate_and_a_tampered_body_are_refused(check):
    """What a receiver checks (notify.verify, and the snippet docs/security.md gives teams): the key, the
    purpose, the body and the timestamp, each enough to refuse."""
    ok = verify if check == "shipped" else documented_verify()
    key, t0 = namespace_key(KEY, "team-a"), 1_765_000_000.0
    data = b'{"type": "Promoted"}'
    headers = signed_headers(key, "notification", data, now=t0)
    assert ok(key, "notification", headers, data, now=t0 + 299)
    assert ok(key, "notification", {k.lower(): v for k, v in headers.items()}, data, now=t0 - 299)
    assert not ok(key, "notification", headers, data, now=t0 + 301)  # replayed after the tolerance
    assert not ok(key, "notification", headers, data, now=t0 - 301)  # a timestamp from the future
    assert not ok(key, "gate", headers, data, now=t0)  # a notification presented as a gate's ask
    gate_ask = signed_headers(key, "gate", data, now=t0)
    assert ok(key, "gate", gate_ask, data, now=t0) and not ok(key, "notification", gate_ask, data, now=t0)
    assert not ok(key, "notification", headers, data.replace(b"Promoted", b"RolledBack"), now=t0)
    later = {**headers, TIMESTAMP_HEADER: str(int(t0) + 200)}  # a fresh timestamp on an old signature
    assert not ok(key, "notification", later, data, now=t0 + 200)
    assert not ok(namespace_key(KEY, "team-b"), "notification", headers, data, now=t0)
    for broken in (
        {SIGNATURE_HEADER: headers[SIGNATURE_HEADER]},
        {TIMESTAMP_HEADER: headers[TIMESTAMP_HEADER]},
    ):
        assert not ok(key, "notification", broken, data, now=t0)
    body_only = hmac.new(key, data, hashlib.sha256).hexdigest()  # the old scheme: the body alone
    assert not ok(key, "notification", {**headers, SIGNATURE_HEADER: f"sha256={body_only}"}, data, now=t0)
    assert not ok(key, "notification", {**headers, SIGNATURE_HEADER: f"v1={body_only}"}, data, now=t0)


def test_only_the_events_a_webhook_asked_for_are_sent(serve, notifier):
    r = serve()
    started = notification_for("ns", "m", "CanaryStarted", "Normal", "revision a", T0)
    assert started is not None
    notifier.send(started, [Webhook(r.url, events=("Promoted",))])
    notifier.send(promoted(), [Webhook(r.url, events=("Promoted",))])
    wait_for(lambda: len(r.got) == 1 and notifier.pending() == 0)
    assert [json.loads(d)["type"] for d in r.bodies()] == ["Promoted"]


def test_a_receiver_answering_500_is_tried_three_times_then_counted_failed(serve, notifier):
    r = serve(status=500)
    failed = count("failed")
    notifier.send(promoted(), [Webhook(r.url)])
    wait_for(lambda: notifier.pending() == 0)
    assert len(r.got) == 3 and count("failed") == failed + 1


def test_a_hanging_receiver_never_makes_send_wait_and_costs_a_timeout_per_try(serve):
    r = serve(hang=True)
    n = Notifier(KEY, attempts=2, backoff=0.05).start()
    try:
        t0 = time.monotonic()
        for _ in range(20):
            n.send(promoted(), [Webhook(r.url, timeout=0.5)])
        assert time.monotonic() - t0 < 0.2  # queued, not sent, by the caller
        failed = count("failed")
        wait_for(lambda: n.pending() == 0, timeout=15)
        assert count("failed") == failed + 20
    finally:
        n.stop()


def test_a_full_queue_drops_and_counts(serve):
    r = serve(hang=True)
    n = Notifier(KEY, attempts=1, queue_size=2, concurrency=1).start()
    try:
        dropped = count("dropped")
        for _ in range(5):
            n.send(promoted(), [Webhook(r.url, timeout=5)])
        assert count("dropped") == dropped + 3 and n.pending() == 2
    finally:
        n.stop()


def test_without_a_signing_key_nothing_is_signed(serve):
    r = serve()
    n = Notifier(None).start()
    try:
        n.send(promoted(), [Webhook(r.url)])
        wait_for(lambda: r.got)
    finally:
        n.stop()
    assert SIGNATURE_HEADER.lower() not in r.got[0][1]


def test_a_host_the_operator_does_not_allow_is_refused_and_counted(serve):
    r = serve()
    n = Notifier(KEY, allowed_hosts=("hooks.example.com", "*.slack.com")).start()
    try:
        refused = count("refused")
        n.send(promoted(), [Webhook(r.url)])  # 127.0.0.1: not allowed
        assert count("refused") == refused + 1 and n.pending() == 0
    finally:
        n.stop()
    assert host_allowed("https://T0.hooks.slack.com/x", ("*.slack.com",))
    assert not host_allowed("http://169.254.169.254/latest", ("*.slack.com", "hooks.example.com"))
    assert host_allowed("http://anything/", ())
    time.sleep(0.2)
    assert r.got == []


BAD = ("http://[::1/x", "http://h:99999/")  # admitted by the CRD's pattern before its URL rule


def test_a_webhook_url_that_does_not_parse_never_raises_and_the_webhooks_after_it_are_still_told(serve):
    r = serve()
    n = Notifier(KEY, allowed_hosts=("127.0.0.1",)).start()
    try:
        refused = count("refused")
        n.send(promoted(), [Webhook(BAD[0]), Webhook(BAD[1]), Webhook(r.url)])
        n.send(promoted(), [Webhook(r.url)])
        wait_for(lambda: len(r.got) == 2 and n.pending() == 0)
        assert count("refused") == refused + 2
    finally:
        n.stop()
    for url in BAD:
        assert url_origin(url) == INVALID_URL
        assert not host_allowed(url, ()) and not host_allowed(url, ("*",))


def test_a_stored_notification_url_the_crd_now_refuses_is_an_invalid_spec_and_never_raises():
    """An object admitted before the CRD's URL rule: the reconcile that starts its canary reports the
    field (Degraded, InvalidSpec, a Warning event) and returns; it used to raise from the host check
    while notifying CanaryStarted, on every retry, losing the events after it."""
    w = World(canary_md())
    w.rec.notifier = Notifier(KEY)  # not started: what it is sent is dropped, after the host check
    w.deploy_first()
    w.new_version("2")
    w.raw["spec"]["rollout"]["notifications"] = [{"url": BAD[0]}]  # as stored, never parsed by a model
    w.reconcile(rounds=2)
    degraded = w.cond("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "spec.rollout.notifications.0.url" in degraded["message"], degraded
    assert "Invalid IPv6 URL" in degraded["message"]
    (event,) = [e for e in w.fake.events if e["reason"] == "InvalidSpec"]
    assert event["type"] == "Warning" and "spec.rollout.notifications.0.url" in event["message"]


def test_the_plugin_prints_a_namespaces_key_without_a_cluster(tmp_path, capsys, monkeypatch):
    from modeldeploy import cli

    key = tmp_path / "key"
    key.write_bytes(KEY)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert cli.main(["notification-key", "--key-file", str(key), "-n", "team-a"]) == 0
    assert capsys.readouterr().out.strip() == namespace_key(KEY, "team-a").hex()
