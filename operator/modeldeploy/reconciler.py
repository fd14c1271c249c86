"""One reconcile of one ModelDeployment: observe -> plan (pure) -> write only what differs.

Synchronous on purpose (runs in a worker thread); all decisions are in :mod:`modeldeploy.plan`.
A reconcile of a ModelDeployment whose children and status are as desired issues no write at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from . import metrics
from .analysis import Judgement, Query, Sample, agreement_queries, judge, window
from .api import (
    API_VERSION,
    KIND,
    ModelDeployment,
    ModelDeploymentStatus,
    deprecated_fields,
    parse_duration,
)
from .builders import ANNOTATION_SHADOW, FIELD_MANAGER, LABEL_NAME, READINESS_GATE
from .childcache import ChildCache
from .diff import Path, mismatches, needs_apply
from .events import EventSink, PostNow
from .kube import (
    BY_KIND,
    DEPLOYMENT,
    ENDPOINTSLICE,
    HTTPROUTE,
    MODELDEPLOYMENT,
    PDB,
    POD,
    SCALEDOBJECT,
    SERVICE,
    Kube,
    KubeError,
    ResourceType,
)
from .notify import Notifier, Webhook, notification_for, own_webhooks
from .plan import EventSpec, Observed, Plan, plan
from .rollout_types import COMMAND_ANNOTATION, AnalysisRequest, Gates
from .status import status_patch, utcnow
from .status_build import error_status, invalid_spec_status, invalid_status_patch

log = logging.getLogger(__name__)

COMPONENT = "modeldeploy"


@dataclass
class Result:
    writes: int = 0
    requeue_after: float | None = None
    plan: Plan | None = None


class Conflict(Exception):
    """The ModelDeployment changed while we computed its status; try again."""


class Measurements(Protocol):
    """Where analysis answers come from without waiting (:class:`~modeldeploy.measurements.MeasurementRunner`;
    an immediate fake in unit tests)."""

    def request(
        self, key: tuple[str, str], url: str, timeout: float, queries: Sequence[Query]
    ) -> list[Sample] | None: ...

    def latest(
        self, key: tuple[str, str], url: str, timeout: float, query: Query, refresh: float
    ) -> Sample | None: ...


#: how old the shadow stage's probe answers may be before a new one is asked for
PROBE_REFRESH = 2.0


class PrometheusProbe:
    """The shadow stage's questions to Prometheus outside an analysis window (:class:`rollout_types.Probe`):
    the newest finished answers, never a wait."""

    def __init__(self, measurements: Measurements, key: tuple[str, str], url: str, timeout: float) -> None:
        self.measurements = measurements
        self.key, self.url, self.timeout = key, url, timeout

    def _value(self, metric: str, promql: str, revision: str) -> float | Exception | None:
        q = Query(metric, promql, None, "max", revision)
        s = self.measurements.latest(self.key, self.url, self.timeout, q, PROBE_REFRESH)
        if s is None:
            return RuntimeError("not measured yet")
        return RuntimeError(s.error) if s.error is not None else s.value

    def copying(self, namespace: str, name: str, source: str, target: str) -> int | None:
        sel = (
            f'namespace="{namespace}",modeldeploy_io_name="{name}",modeldeploy_io_revision="{source}",'
            f'shadow_revision="{target}"'
        )
        v = self._value("copying", f"count(modelserver_shadow_active{{{sel}}} == 1)", target)
        if isinstance(v, Exception):
            return None
        return int(v) if v is not None else 0

    def agreement(
        self, namespace: str, name: str, target: str, seconds: float
    ) -> tuple[float | None, int | None]:
        compared, agreed = agreement_queries(namespace, name, target, window(f"{max(1, round(seconds))}s"))
        n = self._value("live-samples", compared, target)
        share = self._value("live-agreement", agreed, target)
        return (
            share if isinstance(share, float) else None,
            round(n) if isinstance(n, float) else None,
        )


class Reconciler:
    def __init__(
        self,
        kube: Kube,
        *,
        instance: str = "modeldeploy",
        clock: Callable[[], datetime] = utcnow,
        prometheus_url: str = "http://127.0.0.1:9090",
        measurements: Measurements | None = None,
        cache: ChildCache | None = None,
        events: EventSink | None = None,
        notifier: Notifier | None = None,
        webhooks: Sequence[Webhook] = (),
        gates: Gates | None = None,
    ):
        self.kube = kube
        # rollout notifications (queued, never waited for): every ModelDeployment's to ``webhooks`` (the
        # cluster-wide default), and each one's to its own spec.rollout.notifications
        self.notifier = notifier
        self.webhooks = tuple(webhooks)
        # where spec.rollout.gates are asked (modeldeploy.gates: in the background, never waited for);
        # None: a gate is never answered, and a rollout with one waits at it
        self.gates = gates
        # where Events go: posted before the reconcile goes on, unless the operator hands a background poster
        self.events = events or PostNow(kube)
        # children from the watches (no LIST per reconcile); None: LIST them
        self.cache = cache
        self.instance = instance
        self.clock = clock
        self.prometheus_url = prometheus_url
        # None: no analysis at all (windows are never judged; a rollout waits at its first step)
        self.measurements = measurements
        # paths the apiserver rewrites in an object we apply (learned from apply answers)
        self._normalized: dict[tuple[str, str, str], frozenset[Path]] = {}
        # the last InvalidStatus message posted as an event, per ModelDeployment (one event per message)
        self._reported_status: dict[tuple[str, str], str] = {}
        # deprecated fields told about (namespace, name, generation, message): one event each
        self._deprecations_told: set[tuple[str, str, Any, str]] = set()

    # -------------------------------------------------------------------------------- observe
    def observe(self, namespace: str, name: str, routes: bool = False, autoscaler: bool = False) -> Observed:
        selector = f"{LABEL_NAME}={name}"
        cache = self.cache

        def children(rt: ResourceType) -> list[dict[str, Any]]:
            if cache is not None and cache.serves(rt.kind):
                return cache.children(rt, namespace, name)
            return self.kube.list(rt, namespace, selector)

        return Observed(
            deployments=children(DEPLOYMENT),
            services=children(SERVICE),
            pdbs=children(PDB),
            pods=children(POD),
            routes=children(HTTPROUTE) if routes else [],
            endpoint_slices=children(ENDPOINTSLICE) if routes else None,
            scaled_objects=self._scaled_objects(namespace, selector) if autoscaler else [],
        )

    def _scaled_objects(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        try:
            return self.kube.list(SCALEDOBJECT, namespace, selector)
        except KubeError as e:
            if e.status == 404:  # KEDA is not installed: applying the ScaledObject will say so
                return []
            raise

    # -------------------------------------------------------------------------------- analysis
    def _prometheus(self, md: ModelDeployment) -> tuple[str, float]:
        a = md.spec.rollout.analysis
        return a.prometheus_url or self.prometheus_url, parse_duration(a.query_timeout)

    def probe_for(self, md: ModelDeployment) -> PrometheusProbe | None:
        if self.measurements is None:
            return None
        return PrometheusProbe(self.measurements, (md.namespace, md.name), *self._prometheus(md))

    def measure_for(self, md: ModelDeployment) -> Callable[[AnalysisRequest], Judgement | None] | None:
        """The analysis the plan calls when a window is due: the finished measurement of its queries, or
        None while it runs (never a wait on Prometheus)."""
        measurements = self.measurements
        if measurements is None:
            return None

        def measure(req: AnalysisRequest) -> Judgement | None:
            url, timeout = self._prometheus(md)
            samples = measurements.request((md.namespace, md.name), url, timeout, req.queries(md))
            if samples is None:
                return None
            j = judge(samples, self.clock())
            for m in j.measurements:
                if m.value is not None:
                    metrics.ANALYSIS_VALUE.labels(namespace=md.namespace, name=md.name, metric=m.metric).set(
                        m.value
                    )
            return j

        return measure

    # -------------------------------------------------------------------------------- reconcile
    def reconcile(self, namespace: str, name: str) -> Result:
        started = time.monotonic()
        raw = self.kube.get(MODELDEPLOYMENT, namespace, name)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            metrics.RECONCILES.labels(result="gone").inc()
            metrics.forget(namespace, name)
            return Result()  # children go with it (owner references, garbage collection)
        try:
            md = ModelDeployment.from_api(raw)
        except ValidationError as e:
            unreadable = [x for x in e.errors() if x["loc"][:1] == ("status",)]
            if unreadable:
                return self._unreadable_status(raw, unreadable)
            return self._invalid(raw, e)
        self._reported_status.pop((namespace, name), None)
        try:
            result = self._reconcile(raw, md)
        except KubeError as e:
            if not e.namespace_terminating:
                self._failed(raw, md, e)
                raise
            metrics.RECONCILES.labels(result="gone").inc()
            log.info("%s/%s: the namespace is being deleted; nothing to do", namespace, name)
            return Result()
        except Exception as e:
            self._failed(raw, md, e)
            raise
        finally:
            metrics.RECONCILE_DURATION.observe(time.monotonic() - started)
        metrics.RECONCILES.labels(result="changed" if result.writes else "unchanged").inc()
        return result

    def _failed(self, raw: dict[str, Any], md: ModelDeployment, e: Exception) -> None:
        metrics.RECONCILES.labels(result="error").inc()
        metrics.RECONCILE_ERRORS.labels(error=type(e).__name__).inc()
        self._report_failure(raw, md, e)

    def _reconcile(self, raw: dict[str, Any], md: ModelDeployment) -> Result:
        ns, name = md.namespace, md.name
        self._warn_deprecated(raw, md)
        observed = self.observe(
            ns,
            name,
            routes=md.spec.rollout.traffic_routing.mode == "gatewayAPI",
            autoscaler=md.spec.autoscaling is not None or md.status.autoscaler is not None,
        )
        now = self.clock()
        p = plan(
            md,
            observed,
            now,
            self.measure_for(md),
            self.probe_for(md),
            prometheus_url=self.prometheus_url,
            gates=self.gates,
        )
        result = Result(plan=p, requeue_after=p.requeue_after)
        live = {
            (o["kind"], o["metadata"]["name"]): o
            for o in (
                *observed.deployments,
                *observed.services,
                *observed.pdbs,
                *observed.routes,
                *observed.scaled_objects,
            )
        }

        # traffic first: pods leave (or enter) traffic before anything is scaled or deleted
        for pod, gate_open in p.pod_gates:
            if self.set_pod_gate(ns, pod, gate_open, now):
                result.writes += 1

        # one event for the objects this reconcile creates (a new ModelDeployment's four children: one
        # Event write, not four), also when an apply fails half way
        created: list[str] = []
        try:
            for obj in p.apply:
                if self._apply(raw, obj, live, result):
                    created.append(f"{obj['kind']} {obj['metadata']['name']}")
        finally:
            if created:
                self.event(raw, EventSpec("Normal", "Created", "created " + ", ".join(created)))

        for pod, target in p.pod_annotations:
            if self.set_pod_annotation(ns, pod, ANNOTATION_SHADOW, target):
                result.writes += 1

        for d in p.delete:
            rt = BY_KIND[d.kind]
            deleted = self.kube.delete(rt, ns, d.name, uid=d.uid or None)
            if self.cache is not None:
                self.cache.gone(d.kind, ns, d.name, d.uid or None, name)
            if deleted:
                result.writes += 1
                self._normalized.pop((d.kind, ns, d.name), None)
                self.event(raw, EventSpec("Normal", "Deleted", f"deleted {d.kind} {d.name}"))

        patch = status_patch(raw.get("status"), p.status)
        if patch is not None:
            self.write_status(raw, patch)
            result.writes += 1
        if p.clear_command:
            # handled (or stale): commands are conditional on the state they were issued against, so
            # handling one again after a crash before this point changes nothing
            self.kube.merge_patch(
                MODELDEPLOYMENT, ns, name, {"metadata": {"annotations": {COMMAND_ANNOTATION: None}}}
            )
            result.writes += 1
        for ev in p.events:
            self.event(raw, ev)
        _record_metrics(ns, name, p)
        return result

    # -------------------------------------------------------------------------------- writes
    def _apply(
        self,
        raw: dict[str, Any],
        obj: dict[str, Any],
        live: dict[tuple[str, str], dict[str, Any]],
        result: Result,
    ) -> bool:
        """Apply one child unless it is as desired; whether it was created."""
        ns = raw["metadata"]["namespace"]
        key = (obj["kind"], obj["metadata"]["name"])
        current = live.get(key)
        ignore = self._normalized.get((obj["kind"], ns, key[1]), frozenset())
        if not needs_apply(obj, current, ignore):
            return False
        if current is None:
            # not among our children: absent, or someone else's of the same name (the apply would take
            # it over, and deleting the ModelDeployment would then garbage-collect it)
            current = self.kube.get(BY_KIND[obj["kind"]], ns, key[1])
        if current is not None and not owned_by(current, raw):
            raise NameConflict(obj["kind"], key[1], current)
        drift = [] if current is None else mismatches(obj, current)
        try:
            answer = self.kube.apply(obj, FIELD_MANAGER)
        except KubeError as e:
            if e.status == 404 and obj["kind"] == "ScaledObject":
                raise AutoscalerUnavailable(
                    "spec.autoscaling needs KEDA: this cluster does not serve keda.sh/v1alpha1 ScaledObjects"
                ) from e
            raise
        result.writes += 1
        if self.cache is not None:
            self.cache.wrote(answer)
        rewritten = frozenset(mismatches(obj, answer))
        if rewritten:
            log.warning("%s %s/%s: the apiserver rewrote %s", obj["kind"], ns, key[1], sorted(rewritten))
        self._normalized[(obj["kind"], ns, key[1])] = rewritten
        if current is None:
            return True
        what = ", ".join(".".join(str(x) for x in d) for d in drift[:5]) or "desired state changed"
        self.event(raw, EventSpec("Normal", "Updated", f"updated {obj['kind']} {key[1]} ({what})"))
        return False

    def set_pod_gate(self, namespace: str, pod: str, gate_open: bool, now: datetime) -> bool:
        cond = {
            "type": READINESS_GATE,
            "status": "True" if gate_open else "False",
            "reason": "InTraffic" if gate_open else "OutOfTraffic",
            "message": "set by the modeldeploy operator",
            "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        try:
            answer = self.kube.strategic_patch(
                POD, namespace, pod, {"status": {"conditions": [cond]}}, sub="status"
            )
            if self.cache is not None:
                self.cache.wrote({"kind": "Pod", **answer})
            return True
        except KubeError as e:
            if e.status == 404:
                return False
            raise

    def set_pod_annotation(self, namespace: str, pod: str, key: str, value: str | None) -> bool:
        try:
            answer = self.kube.merge_patch(POD, namespace, pod, {"metadata": {"annotations": {key: value}}})
            if self.cache is not None:
                self.cache.wrote({"kind": "Pod", **answer})
            return True
        except KubeError as e:
            if e.status == 404:
                return False
            raise

    def write_status(self, raw: dict[str, Any], patch: dict[str, Any]) -> None:
        meta = raw["metadata"]
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": patch}
        try:
            self.kube.merge_patch(MODELDEPLOYMENT, meta.get("namespace"), meta["name"], body, sub="status")
        except KubeError as e:
            if e.status == 409:
                raise Conflict(str(e)) from e
            raise

    def event(self, raw: dict[str, Any], ev: EventSpec) -> None:
        """Post a core/v1 Event about the ModelDeployment (best effort: never fails a reconcile)."""
        meta = raw["metadata"]
        now = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace", "default")},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta.get("namespace", "default"),
                "uid": meta.get("uid"),
            },
            "type": ev.type,
            "reason": ev.reason,
            "message": ev.message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        metrics.EVENTS.labels(type=ev.type, reason=ev.reason).inc()
        log_fn = log.warning if ev.type == "Warning" else log.info
        log_fn("%s/%s: %s: %s", meta.get("namespace"), meta["name"], ev.reason, ev.message)
        self.events.post(body)
        if self.notifier is not None:
            self._notify(raw, ev)

    def _notify(self, raw: dict[str, Any], ev: EventSpec) -> None:
        """Queue the notification ``ev`` is, if any, for the default webhooks and the resource's own."""
        meta = raw["metadata"]
        n = notification_for(
            meta.get("namespace", "default"), meta["name"], ev.reason, ev.type, ev.message, self.clock()
        )
        if n is None or self.notifier is None:
            return
        hooks = [*self.webhooks, *own_webhooks(raw)]
        if hooks:
            self.notifier.send(n, hooks)

    def _warn_deprecated(self, raw: dict[str, Any], md: ModelDeployment) -> None:
        """A Warning Event ``DeprecatedField`` per deprecated field a ModelDeployment (this generation of
        it) uses, once per operator process."""
        for message in deprecated_fields(md.spec):
            key = (md.namespace, md.name, raw["metadata"].get("generation"), message)
            if key not in self._deprecations_told:
                self._deprecations_told.add(key)
                self.event(raw, EventSpec("Warning", "DeprecatedField", message))

    # -------------------------------------------------------------------------------- failures
    def _invalid(self, raw: dict[str, Any], err: ValidationError) -> Result:
        """A spec the apiserver accepted but the models refuse (e.g. an old CRD): report, do nothing.

        Only called when the status itself reads (see :meth:`_unreadable_status`), so the rollout state
        in it is kept as it is; only the Degraded condition, phase and observedGeneration change."""
        metrics.RECONCILES.labels(result="invalid").inc()
        message = _fields(err.errors())
        meta = raw["metadata"]
        old = raw.get("status") or {}
        st = ModelDeploymentStatus.model_validate(old)
        new = invalid_spec_status(st, int(meta.get("generation", 0)), message, self.clock())
        patch = status_patch(old, new)
        writes = 0
        if patch is not None:
            self.write_status(raw, patch)
            self.event(raw, EventSpec("Warning", "InvalidSpec", message))
            writes = 1
        return Result(writes=writes)

    def _unreadable_status(self, raw: dict[str, Any], errors: list[Any]) -> Result:
        """A status the models cannot read (a wrong type, or a value this operator does not know, e.g.
        after a downgrade or a hand edit): the rollout state is unknown, so nothing is done -- no child
        is applied, scaled or deleted, no pod gate moves, no rollout field of status is replaced.
        Reported as ``Degraded=True``, reason ``InvalidStatus``, naming the fields, and a Warning event;
        the first reconcile after the status is fixed (or by an operator that reads it) resumes the
        rollout where it was.

        Only ``conditions`` and ``phase`` are written, only when neither is among the unreadable fields,
        and best effort (the apiserver may refuse any status write while a field breaks its schema)."""
        metrics.RECONCILES.labels(result="invalid").inc()  # as an invalid spec: the reason tells
        meta = raw["metadata"]
        message = (
            f"{_fields(errors)}; the operator does not act on this ModelDeployment until its status "
            f"can be read (fix or remove these fields: kubectl edit md {meta['name']} --subresource=status)"
        )
        key = (str(meta.get("namespace")), str(meta["name"]))
        old = raw.get("status") or {}
        bad = {str(e["loc"][1]) if len(e["loc"]) > 1 else "" for e in errors}
        writes = 0
        if not bad & {"", "conditions", "phase"}:
            patch = invalid_status_patch(old, message, int(meta.get("generation", 0)), self.clock())
            if patch is None:
                return Result()  # reported already
            try:
                self.write_status(raw, patch)
                writes = 1
            except (Conflict, KubeError) as e:
                log.warning("%s/%s: could not write the InvalidStatus condition: %s", *key, e)
        if self._reported_status.get(key) != message:
            self._reported_status[key] = message
            self.event(raw, EventSpec("Warning", "InvalidStatus", message))
        return Result(writes=writes)

    def _report_failure(self, raw: dict[str, Any], md: ModelDeployment, err: Exception) -> None:
        if isinstance(err, Conflict):
            return  # a newer version exists; it will be reconciled
        message = str(err)[:1000]
        reason = NameConflict.reason if isinstance(err, NameConflict) else "ReconcileError"
        self.event(raw, EventSpec("Warning", reason, message))
        try:
            patch = status_patch(raw.get("status"), error_status(md, message, self.clock(), reason))
            if patch is not None:
                self.write_status(raw, patch)
        except Exception as e:
            log.debug("could not record the failure in status: %s", e)


class NameConflict(RuntimeError):
    """A child's name is taken by an object this ModelDeployment does not own: nothing is written to it."""

    reason = "NameConflict"

    def __init__(self, kind: str, name: str, existing: dict[str, Any]) -> None:
        owners = [
            f"{o.get('kind')} {o.get('name')}"
            for o in existing.get("metadata", {}).get("ownerReferences") or []
        ]
        whose = f"owned by {', '.join(owners)}" if owners else "not owned by any object"
        super().__init__(
            f"{kind} {name} exists and is not this ModelDeployment's ({whose}); it is left as it is: delete "
            f"or rename it, or rename the ModelDeployment"
        )
        self.kind, self.name = kind, name


def owned_by(obj: dict[str, Any], owner: dict[str, Any]) -> bool:
    """Whether ``owner`` (a ModelDeployment) is ``obj``'s controller, by uid."""
    uid = owner["metadata"].get("uid")
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


class AutoscalerUnavailable(RuntimeError):
    """spec.autoscaling is set and the cluster has no KEDA."""


def _fields(errors: Sequence[Any], limit: int = 5) -> str:
    """``spec.rollout.steps: ...; status.step: ...``: the fields a ValidationError names, with why."""
    return "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in errors[:limit])


def _record_metrics(ns: str, name: str, p: Plan) -> None:
    """The operator metrics one reconcile's plan sets: rollout results, canary weight, fallback."""
    for r in p.results:
        metrics.ROLLOUTS.labels(result=r).inc()
    weight = p.status.achieved_canary_weight if p.status.canary_revision else None
    metrics.CANARY_WEIGHT.labels(namespace=ns, name=name).set(weight or 0)
    fb = p.status.fallback
    metrics.FALLBACK_ACTIVE.labels(namespace=ns, name=name).set(int(fb is not None and fb.state != "Idle"))
