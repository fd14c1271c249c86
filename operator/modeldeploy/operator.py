"""The kopf operator: watch events in, reconciles out.

    python -m modeldeploy [--namespace NS ...] [--standalone] [--priority N] ...

(the flags and their ``MODELDEPLOY_*`` variables: :mod:`modeldeploy.settings`).

Handlers are thin: every watch event of a ModelDeployment or of one of its children (by the
``modeldeploy.io/name`` label, filtered server-side; HTTPRoutes too unless ``--no-watch-httproutes``)
only enqueues the ModelDeployment in the
:class:`~modeldeploy.controller.Controller`; the reconcile itself is :mod:`modeldeploy.reconciler`.

kopf settings: only ``@kopf.on.event`` handlers, indices, a startup handler and a probe are registered --
no change handlers (on.create/update/delete/resume/field), no timers or daemons -- so kopf stores no
progress and no diff-base on our objects and adds no finalizer (children go with their owner through
garbage collection); its progress and diff-base storages are left at kopf's defaults, which nothing reads
or writes. The finalizer's name is set, to ``modeldeploy.io/finalizer``: on every watched object kopf
removes the finalizer of that name when no handler needs it, and with kopf's default name it would remove
the marker of another kopf operator handling the same objects. Peering
(mandatory unless ``--standalone``) makes two operator replicas never act at once: kopf pauses every
replica that sees a live peer of higher or equal priority, and the default priority is random.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf

from . import api, metrics
from .builders import LABEL_NAME
from .childcache import ChildCache, index_key, trimmed
from .controller import Controller, PeeringGate
from .events import PostInBackground
from .gates import GateAsker
from .kube import (
    BY_KIND,
    CLUSTER_PEERING,
    DEPLOYMENT,
    ENDPOINTSLICE,
    HTTPROUTE,
    PDB,
    PEERING,
    POD,
    SERVICE,
    Kube,
    KubeError,
    ResourceType,
)
from .measurements import MeasurementRunner
from .notify import Notifier, Webhook
from .promclient import PromConfig
from .reconciler import Reconciler
from .resync import Resyncer
from .settings import Settings, SettingsError, load_settings

log = logging.getLogger("modeldeploy")

CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("", "v1", "pods"),
)
# gatewayAPI mode's child: watched so that a deleted or edited route is repaired at once. Optional: a
# cluster without the Gateway API (kopf waits for the CRD), or an operator without the rights to watch
# routes (the chart's rbac.gatewayAPI=false), runs with --no-watch-httproutes.
HTTPROUTES = ("gateway.networking.k8s.io", "v1", "httproutes")
# and the EndpointSlices of the revision Services (the EndpointSlice controller copies a Service's labels
# onto its slices): a route weights a canary only once the gateway can know an endpoint of it
# (traffic_split.routable); watched so that the endpoint turning ready reconciles at once.
ENDPOINTSLICES = ("discovery.k8s.io", "v1", "endpointslices")


def child_resources(watch_httproutes: bool) -> tuple[tuple[str, str, str], ...]:
    return (*CHILD_RESOURCES, HTTPROUTES, ENDPOINTSLICES) if watch_httproutes else CHILD_RESOURCES


ANNOTATION_PREFIX = "modeldeploy.io"


def kopf_settings(args: Settings) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # kopf strips this finalizer from each watched object that has it (no handler of ours needs one): ours,
    # so that it never strips kopf's default marker, which another kopf operator may have put there
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    # our own events are posted by the reconciler; kopf's log-to-event posting would add writes
    settings.posting.enabled = False
    settings.peering.name = args.peering_name
    settings.peering.priority = args.priority
    settings.peering.standalone = args.standalone
    settings.peering.mandatory = not args.standalone
    settings.peering.lifetime = args.peering_lifetime
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    # only children carrying our label are watched (server-side filter)
    for group, version, plural in child_resources(args.watch_httproutes):
        settings.watching.label_selectors[(group, version, plural)] = LABEL_NAME
    return settings


KIND_OF_PLURAL = {
    "deployments": DEPLOYMENT.kind,
    "services": SERVICE.kind,
    "poddisruptionbudgets": PDB.kind,
    "pods": POD.kind,
    "httproutes": HTTPROUTE.kind,
    "endpointslices": ENDPOINTSLICE.kind,
}


def index_id(plural: str) -> str:
    return f"children_{plural}"


def build_registry(
    controller: Controller,
    *,
    watch_httproutes: bool = True,
    cache: ChildCache | None = None,
    stuck_after: float = 300.0,
    on_listed: Callable[[], object] | None = None,
) -> kopf.OperatorRegistry:
    """The handlers. ``on_listed()`` is called for every child that a watch's listing (its start, or a
    relist after a 410) replays: the resync after a relist (:meth:`Resyncer.relisted`)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)

    @kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)
    async def modeldeployment_event(event: kopf.RawEvent, namespace: str | None, name: str, **_: Any) -> None:
        # async handlers run in the event loop (sync ones would run in threads): the queue is not thread-safe
        key = (namespace or "default", name)
        if event.get("type") == "DELETED":
            controller.forget(key)
            return
        controller.note(key)
        controller.enqueue(key)

    for group, version, plural in child_resources(watch_httproutes):

        @kopf.on.event(group, version, plural, labels={LABEL_NAME: kopf.PRESENT}, registry=registry)
        async def child_event(
            event: kopf.RawEvent, namespace: str | None, labels: Mapping[str, str], **_: Any
        ) -> None:
            if event.get("type") is None and on_listed is not None:  # replayed by a listing
                on_listed()
            owner = labels.get(LABEL_NAME)
            if owner and namespace:
                controller.enqueue((namespace, owner))

    if cache is not None:
        # the children in memory (modeldeploy.childcache): kopf fills these indices from its initial
        # listing before any other handler runs, and keeps them current from the same watches
        plurals = [plural for _, _, plural in child_resources(watch_httproutes)]
        for group, version, plural in child_resources(watch_httproutes):

            @kopf.index(
                group,
                version,
                plural,
                labels={LABEL_NAME: kopf.PRESENT},
                id=index_id(plural),
                registry=registry,
            )
            def child_index(
                namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
            ) -> dict[Any, Any]:
                key = index_key(namespace, labels)
                return {key: trimmed(body)} if key is not None else {}

        @kopf.on.startup(registry=registry)
        async def attach_cache(**kwargs: Any) -> None:
            cache.attach(
                asyncio.get_running_loop(), {KIND_OF_PLURAL[p]: kwargs[index_id(p)] for p in plurals}
            )

    @kopf.on.probe(id="queue", registry=registry)
    def queue_probe(**_: Any) -> dict[str, Any]:
        longest = controller.longest_running()
        busy = longest[1] if longest else 0.0
        metrics.WORKER_BUSY_SECONDS.set(busy)
        if longest is not None and busy > stuck_after:
            # liveness fails: kopf answers /healthz with 500 and the kubelet restarts the operator
            raise kopf.PermanentError(
                f"the reconcile of {longest[0][0]}/{longest[0][1]} has run for {busy:.0f}s "
                f"(over --stuck-after {stuck_after:g}s)"
            )
        return {"managed": len(controller.known), "idle": controller.idle, "longestReconcileSeconds": busy}

    return registry


def identity() -> str:
    pod = os.environ.get("POD_NAME") or os.environ.get("POD_ID")
    return pod or f"{socket.gethostname()}/{os.getpid()}"


def ensure_peering(kube: Kube, name: str, namespaces: list[str]) -> None:
    """Create the (Cluster)KopfPeering object if it is missing (kopf only patches it)."""
    targets: list[tuple[ResourceType, str | None]] = (
        [(PEERING, ns) for ns in namespaces] if namespaces else [(CLUSTER_PEERING, None)]
    )
    for rt, ns in targets:
        if kube.get(rt, ns, name) is None:
            meta: dict[str, Any] = {"name": name}
            if ns:
                meta["namespace"] = ns
            try:
                kube.create({"apiVersion": "kopf.dev/v1", "kind": rt.kind, "metadata": meta})
                log.info("created %s %s", rt.kind, name)
            except KubeError as e:
                if e.status == 404:
                    raise SystemExit(
                        f"the {rt.kind} CRD is not installed: kubectl apply -f crds/kopfpeering.yaml "
                        "(or run with --standalone for a single replica)"
                    ) from e
                if e.status != 409:
                    raise


def prometheus_config(args: Settings) -> Any:
    """How to reach a Prometheus URL: the operator's own gets its TLS settings and bearer token; a URL a
    ModelDeployment names gets the CA bundle only (its author must not receive the operator's token)."""

    def present(path: str | None) -> str | None:  # the chart mounts a Secret that may hold one key
        return path if path and os.path.exists(path) else None

    def config_for(url: str, timeout: float) -> PromConfig:
        ca = present(args.prometheus_ca_file)
        if url != args.prometheus_url:
            return PromConfig(url, timeout=timeout, ca_file=ca)
        token = None
        token_file = present(args.prometheus_bearer_token_file)
        if token_file:
            with open(token_file) as f:
                token = f.read().strip() or None
        return PromConfig(
            url,
            timeout=timeout,
            ca_file=ca,
            insecure_skip_verify=args.prometheus_insecure_skip_verify,
            bearer_token=token,
        )

    return config_for


def notifications(args: Settings) -> tuple[Notifier, list[Webhook]]:
    """The notifier (signing key from the mounted file, if any; the host allow-list) and the cluster-wide
    default webhook."""
    key = None
    path = args.notification_signing_key_file
    if path and os.path.exists(path):
        with open(path, "rb") as f:
            key = f.read() or None
    elif path:
        log.warning("notifications: no signing key file at %s: notifications are not signed", path)
    hooks = [Webhook(args.notification_url, args.notification_format)] if args.notification_url else []
    return Notifier(key, allowed_hosts=args.notification_allowed_hosts), hooks


@dataclass
class OffReconcile:
    """The network I/O a reconcile never waits on, each in a thread of its own: Prometheus measurements,
    notifications and gates (a finished measurement or a changed gate answer asks for a reconcile)."""

    measurements: MeasurementRunner
    notifier: Notifier
    webhooks: list[Webhook]
    gates: GateAsker

    def start(self) -> None:
        self.measurements.start()
        self.notifier.start()
        self.gates.start()

    def stop(self) -> None:
        self.measurements.stop()
        self.notifier.stop()
        self.gates.stop()


def off_reconcile(args: Settings, wake: Callable[[str, str], object]) -> OffReconcile:
    """Build them; ``wake(namespace, name)`` asks for a reconcile (thread-safe)."""
    notifier, webhooks = notifications(args)
    # gates use the notifications' host allow-list and signing key
    gates = GateAsker(on_done=wake, allowed_hosts=notifier.allowed_hosts, signing_key=notifier.signing_key)
    return OffReconcile(MeasurementRunner(prometheus_config(args), on_done=wake), notifier, webhooks, gates)


def log_start(ident: str, args: Settings, liveness: str | None) -> None:
    log.info(
        "starting: identity=%s priority=%d namespaces=%s liveness=%s metrics=%s:%s",
        ident,
        args.priority,
        args.namespace or "cluster-wide",
        liveness,
        args.bind_host,
        args.metrics_port,
    )


def peering_gate(kube: Kube, ident: str, args: Settings) -> PeeringGate:
    return PeeringGate(
        kube,
        identity=ident,
        priority=args.priority,
        peering_name=args.peering_name,
        # namespaced mode: kopf keeps one KopfPeering per namespace; the first one stands for all
        namespace=args.namespace[0] if args.namespace else None,
        standalone=args.standalone,
    )


async def run(args: Settings) -> None:
    ident = identity()
    # reconciles run in the loop's default executor (asyncio.to_thread), whose own size is min(32, CPUs + 4):
    # on a small node fewer threads than workers, and the workers would wait for threads
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=args.workers + 2, thread_name_prefix="modeldeploy")
    )
    kube = Kube.from_environment(pool_size=max(4, args.workers * 2))
    if not args.standalone and args.create_peering:
        await asyncio.to_thread(ensure_peering, kube, args.peering_name, args.namespace)
    cache = ChildCache()
    events = PostInBackground(kube)
    loop = asyncio.get_running_loop()

    def enqueue_all(keys: set[tuple[str, str]]) -> None:
        """In the loop: the controller's queue is not thread-safe."""
        for key in keys:
            controller.enqueue(key)

    io = off_reconcile(args, lambda ns, name: loop.call_soon_threadsafe(enqueue_all, {(ns, name)}))
    reconciler = Reconciler(
        kube,
        instance=ident,
        prometheus_url=args.prometheus_url,
        cache=cache,
        events=events,
        measurements=io.measurements,
        notifier=io.notifier,
        webhooks=io.webhooks,
        gates=io.gates,
    )
    gate = peering_gate(kube, ident, args)
    controller = Controller(reconciler.reconcile, workers=args.workers, gate=gate)
    resyncer = Resyncer(
        kube,
        cache,
        [BY_KIND[KIND_OF_PLURAL[plural]] for _, _, plural in child_resources(args.watch_httproutes)],
        namespaces=args.namespace,
        period=args.resync_period,
        on_changed=lambda keys: loop.call_soon_threadsafe(enqueue_all, keys),  # from the resync thread
    )
    registry = build_registry(
        controller,
        watch_httproutes=args.watch_httproutes,
        cache=cache,
        stuck_after=args.stuck_after,
        on_listed=resyncer.relisted,
    )
    settings = kopf_settings(args)
    metrics.serve(args.metrics_port, args.bind_host)
    liveness = f"http://{args.bind_host}:{args.health_port}/healthz" if args.health_port else None
    log_start(ident, args, liveness)
    controller.start()
    io.start()
    resyncer.start()
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            identity=ident,  # type: ignore[arg-type]
            standalone=args.standalone,
            priority=args.priority,
            peering_name=None if args.standalone else args.peering_name,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=liveness,
        )
    finally:
        resyncer.stop()
        io.stop()
        await controller.stop()
        await asyncio.to_thread(events.close)


def main(argv: list[str] | None = None) -> int:
    try:
        args = load_settings(argv)
    except SettingsError as e:
        print(f"modeldeploy: configuration error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
        # pausing/resuming in favour of another replica is worth a line
        logging.getLogger("kopf._core.engines.peering").setLevel(logging.INFO)
    asyncio.run(run(args))
    return 0
