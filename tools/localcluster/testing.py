"""pytest fixtures for tests that need a Kubernetes cluster.

* ``cluster`` (session): a fresh local cluster in a temporary state directory, torn down at the end.
  With ``E2E_KUBECONFIG`` set, that cluster is used instead (e.g. kind) and nothing is started.
* ``kube`` (session): a :class:`Kube` helper bound to the cluster (kubectl, REST, waiting).
* ``namespace`` (function): a fresh namespace per test, deleted afterwards.
* ``s3`` (session): the cluster's object store (:class:`localcluster.objectstore.ObjectStore`: boto3
  client, buckets, directory uploads, the access log); ``s3_bucket`` (function): a fresh bucket in it.

Load with ``pytest_plugins = ["localcluster.testing"]``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import httpx
import pytest
import urllib3

from .cluster import Cluster, binaries_dir, down, up
from .kubeapi import KubeAPI, KubeError, ready_endpoints
from .objectstore import ObjectStore
from .status_record import StatusRecorder

T = TypeVar("T")

log = logging.getLogger("localcluster.testing")


class WaitTimeout(AssertionError):
    pass


#: what a predicate may raise while what it waits for is not there yet: swallowed, and polled again
POLLED_ERRORS: tuple[type[Exception], ...] = (
    KubeError,
    OSError,
    KeyError,
    IndexError,
    httpx.HTTPError,
    urllib3.exceptions.HTTPError,
)
#: of those, the ones no network or apiserver hiccup explains: a missing key or item ("not there yet" to
#: most predicates, but also what a predicate that reads the wrong field raises every time)
NOT_TRANSIENT: tuple[type[Exception], ...] = (KeyError, IndexError)


class Swallowed:
    """What a :func:`wait_for` swallowed: how many of each exception type, and the last of each."""

    def __init__(self) -> None:
        self.counts: collections.Counter[type[Exception]] = collections.Counter()
        self.last: dict[type[Exception], Exception] = {}

    def add(self, exc: Exception) -> None:
        self.counts[type(exc)] += 1
        self.last[type(exc)] = exc

    def __bool__(self) -> bool:
        return bool(self.counts)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def not_transient(self) -> bool:
        return any(issubclass(t, NOT_TRANSIENT) for t in self.counts)

    def summary(self) -> str:
        """``KeyError x3 (last: KeyError('status')), ConnectError x1 (last: ...)``, most frequent first."""
        return ", ".join(f"{t.__name__} x{n} (last: {self.last[t]!r})" for t, n in self.counts.most_common())


def wait_for(predicate: Callable[[], T], *, timeout: float = 60, interval: float = 0.25, what: str = "") -> T:
    """Poll ``predicate`` until it returns a truthy value; fail with ``what``, the last error and what was
    swallowed on the way (:data:`POLLED_ERRORS`: a count per type and the last of each). A success after
    swallowed :data:`NOT_TRANSIENT` errors is logged, so a predicate that raised for a reason other than
    "not there yet" shows in the test's log."""
    started = time.monotonic()
    deadline = started + timeout
    last_exc: Exception | None = None
    swallowed = Swallowed()
    while True:
        try:
            value = predicate()
            if value:
                if swallowed.not_transient:
                    log.warning(
                        "waited %.1fs for %r: true after %d swallowed errors: %s",
                        time.monotonic() - started,
                        what or predicate,
                        swallowed.total,
                        swallowed.summary(),
                    )
                return value
        except POLLED_ERRORS as exc:
            last_exc = exc
            swallowed.add(exc)
        if time.monotonic() >= deadline:
            raise WaitTimeout(
                f"timed out after {timeout:.0f}s waiting for {what or predicate!r}; last error: {last_exc}"
                + (f"; swallowed: {swallowed.summary()}" if swallowed else "")
            )
        time.sleep(interval)


class Kube:
    """kubectl and REST access to a test cluster."""

    def __init__(self, cluster: Cluster, kubectl: Path) -> None:
        self.cluster = cluster
        self.kubeconfig = cluster.kubeconfig
        self.kubectl_bin = kubectl
        self.api = KubeAPI(cluster.kubeconfig)
        # MODELDEPLOY_RECORD_STATUSES=<dir>: every ModelDeployment state read is written there (fixtures)
        self.recorder = StatusRecorder.from_env()

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(self.kubectl_bin), *args],
            input=input,
            text=True,
            capture_output=True,
            env=self.env,
            timeout=120,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({res.returncode}): {res.stderr}")
        return res

    def apply(self, manifest: dict[str, Any] | str, namespace: str | None = None) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        self.kubectl(*args, input=text)

    def get(self, path: str) -> dict[str, Any] | None:
        obj = self.api.get(path, ok_missing=True)
        if self.recorder is not None:
            self.recorder.saw(obj)
        return obj

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        params = {"labelSelector": selector} if selector else None
        return (self.api.get(f"/api/v1/namespaces/{namespace}/pods", params=params) or {}).get("items", [])

    LISTS: ClassVar[dict[str, str]] = {
        "deployments": "/apis/apps/v1/namespaces/{ns}/deployments",
        "services": "/api/v1/namespaces/{ns}/services",
        "pdbs": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
        "pods": "/api/v1/namespaces/{ns}/pods",
    }

    def labelled(
        self, namespace: str, selector: str, kinds: tuple[str, ...]
    ) -> dict[str, list[dict[str, Any]]]:
        """Objects of each of ``kinds`` (keys of :attr:`LISTS`) in ``namespace`` matching a label selector."""
        params = {"labelSelector": selector}
        return {
            kind: (self.api.get(self.LISTS[kind].format(ns=namespace), params=params) or {}).get("items", [])
            for kind in kinds
        }

    def endpoint_ips(self, namespace: str, service: str, *, ready_only: bool = True) -> set[str]:
        if ready_only:
            return {ip for ip, _ in ready_endpoints(self.api, namespace, service)}
        slices = (
            self.api.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                params={"labelSelector": f"kubernetes.io/service-name={service}"},
            )
            or {}
        )
        return {
            ip for s in slices.get("items", []) for ep in s.get("endpoints") or [] for ip in ep["addresses"]
        }


def session_cluster(tmp_path_factory: pytest.TempPathFactory, *, node: str = "process") -> Iterator[Cluster]:
    """The body of a session ``cluster`` fixture: the cluster ``E2E_KUBECONFIG`` names, or a fresh local
    one whose pods run on ``node`` (``"process"``: the node agent; ``"containerd"``: the real node, as
    tests/node/conftest.py asks), torn down at the end."""
    external = os.environ.get("E2E_KUBECONFIG")
    if external:
        yield Cluster(
            Path(external).parent,
            Path(external),
            os.environ.get("E2E_PROMETHEUS_URL", ""),
            "",
            gateway_url=os.environ.get("E2E_GATEWAY_URL", ""),
            s3_url=os.environ.get("E2E_S3_URL", ""),
            prometheus_url_pods=os.environ.get("E2E_PROMETHEUS_URL_PODS", ""),
        )
        return
    state = tmp_path_factory.mktemp("localcluster")
    c = up(state, node=node)
    try:
        yield c
    finally:
        down(state)


#: the node the tiers' session cluster runs its pods on, when set: ``containerd`` puts any tier on the real
#: node (docs/local-cluster.md "The real node"), to see what of it runs there before it moves
NODE_ENV = "LOCALCLUSTER_NODE"


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from session_cluster(tmp_path_factory, node=os.environ.get(NODE_ENV) or "process")


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    kubectl = Path(os.environ["E2E_KUBECTL"]) if os.environ.get("E2E_KUBECTL") else binaries_dir() / "kubectl"
    return Kube(cluster, kubectl)


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for(
        lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=30,
        what=f"default service account in {name}",
    )
    yield name
    kube.api.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture(scope="session")
def s3(cluster: Cluster) -> ObjectStore:
    store = ObjectStore.of_cluster(cluster)
    if store is None:
        pytest.skip("the cluster has no object store (E2E_S3_URL and E2E_S3_CREDENTIALS name one)")
    return store


@pytest.fixture
def s3_bucket(s3: ObjectStore) -> str:
    """A fresh bucket in the cluster's object store (left there: the store goes with the cluster)."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3.make_bucket(name)
    return name
