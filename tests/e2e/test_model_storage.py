"""Models from where users keep them, end to end on the local cluster: MiniLM uploaded to the cluster's S3
(versitygw) and served from ``s3://``, the same from a ``pvc://`` claim, fetch failures surfacing as a
``ModelAvailable`` condition with the fetch's own reason, and a canary from ``s3://.../v1`` to
``s3://.../v2`` whose rollback fetches nothing again thanks to the node cache."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from localcluster.kubeapi import service_url
from localcluster.objectstore import ObjectStore
from localcluster.testing import Kube, wait_for

from .canary_support import LoadGenerator, md_status, noop_md, storage, wait_for_event
from .conftest import minilm_model, minilm_uri

MD = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
TEXTS = ["Models live in object storage.", "A canary takes a share of the traffic."]


@pytest.fixture(scope="module")
def store(kube: Kube, operator: Any, s3: ObjectStore) -> Iterator[dict[str, Any]]:
    """A namespace with the store's credentials as a Secret (and a wrong pair), and a bucket holding MiniLM
    under ``minilm/v1/`` and a small noop model under ``noop/v1/`` and ``noop/v2/``."""
    ns = f"e2e-storage-{uuid.uuid4().hex[:6]}"
    kube.kubectl("create", "namespace", ns)
    wait_for(lambda: kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"), timeout=30, what="sa")
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.make_bucket(bucket)
    s3.upload_dir(Path(minilm_uri().removeprefix("file://")), bucket, "minilm/v1")
    for version in ("v1", "v2"):
        s3.put(bucket, f"noop/{version}/model.txt", f"noop model {version}\n".encode() * 1000)
    for name, secret_key in (("s3-credentials", s3.secret_key), ("wrong-credentials", "not-the-secret-key")):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name},
                "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": secret_key},
            },
            ns,
        )
    yield {"ns": ns, "bucket": bucket, "s3": s3}
    kube.api.delete(f"/api/v1/namespaces/{ns}")


def minilm_md(name: str, uri: str, **model: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {**minilm_model(uri), **model},
            "replicas": 1,
            "resources": {"cpu": "1", "memory": "2Gi"},
            "batching": {"maxBatchSize": 16, "maxSequenceLength": 128, "buckets": [32, 128]},
        },
    }


def condition(kube: Kube, ns: str, name: str, type_: str) -> dict[str, Any] | None:
    st = (kube.get(MD.format(ns=ns, name=name)) or {}).get("status") or {}
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), None)


def is_true(kube: Kube, ns: str, name: str, type_: str) -> bool:
    c = condition(kube, ns, name, type_)
    return c is not None and c["status"] == "True"


def embed(kube: Kube, ns: str, name: str) -> np.ndarray:
    base = service_url(kube.api, ns, name)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
    deadline = time.monotonic() + 30
    while True:
        try:
            r = httpx.post(f"{base}/v2/models/minilm/infer", json=body, timeout=60)
            break
        except httpx.ConnectError:
            # Ready, but kube-proxy has not programmed the Service's new endpoint yet (it lags the
            # EndpointSlice by up to its sync period): the ClusterIP refuses until then
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def reference_embeddings(kube: Kube, ns: str) -> np.ndarray:
    """MiniLM served from the image's own files (file://) in the same namespace: what s3:// must match."""
    kube.apply(minilm_md("from-file", minilm_uri()), ns)
    wait_for(lambda: is_true(kube, ns, "from-file", "Ready"), timeout=300, what="from-file Ready")
    return embed(kube, ns, "from-file")


def test_minilm_is_served_from_s3(kube: Kube, store: dict[str, Any]) -> None:
    ns, bucket, s3 = store["ns"], store["bucket"], store["s3"]
    since = s3.log_offset()
    kube.apply(minilm_md("from-s3", f"s3://{bucket}/minilm/v1/", storage=storage(s3)), ns)
    wait_for(lambda: is_true(kube, ns, "from-s3", "Ready"), timeout=300, what="from-s3 Ready")
    avail = condition(kube, ns, "from-s3", "ModelAvailable")
    assert avail is not None and (avail["status"], avail["reason"]) == ("True", "ModelLoaded")
    (pod,) = kube.pods(ns, "modeldeploy.io/name=from-s3")
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["name"] == "fetch-model" and init["state"]["terminated"]["exitCode"] == 0
    # the files came from the store: one GET per object at least
    files = [p for p in Path(minilm_uri().removeprefix("file://")).rglob("*") if p.is_file()]
    assert s3.count("GetObject", bucket=bucket, key_prefix="minilm/v1/", since=since) >= len(files)
    got = embed(kube, ns, "from-s3")
    want = reference_embeddings(kube, ns)
    assert got.shape == want.shape == (2, 384)
    assert np.allclose(got, want, atol=1e-5)


def test_minilm_is_served_from_a_pvc_without_a_copy(kube: Kube, store: dict[str, Any]) -> None:
    ns = store["ns"]
    pv = f"minilm-{ns}"
    model_dir = Path(minilm_uri().removeprefix("file://"))
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(model_dir.parent), "type": "Directory"},
                "claimRef": {"namespace": ns, "name": "models"},
            },
        }
    )
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": pv,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        ns,
    )
    try:
        kube.apply(minilm_md("from-pvc", f"pvc://models/{model_dir.name}"), ns)
        wait_for(lambda: is_true(kube, ns, "from-pvc", "Ready"), timeout=300, what="from-pvc Ready")
        (pod,) = kube.pods(ns, "modeldeploy.io/name=from-pvc")
        assert "initContainers" not in pod["spec"]  # no copy
        assert is_true(kube, ns, "from-pvc", "ModelAvailable")
        assert embed(kube, ns, "from-pvc").shape == (2, 384)
    finally:
        kube.kubectl("delete", "pv", pv, "--wait=false", check=False)


def _finished_at(pod: dict[str, Any]) -> datetime | None:
    for st in pod["status"].get("initContainerStatuses") or []:
        for key in ("state", "lastState"):
            term = (st.get(key) or {}).get("terminated")
            if term and term.get("exitCode") and term.get("finishedAt"):
                return datetime.fromisoformat(term["finishedAt"].replace("Z", "+00:00"))
    return None


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("wrong-secret", "AccessDenied"),
        ("missing-prefix", "NotFound"),
        ("tampered", "ChecksumMismatch"),
        ("unreachable", "DownloadTimeout"),
    ],
)
def test_a_fetch_failure_is_a_condition_with_its_reason_within_30s(
    kube: Kube, store: dict[str, Any], case: str, reason: str
) -> None:
    ns, bucket, s3 = store["ns"], store["bucket"], store["s3"]
    uri, extra, st = f"s3://{bucket}/noop/v1/model.txt", {}, storage(s3)
    if case == "wrong-secret":
        st["secretRef"] = {"name": "wrong-credentials"}
    elif case == "missing-prefix":
        uri = f"s3://{bucket}/no/such/model/"
    elif case == "tampered":
        extra = {"sha256": "0" * 64}  # not the object's
    else:
        host = s3.url.split("//", 1)[1].rsplit(".", 1)[0]  # 10.244.N: nothing answers on .253
        st = storage(s3, endpoint=f"http://{host}.253:9000", timeout="8s")
    name = f"fail-{case}"
    md = noop_md(name, "1", uri)
    md["spec"]["model"].update({"storage": st, **extra})
    kube.apply(md, ns)

    first_failure: list[datetime] = []  # the fetch's first failed run, as the pod reported it

    def failed() -> dict[str, Any] | None:
        for pod in kube.pods(ns, f"modeldeploy.io/name={name}"):
            finished = _finished_at(pod)
            if finished is not None and not first_failure:
                first_failure.append(finished)
        c = condition(kube, ns, name, "ModelAvailable")
        return c if c is not None and c["status"] == "False" else None

    c = wait_for(failed, timeout=150, what=f"ModelAvailable=False for {case}")
    assert c["reason"] == reason, c
    assert "could not fetch" in c["message"]
    # the pod says why (not only a crash loop), and the condition follows its first failure within 30 s
    # (polled from the start, before any restart could hide the first run's termination)
    assert first_failure, kube.pods(ns, f"modeldeploy.io/name={name}")
    seen = datetime.fromisoformat(c["lastTransitionTime"].replace("Z", "+00:00"))
    assert 0 <= (seen - first_failure[0]).total_seconds() <= 30, (first_failure, seen)
    st_md = md_status(kube, ns, name)
    assert st_md["phase"] == "Degraded"
    wait_for_event(kube, ns, name, reason)
    # the credentials are nowhere a user or an operator's scrape would see them
    seen_text = json.dumps([st_md, kube.get(f"/api/v1/namespaces/{ns}/events"), kube.pods(ns)])
    pod_logs = "".join(
        p.read_text(errors="replace") for p in kube.cluster.state_dir.rglob(f"pods/{ns}_*/*.log")
    )
    for secret in (s3.secret_key, "not-the-secret-key"):
        assert secret not in seen_text and secret not in pod_logs
    kube.kubectl("delete", "-n", ns, "modeldeployment", name, "--wait=false")


def fetched_pods(kube: Kube, ns: str, revision: str) -> list[str]:
    """Pods of ``revision`` (not terminating) whose fetch init container completed."""
    out = []
    for p in kube.pods(ns, f"modeldeploy.io/revision={revision}"):
        statuses = p["status"].get("initContainerStatuses") or []
        done = [s for s in statuses if (s.get("state") or {}).get("terminated", {}).get("exitCode") == 0]
        if done and not p["metadata"].get("deletionTimestamp"):
            out.append(p["metadata"]["name"])
    return out


def test_an_s3_canary_is_promoted_and_its_rollback_fetches_from_the_node_cache(
    kube: Kube, store: dict[str, Any]
) -> None:
    ns, bucket, s3 = store["ns"], store["bucket"], store["s3"]
    name = "cached"
    st = storage(s3, nodeCache={"maxSize": "1Gi"})

    def md(version: str) -> dict[str, Any]:
        body = noop_md(name, version, f"s3://{bucket}/noop/v{version}/", replicas=2)
        body["spec"]["model"]["storage"] = st
        return body

    kube.apply(md("1"), ns)
    wait_for(lambda: is_true(kube, ns, name, "Ready"), timeout=180, what="v1 Ready")
    v1 = md_status(kube, ns, name)["stableRevision"]
    load = LoadGenerator(kube, ns, name, max_seconds=240).wait_serving().start()
    try:
        kube.apply(md("2"), ns)
        wait_for(
            lambda: (
                md_status(kube, ns, name).get("stableRevision") not in (None, v1)
                and not md_status(kube, ns, name).get("canaryRevision")
            ),
            timeout=180,
            what="v2 promoted",
        )
        # the warm v1 pod goes (a node drain, a restart): its replacement must not download v1 again
        since = s3.log_offset()
        for pod in kube.pods(ns, f"modeldeploy.io/revision={v1}"):
            kube.kubectl("delete", "pod", "-n", ns, pod["metadata"]["name"], "--wait=false")
        time.sleep(2)
        wait_for(lambda: fetched_pods(kube, ns, v1), timeout=120, what="a new v1 pod fetched")
        kube.apply(md("1"), ns)  # roll back to v1 by spec
        wait_for(
            lambda: md_status(kube, ns, name).get("stableRevision") == v1, timeout=180, what="back on v1"
        )
    finally:
        load.stop()
    assert s3.count("GetObject", bucket=bucket, key_prefix="noop/v1/", since=since) == 0
    logs = "".join(
        p.read_text(errors="replace")
        for p in kube.cluster.state_dir.rglob(f"pods/{ns}_{name}-{v1}*/fetch-model.log")
    )
    assert "cache hit" in logs
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
