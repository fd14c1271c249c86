"""The chart on real containers: ``helm install`` of charts/modeldeploy with the images built here (imported
into the node's containerd at ``up``, ``pullPolicy: Never``), the operator a container of
``modeldeploy/operator:dev`` under its ServiceAccount (no kubeconfig), both admission policies on; its
ModelDeployments' pods in containers of ``modeldeploy/modelserver:dev``.

One release for the module. Scenarios, kept few (the tier's time is bounded):

* the operator's pod: containerd's container of the imported image, uid 10001, read-only root filesystem,
  the ServiceAccount's token and nothing else to reach the apiserver, the admission policies in force;
* MiniLM from ``s3://`` (the cluster's versitygw): the fetch init container of the serving image, the
  server Ready, embeddings through the ClusterIP; the server's container as the operator builds it;
* two ModelDeployments side by side, one in ``replicas`` mode (clients at its ClusterIP), one in
  ``gatewayAPI`` mode (clients through Traefik): a good revision promoted with no client failing, then
  failed back during its bake to the warm previous revision (same container, no restart), then a bad
  revision (half its answers 500) rolled back; every client request counted (canary_support's
  LoadGenerator) and only the failing revision's own 5xx ever seen; ``kubectl modeldeploy status``.

Figures are printed, never asserted (and written to $NODE_CHART_REPORT when set): among them each server
pod's start, the image present: from when a 0.1 s poll first saw the pod to ContainersReady (the
kubelet's) and Ready (with the operator's readiness gate).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from localcluster import realnode_config as rc
from localcluster.kubeapi import service_url
from localcluster.objectstore import ObjectStore
from localcluster.state import REPO_ROOT
from localcluster.testing import Kube, WaitTimeout, wait_for

from tests.e2e.canary_support import (
    LoadGenerator,
    Record,
    apply_crds,
    gateway_routing,
    md_status,
    noop_md,
    pids,
    storage,
)
from tests.e2e.conftest import minilm_model, minilm_uri
from tests.node.support import missing_image

sys.path.insert(0, str(REPO_ROOT / "tests" / "integration" / "chart"))
import chart_cluster as cc

OPERATOR_IMAGE = "docker.io/modeldeploy/operator:dev"
SERVER_IMAGE = "docker.io/modeldeploy/modelserver:dev"
MD = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
NAME = "echo"
GOOD = "noop://?delay_ms=2"
#: good while no request carries the marker text (the canary), failing those that do (the bake)
POISONABLE = GOOD + "&fail_text=POISON"
BAD = "noop://?delay_ms=2&fail_rate=0.5"
#: after a decision in status, the time for gates, EndpointSlices, kube-proxy and Traefik to follow
SETTLE_S = 3.0
REPORT: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[dict[str, Any]]:
    yield REPORT
    text = json.dumps(REPORT, indent=2, sort_keys=True, default=str)
    sys.stderr.write(f"\n--- chart on the real node: figures ---\n{text}\n")
    if os.environ.get("NODE_CHART_REPORT"):
        Path(os.environ["NODE_CHART_REPORT"]).write_text(text)


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def images(crictl: list[str]) -> dict[str, str]:
    """image -> its id in the node's containerd; skips without ``make images``' archives imported."""
    out = {}
    for image in (OPERATOR_IMAGE, SERVER_IMAGE):
        res = subprocess.run([*crictl, "inspecti", "-o", "json", image], capture_output=True, text=True)
        if res.returncode != 0:
            missing_image(f"{image} not on {rc.NODE_NAME}: run `make images` before the tier")
        out[image] = json.loads(res.stdout)["status"]["id"]
    return out


@pytest.fixture(scope="module")
def release(
    kube: Kube, images: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[cc.Release]:
    """The chart, cluster-wide, with the operator as a pod on the real node; at the end, no request of
    the operator's ServiceAccount refused (the audit log), and the operator's log on stderr."""
    apply_crds(kube)
    helm = cc.Helm(kube.kubeconfig, tmp_path_factory.mktemp("helm"))
    rel = cc.Release(name="node", namespace="modeldeploy-system", watched=[])
    cc.create_namespace(kube, rel.namespace, cc.RESTRICTED)
    started = time.monotonic()
    cc.install(
        helm, kube, rel,
        "--set", "image.pullPolicy=Never",  # nothing to pull from: imported at up
        "--set", "rbac.gatewayAPI=true",
        "--set", "admissionPolicy.enabled=true",
        "--set", "admissionPolicy.operatorPods=true",
        "--set", "admissionPolicy.allowedImagePrefixes={modeldeploy/modelserver}",
    )  # fmt: skip
    pod = wait_for(lambda: cc.running_operator(kube, rel), timeout=120, what="the chart's operator pod")
    REPORT["helm_install_to_operator_running_s"] = round(time.monotonic() - started, 1)
    try:
        yield rel
    finally:
        refused = cc.rbac_refusals(kube, rel.user)
        log = cc.operator_log(kube, pod)
        sys.stderr.write(f"\n--- the chart's operator log (tail) ---\n{log[-4000:]}\n")
        helm("uninstall", rel.name, "--namespace", rel.namespace, "--wait", check=False)
        assert not refused, [e.get("responseStatus") for e in refused[:3]]
        assert not cc.refusal_lines(log), cc.refusal_lines(log)[:3]


@pytest.fixture(scope="module")
def store(kube: Kube, release: cc.Release, s3: ObjectStore) -> Iterator[dict[str, Any]]:
    """A namespace with the store's credentials as a Secret, and a bucket holding MiniLM under
    ``minilm/v1/`` (as tests/e2e/test_model_storage.py makes them)."""
    ns = f"node-s3-{uuid.uuid4().hex[:6]}"
    new_namespace(kube, ns)
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.make_bucket(bucket)
    s3.upload_dir(Path(minilm_uri().removeprefix("file://")), bucket, "minilm/v1")
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-credentials"},
            "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
        },
        ns,
    )
    yield {"ns": ns, "bucket": bucket, "s3": s3}
    cc.delete_namespace(kube, ns)


def new_namespace(kube: Kube, ns: str) -> None:
    cc.create_namespace(kube, ns)
    wait_for(lambda: kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"), timeout=30, what="sa")


# ------------------------------------------------------------------------------------------ helpers


def inspect(
    pod: dict[str, Any], images: dict[str, str], image: str, statuses: str = "containerStatuses"
) -> dict[str, Any]:
    """The pod's (only) container status of ``statuses``: on the real node, in a containerd container of
    ``image`` as imported (its id is the imageID the kubelet reports)."""
    assert pod["spec"]["nodeName"] == rc.NODE_NAME
    (status,) = pod["status"][statuses]
    assert status["containerID"].startswith("containerd://"), status
    assert status["image"] == image, status
    assert status["imageID"] == images[image], (status["imageID"], images[image])
    return status


#: what the container's process is: uid/gid, whether / is writable, the no-new-privs bit, capabilities
WHOAMI = (
    "import os, json\n"
    "try:\n"
    "    open('/probe', 'w'); rootfs = 'writable'\n"
    "except OSError as e:\n"
    "    rootfs = e.strerror\n"
    "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
    "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'rootfs': rootfs,\n"
    "  'no_new_privs': st['NoNewPrivs'].strip(), 'cap_eff': st['CapEff'].strip(),\n"
    "  'tmp_writable': os.access('/tmp', os.W_OK), 'env': sorted(os.environ),\n"
    "  'sa_token': os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token')}))\n"
)


def whoami(kube: Kube, ns: str, pod: str, container: str) -> dict[str, Any]:
    out = kube.kubectl("exec", "-n", ns, pod, "-c", container, "--", "python", "-c", WHOAMI).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def restricted(who: dict[str, Any]) -> None:
    assert who["uid"] == 10001 and who["gid"] == 10001, who
    assert who["rootfs"] == "Read-only file system", who
    assert who["tmp_writable"], who
    assert who["no_new_privs"] == "1" and int(who["cap_eff"], 16) == 0, who


def condition_true(obj: dict[str, Any], type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


class PodClock:
    """Polls a label selector's pods: per pod, when it was first seen and when ContainersReady (the
    kubelet's, without the operator's readiness gate) and Ready (with it) were first seen True."""

    def __init__(self, kube: Kube, ns: str, selector: str) -> None:
        self.kube, self.ns, self.selector = kube, ns, selector
        self.seen: dict[str, dict[str, float]] = {}
        self.t0 = time.monotonic()

    def poll(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        pods = self.kube.pods(self.ns, self.selector)
        for p in pods:
            times = self.seen.setdefault(p["metadata"]["name"], {"seen": now})
            for cond in ("ContainersReady", "Ready"):
                if cond not in times and condition_true(p, cond):
                    times[cond] = now
        return pods

    def figures(self) -> dict[str, dict[str, float]]:
        """pod -> seconds from first seen to ContainersReady and Ready (0.1-0.25 s resolution)."""
        return {
            pod: {k: round(v - t["seen"], 2) for k, v in t.items() if k != "seen"}
            for pod, t in self.seen.items()
        }


def node_trouble(kube: Kube, namespaces: tuple[str, ...]) -> str:
    """For a wait's failure message: the node's pressure conditions and taints (a shared disk that dips
    under the kubelet's 1 % eviction threshold evicts pods and taints the node for 5 minutes), and the
    last Warning events of ``namespaces``."""
    node = kube.get(f"/api/v1/nodes/{rc.NODE_NAME}") or {}
    conds = [
        f"{c['type']}={c['status']}"
        for c in (node.get("status") or {}).get("conditions") or []
        if c["type"] != "Ready" and c["status"] == "True"
    ]
    taints = [t["key"] for t in (node.get("spec") or {}).get("taints") or []]
    warnings = [
        f"{e['involvedObject']['name']}: {e['reason']}: {e['message'][:200]}"
        for ns in namespaces
        for e in (kube.get(f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
        if e.get("type") == "Warning"
    ]
    return f"node {rc.NODE_NAME}: {conds or 'no pressure'}, taints {taints}; warnings: {warnings[-6:]}"


def until(what: str, pred: Callable[[], Any], timeout: float, clocks: tuple[PodClock, ...] = ()) -> Any:
    def check() -> Any:
        for c in clocks:
            c.poll()
        return pred()

    try:
        return wait_for(check, timeout=timeout, interval=0.1, what=what)
    except WaitTimeout as exc:
        kube = clocks[0].kube if clocks else None
        if kube is None:
            raise
        raise WaitTimeout(f"{exc}\n{node_trouble(kube, tuple(c.ns for c in clocks))}") from None


def last_outcome(st: dict[str, Any], revision: str) -> str | None:
    return next((h["outcome"] for h in reversed(st.get("history", [])) if h["revision"] == revision), None)


def plugin(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl modeldeploy ...``: the plugin found on PATH, as a user runs it."""
    env = {**kube.env, "PATH": f"{Path(sys.executable).parent}:{kube.env.get('PATH', '')}"}
    return subprocess.run(
        [str(kube.kubectl_bin), "modeldeploy", *args], env=env, text=True, capture_output=True, timeout=60
    )


# ------------------------------------------------------------------------------------------ 1


def test_the_operator_runs_in_a_container_under_its_service_account(
    kube: Kube, release: cc.Release, images: dict[str, str]
) -> None:
    pod = cc.running_operator(kube, release)
    assert pod is not None
    inspect(pod, images, OPERATOR_IMAGE)
    assert pod["spec"]["serviceAccountName"] == release.service_account
    ns, name = release.namespace, pod["metadata"]["name"]
    who = whoami(kube, ns, name, "operator")
    restricted(who)  # the chart's podSecurityContext / securityContext, as runc applied them
    # in-cluster credentials only: the projected token, no kubeconfig
    assert "KUBECONFIG" not in who["env"] and "KUBERNETES_SERVICE_HOST" in who["env"], who["env"]
    assert who["sa_token"], who
    # the apiserver saw the operator as its ServiceAccount (it has written since: the peering keep-alive)
    wait_for(lambda: cc.audit_events_of(kube, release.user), timeout=30, what="the operator's own requests")
    # both admission policies in force; the authors' one refuses an image off the allowed prefixes
    for suffix in ("authors", "operator-pods"):
        vap = f"{release.fullname}-{suffix}"
        assert kube.get(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{vap}"), vap
    bad = noop_md(NAME, "1", GOOD)
    bad["spec"]["image"] = "registry.example.com/modelserver:1"

    def refused() -> str | None:
        res = kube.kubectl(
            "apply", "--dry-run=server", "-n", "default", "-f", "-", input=json.dumps(bad), check=False
        )
        return res.stderr if res.returncode != 0 else None

    # a policy (and its binding) is enforced once the apiserver has loaded it: a moment after helm made it
    message = wait_for(refused, timeout=30, what="the authors' policy refusing an image")
    assert "spec.image" in message and "ValidatingAdmissionPolicy" in message, message
    kube.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-f", "-", input=json.dumps(noop_md(NAME, "1", GOOD))
    )


# ------------------------------------------------------------------------------------------ 2

TEXTS = ["Models live in object storage.", "A canary takes a share of the traffic."]


def test_an_s3_model_is_fetched_by_the_init_container_and_served(
    kube: Kube, release: cc.Release, store: dict[str, Any], images: dict[str, str]
) -> None:
    ns, bucket, s3 = store["ns"], store["bucket"], store["s3"]
    md = {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "minilm"},
        "spec": {
            "model": {
                **minilm_model(f"s3://{bucket}/minilm/v1/"),
                "storage": storage(s3),
            },
            "replicas": 1,
            "resources": {"cpu": "500m", "memory": "1536Mi"},
            "batching": {"maxBatchSize": 16, "maxSequenceLength": 128, "buckets": [32, 128]},
        },
    }
    since = s3.log_offset()
    clock = PodClock(kube, ns, "modeldeploy.io/name=minilm")
    kube.apply(md, ns)
    until(
        "minilm Ready",
        lambda: condition_true(kube.get(MD.format(ns=ns, name="minilm")) or {}, "Ready"),
        timeout=300,
        clocks=(clock,),
    )
    (pod,) = kube.pods(ns, "modeldeploy.io/name=minilm")
    init = inspect(pod, images, SERVER_IMAGE, "initContainerStatuses")
    assert init["name"] == "fetch-model" and init["state"]["terminated"]["exitCode"] == 0, init
    assert s3.count("GetObject", bucket=bucket, key_prefix="minilm/v1/", since=since) > 0
    server = inspect(pod, images, SERVER_IMAGE)
    who = whoami(kube, ns, pod["metadata"]["name"], server["name"])
    restricted(who)  # builders.CONTAINER_SECURITY and the pod's runAsUser 10001
    assert not pod["spec"]["automountServiceAccountToken"] and not who["sa_token"]  # the server gets no token
    # the fetch container (gone by now) as the operator builds it: restricted like the server
    fetch = pod["spec"]["initContainers"][0]["securityContext"]
    assert fetch["readOnlyRootFilesystem"] and fetch["runAsNonRoot"] and not fetch["allowPrivilegeEscalation"]
    base = service_url(kube.api, ns, "minilm")
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
    resp = wait_for(
        lambda: httpx.post(f"{base}/v2/models/minilm/infer", json=body, timeout=60),
        timeout=30,
        what="the ClusterIP answering",
    )
    assert resp.status_code == 200, resp.text
    out = resp.json()["outputs"][0]
    emb = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-3)
    REPORT["minilm_s3_pod_seen_to"] = clock.figures()
    kube.kubectl("delete", "-n", ns, "modeldeployment", "minilm", "--wait=false")  # its CPU for the next


# ------------------------------------------------------------------------------------------ 3, 4


class Rollout:
    """One ModelDeployment ``echo`` in a namespace of its own, in ``replicas`` mode (clients at the model
    Service's ClusterIP) or ``gatewayAPI`` mode (clients through Traefik with the route's hostname)."""

    def __init__(self, kube: Kube, mode: str) -> None:
        self.kube, self.mode = kube, mode
        self.ns = f"node-{mode.lower()}-{uuid.uuid4().hex[:6]}"
        self.clock = PodClock(kube, self.ns, f"modeldeploy.io/name={NAME}")
        self.revisions: dict[str, str] = {}  # version -> revision

    def deploy(self, version: str, uri: str) -> None:
        routing = gateway_routing(self.ns, NAME) if self.mode == "gatewayAPI" else {"mode": "replicas"}
        self.kube.apply(noop_md(NAME, version, uri, trafficRouting=routing), self.ns)

    def status(self) -> dict[str, Any]:
        return md_status(self.kube, self.ns, NAME)

    def healthy_on(self, version: str) -> str | None:
        st = self.status()
        revs = {r["revision"]: r for r in st.get("revisions", [])}
        stable = st.get("stableRevision")
        healthy = st.get("phase") == "Healthy" and not st.get("canaryRevision") and stable in revs
        if healthy and revs[stable].get("modelVersion") == version:
            self.revisions[version] = str(stable)
            return str(stable)
        return None

    def new_revision(self, version: str, old: str) -> str | None:
        rev = self.status().get("revision")
        if rev and rev != old:
            self.revisions[version] = str(rev)
            return str(rev)
        return None

    def outcome(self, version: str) -> str | None:
        return last_outcome(self.status(), self.revisions[version])

    def load(self) -> LoadGenerator:
        return LoadGenerator(self.kube, self.ns, NAME, mode=self.mode, workers=2, pause=0.03)


def failures(load: LoadGenerator, since: float = 0.0) -> list[Record]:
    return [r for r in load.snapshot(since) if r.kind != "ok"]


def only_stable_after(load: LoadGenerator, decided: float, revision: str) -> int:
    """Every request sent from SETTLE_S after ``decided`` (and there were some, 3 s of them) answered 200
    by ``revision``."""
    settled = decided + SETTLE_S
    wait_for(lambda: load.snapshot(settled + 3.0), timeout=30, what="load after the settling window")
    recs = [r for r in load.snapshot(settled) if r.sent >= settled]
    wrong = [r for r in recs if not (r.code == 200 and r.revision == revision)]
    assert recs and not wrong, f"{len(wrong)} of {len(recs)} not 200 from {revision}: {wrong[:5]}"
    return len(recs)


def each_until(
    rollouts: list[Rollout], what: str, pred: Callable[[Rollout], Any], timeout: float
) -> dict[str, tuple[Any, float]]:
    """Poll every rollout (and its pods' clock) until ``pred`` holds for each; per mode, what ``pred``
    returned and when it was first seen (time.monotonic())."""
    got: dict[str, tuple[Any, float]] = {}

    def check() -> bool:
        for r in rollouts:
            r.clock.poll()
        for r in rollouts:
            if r.mode not in got and (value := pred(r)):
                got[r.mode] = (value, time.monotonic())
        return len(got) == len(rollouts)

    try:
        wait_for(check, timeout=timeout, interval=0.1, what=what)
    except WaitTimeout as exc:
        late = [r.mode for r in rollouts if r.mode not in got]
        trouble = node_trouble(rollouts[0].kube, tuple(r.ns for r in rollouts))
        raise WaitTimeout(f"{exc} (not yet: {late})\n{trouble}") from None
    return got


def warm_pods(kube: Kube) -> Callable[[Rollout], Any]:
    def pred(r: Rollout) -> Any:
        p = pids(kube, r.ns, NAME, r.revisions["1"])
        return p if p and all(c for c, _ in p.values()) else None

    return pred


@pytest.fixture(scope="module")
def rollouts(kube: Kube, release: cc.Release) -> Iterator[list[Rollout]]:
    """Both ModelDeployments Healthy on version 1."""
    if not kube.cluster.gateway_url:
        pytest.skip("the cluster has no Gateway")
    rs = [Rollout(kube, "replicas"), Rollout(kube, "gatewayAPI")]
    for r in rs:
        new_namespace(kube, r.ns)
        r.deploy("1", GOOD)
    each_until(rs, "v1 healthy", lambda r: r.healthy_on("1"), timeout=180)
    REPORT["echo_v1_pods"] = {r.mode: r.clock.figures() for r in rs}
    yield rs
    for r in rs:
        cc.delete_namespace(kube, r.ns)


def test_a_good_revision_is_promoted_then_fails_back_to_the_warm_previous(
    kube: Kube, rollouts: list[Rollout], images: dict[str, str]
) -> None:
    loads = [r.load().wait_serving(timeout=60).start() for r in rollouts]
    figures: dict[str, Any] = {r.mode: {} for r in rollouts}
    try:
        t0 = time.monotonic()
        for r in rollouts:
            r.deploy("2", POISONABLE)
        each_until(rollouts, "v2 in status", lambda r: r.new_revision("2", r.revisions["1"]), 30)
        promoted = each_until(rollouts, "v2 promoted", lambda r: r.outcome("2") == "Promoted", 180)
        warm = each_until(rollouts, "the warm pod of v1", warm_pods(kube), 30)
        for r, load in zip(rollouts, loads, strict=True):
            # the good path: nobody failed, not one request
            assert not failures(load), (r.mode, load.by_kind(), failures(load)[:5])
            load.poison_share = 0.3
        poisoned = time.monotonic()
        decided = each_until(rollouts, "v2 failed back", lambda r: r.outcome("2") == "FailedBack", 120)
        after = {
            r.mode: only_stable_after(load, decided[r.mode][1], r.revisions["1"])
            for r, load in zip(rollouts, loads, strict=True)
        }
    finally:
        for load in loads:
            load.stop()
    for r, load in zip(rollouts, loads, strict=True):
        v1, v2 = r.revisions["1"], r.revisions["2"]
        bad = failures(load)
        figures[r.mode].update(
            promoted_after_s=round(promoted[r.mode][1] - t0, 1),
            failback_after_poison_s=round(decided[r.mode][1] - poisoned, 1),
            requests_by_kind=dict(load.by_kind()),
            requests_by_revision=dict(load.by_revision()),
            after_settling_all_200_from_v1=after[r.mode],
        )
        # the only failures anyone saw: v2's own answers to the marker text
        assert bad and all(x.kind == "http_5xx" and x.revision == v2 for x in bad), (r.mode, bad[:5])
        assert load.by_revision()[v2] > 0
        # the warm pod went back into traffic as it was: the same containerd container, no restart
        now = pids(kube, r.ns, NAME, v1)
        for pod, (cid, restarts) in warm[r.mode][0].items():
            assert cid.startswith("containerd://") and now.get(pod) == (cid, restarts), (pod, now)
        assert r.status()["stableRevision"] == v1
        for p in kube.pods(r.ns, f"modeldeploy.io/name={NAME},modeldeploy.io/revision={v1}"):
            inspect(p, images, SERVER_IMAGE)
    figures["pods"] = {r.mode: r.clock.figures() for r in rollouts}
    REPORT["promote_then_failback"] = figures
    print(json.dumps(figures, indent=1, default=str))


def test_a_bad_revision_is_rolled_back_and_the_plugin_reads_it(kube: Kube, rollouts: list[Rollout]) -> None:
    loads = [r.load().wait_serving(timeout=60).start() for r in rollouts]
    try:
        t0 = time.monotonic()
        for r in rollouts:
            r.deploy("3", BAD)
        each_until(rollouts, "v3 in status", lambda r: r.new_revision("3", r.revisions["2"]), 30)
        decided = each_until(rollouts, "v3 rolled back", lambda r: r.outcome("3") == "RolledBack", 150)
        after = {
            r.mode: only_stable_after(load, decided[r.mode][1], r.revisions["1"])
            for r, load in zip(rollouts, loads, strict=True)
        }
    finally:
        for load in loads:
            load.stop()
    figures: dict[str, Any] = {}
    for r, load in zip(rollouts, loads, strict=True):
        v1, v3 = r.revisions["1"], r.revisions["3"]
        bad = failures(load)
        figures[r.mode] = dict(
            rolled_back_after_s=round(decided[r.mode][1] - t0, 1),
            requests_by_kind=dict(load.by_kind()),
            requests_by_revision=dict(load.by_revision()),
            after_settling_all_200_from_v1=after[r.mode],
        )
        # only the canary's own 5xx: no refused connection, no gateway error, no 4xx
        assert bad and all(x.kind == "http_5xx" and x.revision == v3 for x in bad), (r.mode, bad[:5])
        st = r.status()
        assert st["stableRevision"] == v1 and not st.get("canaryRevision") and st["phase"] == "Degraded"
        out = plugin(kube, "status", NAME, "-n", r.ns)
        assert out.returncode == 0, out.stderr
        for word in (v1, v3, "RolledBack", "FailedBack", "Promoted"):
            assert word in out.stdout, (word, out.stdout)
    REPORT["rollback"] = figures
    print(json.dumps(figures, indent=1, default=str))
