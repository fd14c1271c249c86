"""Finding 1 of issue 24, played on the local cluster: the node model cache does not cross tenants.

Team B serves a model from ``s3://`` through the node cache. Team A -- an author with a namespaced token
of their own, who names their own image -- fetches models through the same node's cache, and would like
to (a) run their image where the cache is writable, (b) push B's entry out with a small cap of their own,
(c) have B's next pod load bytes that are not B's model (a ``handler.py`` planted in B's entry, the state
an older version's shared directory allowed). Before the fix the fetch ran ``spec.image`` as root on one
shared directory, a fill evicted any namespace's entries, and a hit trusted the entry's ``meta.json``.
Now: the fetch runs the operator's image, each namespace has a directory of its own, and a hit is checked
against its files -- B's pod re-downloads its model and the planted file is gone.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from localcluster.objectstore import ObjectStore
from localcluster.testing import Kube, wait_for

from .tenants import Author

MD_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments"
MODEL_V1 = b"noop model v1\n" * 1000  # 14 000 bytes
MODEL_V2 = b"noop model v2\n" * 1000


def md_body(name: str, uri: str, s3: ObjectStore, cache_max: str, image: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {
            "name": "noop",
            "version": "1",
            "uri": uri,
            "format": "noop",
            "storage": {
                "endpoint": s3.url,
                "region": s3.region,
                "addressingStyle": "path",
                "secretRef": {"name": "s3-credentials"},
                "timeout": "2m",
                "nodeCache": {"maxSize": cache_max},
            },
        },
        "replicas": 1,
        "resources": {"cpu": "100m", "memory": "256Mi"},
    }
    if image:
        spec["image"] = image
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def give_credentials(kube: Kube, ns: str, s3: ObjectStore) -> None:
    """What the platform team does for a team: the store's credentials as a Secret in its namespace."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-credentials"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    }
    kube.apply(secret, ns)


def pods(kube: Kube, ns: str, md: str) -> list[dict[str, Any]]:
    sel = f"app.kubernetes.io/instance={md}"
    return (kube.get(f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}") or {}).get("items") or []


def fetched(kube: Kube, ns: str, md: str) -> dict[str, Any] | None:
    """A pod of ``md`` whose fetch init container finished with exit code 0."""
    for p in pods(kube, ns, md):
        for st in (p.get("status") or {}).get("initContainerStatuses") or []:
            term = (st.get("state") or {}).get("terminated") or {}
            if st["name"] == "fetch-model" and term and term.get("exitCode") == 0:
                return p
    return None


def entries(root: Path) -> dict[str, list[str]]:
    """Each complete entry under a namespace's cache directory: its files."""
    out: dict[str, list[str]] = {}
    for e in sorted((root / "entries").glob("*")) if (root / "entries").is_dir() else []:
        if (e / "meta.json").is_file():
            out[e.name] = sorted(p.relative_to(e / "data").as_posix() for p in (e / "data").rglob("*"))
    return out


def test_a_tenant_can_neither_write_nor_evict_nor_poison_another_tenants_cached_model(
    kube: Kube, operator: Any, s3: ObjectStore, team_a: Author, team_b: str
) -> None:
    cache_root = Path(kube.cluster.state_dir) / "node-cache"
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.make_bucket(bucket)
    s3.put(bucket, "noop/v1/model.txt", MODEL_V1)
    s3.put(bucket, "noop/v2/model.txt", MODEL_V2)
    for ns in (team_a.namespace, team_b):
        give_credentials(kube, ns, s3)

    # team B's model, through the node cache
    kube.apply(md_body("victim", f"s3://{bucket}/noop/v1/", s3, "1Gi"), team_b)
    wait_for(lambda: fetched(kube, team_b, "victim"), timeout=120, what="team B's model fetched")
    victim_entries = entries(cache_root / team_b)
    assert list(victim_entries.values()) == [["model.txt"]], victim_entries
    (victim_key,) = victim_entries

    # team A, with its own image and a cap that holds one model: the same model, then another
    for name, version in (("thief-v1", "v1"), ("thief-v2", "v2")):
        body = md_body(name, f"s3://{bucket}/noop/{version}/", s3, "20Ki", image="modeldeploy/testapp:dev")
        team_a.api.create(MD_PATH.format(ns=team_a.namespace), body)
        pod = wait_for(lambda n=name: fetched(kube, team_a.namespace, n), timeout=120, what=f"{name} fetched")
        (init,) = pod["spec"]["initContainers"]
        assert init["image"] != "modeldeploy/testapp:dev", "the author's image ran with the cache mounted"
        cache_vols = {v["name"]: v for v in pod["spec"]["volumes"] if v["name"].startswith("model-cache")}
        assert cache_vols["model-cache"]["hostPath"]["path"].endswith(f"/{team_a.namespace}")
        writable = [
            m for m in init["volumeMounts"] if m["name"].startswith("model-cache") and not m.get("readOnly")
        ]
        assert [m["name"] for m in writable] == ["model-cache"]
    # A's fills went to A's directory; with A's small cap the second evicted A's first, never B's entry
    assert len(entries(cache_root / team_a.namespace)) == 1
    assert list(entries(cache_root / team_b)) == [victim_key]

    # B's entry poisoned (a file planted beside the model, as a shared writable cache allowed)
    data = cache_root / team_b / "entries" / victim_key / "data"
    planted = data / "handler.py"
    planted.write_text("import os\nos.system('exfiltrate')\n")
    poisoned_at = time.time()
    (victim_pod,) = pods(kube, team_b, "victim")
    kube.api.delete(f"/api/v1/namespaces/{team_b}/pods/{victim_pod['metadata']['name']}")

    def refetched() -> bool:
        p = fetched(kube, team_b, "victim")
        return p is not None and p["metadata"]["uid"] != victim_pod["metadata"]["uid"]

    wait_for(refetched, timeout=120, what="team B's new pod fetched")
    # the hit was refused: the entry was downloaded again, and holds exactly the model
    meta = json.loads((cache_root / team_b / "entries" / victim_key / "meta.json").read_text())
    assert meta["created"] > poisoned_at, "B's new pod was served the poisoned entry"
    assert entries(cache_root / team_b) == {victim_key: ["model.txt"]}
    assert (data / "model.txt").read_bytes() == MODEL_V1
