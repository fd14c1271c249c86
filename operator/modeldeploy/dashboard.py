"""``kubectl modeldeploy dashboard``: a local web page of every ModelDeployment's rollout.

The plugin itself serves it, on 127.0.0.1 only, and reads the cluster with the user's kubeconfig (the
plugin's :class:`~modeldeploy.kube.Kube`): nothing runs in the cluster, and the page can see exactly what
``kubectl get md`` can. Three static files (:mod:`modeldeploy.dashboard_page`: HTML, plain JavaScript,
CSS; nothing loaded from anywhere else) and one JSON endpoint, ``GET /api/modeldeployments``, which the
page polls every 1.5 s. Each answer is one LIST of ModelDeployments (all namespaces, or ``-n``), shaped
here by pure functions (:func:`shape_list`) into what the page draws: revisions and their roles, the
traffic weights, phase, conditions, the analysis windows of the current rollout with their verdicts,
one chart series per metric (canary vs stable vs threshold over the windows), and the history.

Safe by construction: bound to 127.0.0.1 (no flag to change it), GET only (anything else: 405), a
``Host`` header other than ``127.0.0.1:PORT`` or ``localhost:PORT`` is refused (403: a web page that
rebinds its own DNS name to 127.0.0.1 cannot read the cluster through it), and a Content-Security-Policy
that allows only the page's own script and requests. The page writes every string from the cluster with
``textContent``/``setAttribute``, never as HTML.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .analysis import P99, REQUESTS, SAMPLES, SHADOW_ERROR_RATE
from .dashboard_page import PAGE_CSS, PAGE_HTML, PAGE_JS
from .kube import MODELDEPLOYMENT, Kube, KubeError

DEFAULT_PORT = 8090
#: how often the page asks (milliseconds; the page reads it from the JSON answer)
POLL_MS = 1500
#: answers younger than this are served again (several tabs, one LIST)
CACHE_S = 0.5
#: the default steps of spec.rollout (api_rollout.py)
DEFAULT_STEPS = [5, 25, 50, 100]

REVISION_FIELDS = (
    "revision",
    "role",
    "modelVersion",
    "replicas",
    "currentReplicas",
    "readyReplicas",
    "inTrafficReplicas",
    "unschedulableReplicas",
    "schedulingMessage",
)
CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")
MEASUREMENT_FIELDS = ("metric", "revision", "time", "query", "value", "threshold", "verdict", "error")
JUDGE_FIELDS = ("canary", "stable", "canarySamples", "stableSamples", "low", "high", "pValue", "reason")


# ------------------------------------------------------------------------------------------ shaping


def _pick(obj: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    return {f: obj.get(f) for f in fields}


def shape_measurement(m: dict[str, Any]) -> dict[str, Any]:
    """One measurement as the page shows it (the fields of api_status.Measurement; ``judge`` only for the
    statistical judge's metrics)."""
    out = _pick(m, MEASUREMENT_FIELDS)
    out["dryRun"] = bool(m.get("dryRun"))
    out["judge"] = _pick(m["judge"], JUDGE_FIELDS) if m.get("judge") else None
    return out


def window_verdict(measurements: list[dict[str, Any]]) -> str:
    """A window's verdict from its stored measurements, in the order ``analysis.judge`` decides (dry-run
    measurements never count): an error; too few requests (NoData, unless a shadow's failing copies
    decide); a failed check; a required value missing; an inconclusive comparison; else Pass."""
    decisive = [m for m in measurements if not m.get("dryRun")]
    verdicts = {m.get("verdict") for m in decisive}
    if "Error" in verdicts:
        return "Error"
    failed = [m for m in decisive if m.get("verdict") == "Fail"]
    gate = next((m for m in decisive if m.get("metric") in (REQUESTS, SAMPLES)), None)
    if gate is not None and gate.get("verdict") != "Pass":
        broken = gate["metric"] == SAMPLES and any(m["metric"] in (SHADOW_ERROR_RATE, P99) for m in failed)
        return "Fail" if broken else "NoData"
    for verdict in ("Fail", "NoData", "Inconclusive"):
        if verdict in verdicts:
            return verdict
    return "Pass"


def focus_revision(st: dict[str, Any]) -> str | None:
    """The revision of "the current rollout": the canary (or shadow) while there is one, else the
    revision measured last (a rolled-back canary, a promoted revision in its bake time)."""
    if st.get("canaryRevision"):
        return str(st["canaryRevision"])
    if (st.get("shadow") or {}).get("revision"):
        return str(st["shadow"]["revision"])
    measured = [m for m in (st.get("analysis") or {}).get("measurements") or [] if m.get("revision")]
    if not measured:
        return None
    return str(max(measured, key=lambda m: str(m.get("time") or ""))["revision"])


def windows(measurements: list[dict[str, Any]], revision: str | None) -> list[dict[str, Any]]:
    """The analysis windows of ``revision``, oldest first: the measurements taken at one time (one
    judged window writes all of its measurements with the same ``time``) and the window's verdict."""
    by_time: dict[str, list[dict[str, Any]]] = {}
    for m in measurements:
        if m.get("revision") in (revision, None):
            by_time.setdefault(str(m.get("time") or ""), []).append(m)
    return [
        {"time": t, "verdict": window_verdict(ms), "measurements": [shape_measurement(m) for m in ms]}
        for t, ms in sorted(by_time.items())
    ]


def relative_increase(metric: str) -> bool:
    """Whether a judge metric's threshold is a relative increase (latency, TTFT) rather than an absolute
    one (the error share); the plugin's text chart reads it the same way."""
    return "latency" in metric or "ttft" in metric


def _judge_point(m: dict[str, Any]) -> dict[str, Any]:
    """A judge window: the canary's and the stable's median sample, and the most the canary's median may
    be (the stable's plus the allowed increase, relative or absolute)."""
    j, limit = m["judge"], m.get("threshold")
    stable = j.get("stable")
    allowed = None
    if stable is not None and limit is not None:
        allowed = stable * (1 + limit) if relative_increase(str(m.get("metric"))) else stable + limit
    return {"canary": j.get("canary"), "stable": stable, "threshold": allowed, "increase": m.get("value")}


def charts(
    measurements: list[dict[str, Any]], revision: str | None, stable: str | None
) -> list[dict[str, Any]]:
    """One chart per metric of ``revision``'s windows, points oldest first: the canary's value, the
    stable's value of the same metric in the same window where one was measured (for the judge: both
    medians), and the threshold, with the measurement's verdict."""
    stable_values = {
        (m.get("metric"), m.get("time")): m.get("value")
        for m in measurements
        if stable is not None and m.get("revision") == stable
    }
    out: dict[str, dict[str, Any]] = {}
    for m in sorted(measurements, key=lambda m: str(m.get("time") or "")):
        if m.get("revision") != revision:
            continue
        metric = str(m.get("metric"))
        chart = out.setdefault(
            metric, {"metric": metric, "kind": "judge" if m.get("judge") else "threshold", "points": []}
        )
        if m.get("judge"):
            point = _judge_point(m)
        else:
            point = {
                "canary": m.get("value"),
                "stable": stable_values.get((m.get("metric"), m.get("time"))),
                "threshold": m.get("threshold"),
            }
        point.update(time=m.get("time"), verdict=m.get("verdict"), dryRun=bool(m.get("dryRun")))
        chart["points"].append(point)
    return list(out.values())


def _step(spec: dict[str, Any], st: dict[str, Any]) -> dict[str, Any] | None:
    rollout = spec.get("rollout") or {}
    steps = rollout.get("steps") or DEFAULT_STEPS
    index = st.get("step")
    if index is None or not st.get("canaryRevision"):
        return None
    weight = steps[index] if 0 <= index < len(steps) else None
    return {"index": index, "count": len(steps), "weight": weight, "paused": bool(rollout.get("paused"))}


def shape_modeldeployment(md: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of one ModelDeployment (pure)."""
    meta, spec, st = md.get("metadata") or {}, md.get("spec") or {}, md.get("status") or {}
    analysis = st.get("analysis") or {}
    measurements = analysis.get("measurements") or []
    focus = focus_revision(st)
    model = spec.get("model") or {}
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "generation": meta.get("generation"),
        "observedGeneration": st.get("observedGeneration"),
        "model": {"name": model.get("name"), "version": model.get("version")},
        "phase": st.get("phase"),
        "ready": st.get("ready"),
        "revision": st.get("revision"),
        "stableRevision": st.get("stableRevision"),
        "canaryRevision": st.get("canaryRevision"),
        "previousRevision": st.get("previousRevision"),
        "previousExpiresAt": st.get("previousExpiresAt"),
        "canaryWeight": st.get("canaryWeight"),
        "achievedCanaryWeight": st.get("achievedCanaryWeight"),
        "step": _step(spec, st),
        "steps": (spec.get("rollout") or {}).get("steps") or DEFAULT_STEPS,
        "revisions": [_pick(r, REVISION_FIELDS) for r in st.get("revisions") or []],
        "conditions": [_pick(c, CONDITION_FIELDS) for c in st.get("conditions") or []],
        "analysis": {
            "revision": focus,
            "consecutiveFailures": analysis.get("consecutiveFailures", 0),
            "pausedReason": analysis.get("pausedReason"),
            "windows": windows(measurements, focus),
            "charts": charts(measurements, focus, st.get("stableRevision")),
        },
        "history": [
            {
                **_pick(h, ("revision", "outcome", "time", "reason")),
                "measurement": shape_measurement(h["measurement"]) if h.get("measurement") else None,
            }
            for h in st.get("history") or []
        ],
    }


def shape_list(items: list[dict[str, Any]], namespace: str | None, now: datetime) -> dict[str, Any]:
    """The JSON answer of ``/api/modeldeployments`` (pure): every ModelDeployment, by namespace and name."""
    mds = sorted(items, key=lambda md: (md["metadata"].get("namespace", ""), md["metadata"]["name"]))
    return {
        "time": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "namespace": namespace,
        "pollMs": POLL_MS,
        "error": None,
        "items": [shape_modeldeployment(md) for md in mds],
    }


# ------------------------------------------------------------------------------------------ serving

STATIC = {
    "/": ("text/html; charset=utf-8", PAGE_HTML),
    "/dashboard.js": ("text/javascript; charset=utf-8", PAGE_JS),
    "/dashboard.css": ("text/css; charset=utf-8", PAGE_CSS),
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Snapshot:
    """The shaped list, at most :data:`CACHE_S` old; errors from the apiserver become the answer's
    ``error`` (shown by the page), not a dead server."""

    def __init__(self, fetch: Callable[[], list[dict[str, Any]]], namespace: str | None) -> None:
        self.fetch, self.namespace = fetch, namespace
        self._lock = threading.Lock()
        self._at = 0.0
        self._body = b""

    def body(self) -> bytes:
        with self._lock:
            if time.monotonic() - self._at > CACHE_S:
                now = datetime.now(UTC)
                try:
                    answer = shape_list(self.fetch(), self.namespace, now)
                except KubeError as e:
                    answer = {**shape_list([], self.namespace, now), "error": e.message}
                except Exception as e:  # the apiserver unreachable, a kubeconfig token expired, ...
                    answer = {**shape_list([], self.namespace, now), "error": f"{type(e).__name__}: {e}"}
                self._body = json.dumps(answer, sort_keys=True).encode()
                self._at = time.monotonic()
            return self._body


def make_server(
    fetch: Callable[[], list[dict[str, Any]]], namespace: str | None, port: int = DEFAULT_PORT
) -> ThreadingHTTPServer:
    """The dashboard's HTTP server on 127.0.0.1:``port`` (0: any free port), not yet serving."""
    snapshot = Snapshot(fetch, namespace)
    hosts: set[str] = set()  # 127.0.0.1:PORT and localhost:PORT, once the port is bound

    class Handler(BaseHTTPRequestHandler):
        def version_string(self) -> str:
            return "kubectl-modeldeploy-dashboard"

        def _send(self, code: int, ctype: str, body: bytes, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in {**SECURITY_HEADERS, **(extra or {})}.items():
                self.send_header(k, v)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.headers.get("Host") not in hosts:
                self._send(403, "text/plain; charset=utf-8", b"forbidden: use http://127.0.0.1:PORT/\n")
                return
            path = self.path.split("?", 1)[0]
            if path == "/api/modeldeployments":
                self._send(200, "application/json", snapshot.body())
            elif path in STATIC:
                ctype, text = STATIC[path]
                self._send(200, ctype, text.encode())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found\n")

        def _refuse(self) -> None:
            self._send(405, "text/plain; charset=utf-8", b"read-only: GET only\n", {"Allow": "GET"})

        do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _refuse

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the page polls
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    hosts.update({f"127.0.0.1:{server.server_port}", f"localhost:{server.server_port}"})
    return server


def run(kube: Kube, args: argparse.Namespace) -> int:
    """Serve until interrupted (the plugin's ``dashboard`` command)."""
    namespace = None if args.all_namespaces or not args.namespace else args.namespace
    server = make_server(lambda: kube.list(MODELDEPLOYMENT, namespace), namespace, args.port)
    where = f"namespace {namespace}" if namespace else "all namespaces"
    print(f"ModelDeploy dashboard ({where}): http://127.0.0.1:{server.server_port}/", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0


def add_parser(sub: Any) -> None:
    """``dashboard [-n NS | -A] [--port N]`` on the plugin's subcommands."""
    d = sub.add_parser("dashboard", help="serve a live web page of every rollout on 127.0.0.1")
    d.add_argument("-n", "--namespace", default=None, help="only this namespace (default: all)")
    d.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (the default)")
    d.add_argument("-p", "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0: any")
    d.set_defaults(func=run)
