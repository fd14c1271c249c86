"""downwardAPI volumes of process-run pods: the process reads its pod's annotations from files at its
mountPath, sees changes without a restart, cannot write them, and nothing is left on the host."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from localcluster.testing import Kube, wait_for

TESTAPP = "modeldeploy/testapp:dev"
ROOT = Path(__file__).resolve().parents[3]


def running(kube: Kube, path: str) -> dict[str, Any] | None:
    p = kube.get(path)
    return p if p and p["status"].get("phase") == "Running" and p["status"].get("podIP") else None


def waiting(kube: Kube, path: str) -> dict[str, Any] | None:
    p = kube.get(path)
    return (
        p if p and (p["status"].get("containerStatuses") or [{}])[0].get("state", {}).get("waiting") else None
    )


def dapi_pod(name: str, mount_path: str, annotations: dict[str, str], extra_items: list[Any] = ()) -> Any:  # type: ignore[assignment]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}, "annotations": annotations},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [
                            {"path": "x", "fieldRef": {"fieldPath": "metadata.annotations['x']"}},
                            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}},
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                            *extra_items,
                        ]
                    },
                }
            ],
            "containers": [
                {
                    "name": "app",
                    "image": TESTAPP,
                    "args": ["--port", "8080"],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "volumeMounts": [{"name": "podinfo", "mountPath": mount_path, "readOnly": True}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1},
                }
            ],
        },
    }


def test_a_process_reads_its_annotations_from_a_live_downward_api_volume(kube: Kube, namespace: str) -> None:
    if os.environ.get("E2E_KUBECONFIG"):
        pytest.skip("looks into the local node agent's state directory")
    top = Path(f"/etc/modeldeploy-test-{namespace}")
    mount_path = f"{top}/podinfo"
    # Created, not applied: kubectl apply would add its last-applied annotation.
    kube.api.create(
        f"/api/v1/namespaces/{namespace}/pods",
        dapi_pod("dapi", mount_path, {"x": "one", "other": 'say "hi"'}),
    )
    path = f"/api/v1/namespaces/{namespace}/pods/dapi"
    pod = wait_for(lambda: running(kube, path), what="pod running")
    assert pod is not None
    ip, uid = pod["status"]["podIP"], pod["metadata"]["uid"]
    pid = int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))

    def read(name: str) -> str:
        r = httpx.get(f"http://{ip}:8080/file", params={"path": f"{mount_path}/{name}"}, timeout=2)
        assert r.status_code == 200, r.text
        return r.text

    assert wait_for(lambda: read("x") == "one", what="the annotation in the file")
    assert read("annotations") == 'other="say \\"hi\\""\nx="one"'
    assert read("labels") == 'app="dapi"'
    # The mountPath exists for the process only: nothing was created on the host.
    assert not top.exists()

    # Live updates: patch the annotation, time until the process reads the new value.
    delays = []
    for i in range(10):
        value = f"v{i}"
        t0 = time.monotonic()
        kube.api.strategic_patch(path, {"metadata": {"annotations": {"x": value}}})
        wait_for(lambda: read("x") == value, timeout=5, interval=0.01, what=f"x={value} in the file")  # noqa: B023
        delays.append(time.monotonic() - t0)
    median_ms, max_ms = statistics.median(delays) * 1000, max(delays) * 1000
    print(
        f"\ndownwardAPI update delay, {len(delays)} patches: median {median_ms:.0f} ms, max {max_ms:.0f} ms"
    )
    assert max(delays) < 3.0, delays
    kube.api.strategic_patch(path, {"metadata": {"annotations": {"x": None}}})
    wait_for(lambda: read("x") == "", timeout=5, what="a removed annotation is an empty file")

    # Read-only for the process: neither an item nor a new file can be written.
    for name in ("x", "new-file"):
        r = httpx.put(f"http://{ip}:8080/file", params={"path": f"{mount_path}/{name}"}, timeout=2)
        assert r.status_code == 409 and r.json()["errno"] == "EROFS", r.text

    # Same process all along.
    pod = kube.get(path) or {}
    st = pod["status"]["containerStatuses"][0]
    assert st["restartCount"] == 0 and st["containerID"] == f"process://{pid}"

    # The volume lives in the agent's state directory, the kubelet's way, and goes with the pod.
    pod_dir = kube.cluster.state_dir / "agent" / "pods" / f"{namespace}_dapi_{uid[:8]}"
    vol = pod_dir / "volumes" / "podinfo"
    assert os.readlink(vol / "..data").startswith("..2") and os.readlink(vol / "x") == "..data/x"
    kube.kubectl("delete", "pod", "dapi", "-n", namespace, "--wait=false")
    wait_for(lambda: kube.get(path) is None, timeout=30, what="pod object removed")
    wait_for(lambda: not (pod_dir / "volumes").exists(), timeout=10, what="volume dir removed")
    assert not (pod_dir / "mnt").exists()
    assert not top.exists()


def test_a_resource_field_in_a_downward_api_volume_is_refused_with_an_event(
    kube: Kube, namespace: str
) -> None:
    item = {"path": "cpu", "resourceFieldRef": {"containerName": "app", "resource": "limits.cpu"}}
    kube.apply(dapi_pod("refused", "/etc/modeldeploy-refused/podinfo", {"x": "1"}, [item]), namespace)

    def failed_mount() -> dict[str, Any] | None:
        events = kube.get(f"/api/v1/namespaces/{namespace}/events") or {}
        return next(
            (
                e
                for e in events.get("items", [])
                if e["involvedObject"]["name"] == "refused" and e["reason"] == "FailedMount"
            ),
            None,
        )

    event = wait_for(failed_mount, timeout=30, what="a FailedMount event")
    assert event is not None
    assert "resourceFieldRef" in event["message"] and event["type"] == "Warning"
    pod = wait_for(
        lambda: waiting(kube, f"/api/v1/namespaces/{namespace}/pods/refused"), what="container status"
    )
    assert pod is not None
    st = pod["status"]["containerStatuses"][0]
    # as on a kubelet, a volume that cannot be set up holds the whole pod before any container starts
    assert st["state"]["waiting"]["reason"] == "ContainerCreating"
    assert pod["status"]["phase"] == "Pending" and "containerID" not in st


def test_the_mount_helper_overlays_a_missing_mount_path_and_keeps_the_mounts_below(tmp_path: Path) -> None:
    """podmount alone, in a throwaway mount namespace: the host sees neither the new directory nor a mount."""
    base = tmp_path / "base"
    (base / "sub").mkdir(parents=True)
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "f").write_text("volume file")
    script = (
        f"mount -t tmpfs tmpfs {base}/sub && echo submount > {base}/sub/g && "
        f"{sys.executable} -m localcluster.podmount --scratch {tmp_path}/scratch "
        f"--bind {vol} {base}/new/podinfo ro -- "
        f"sh -c 'cat {base}/new/podinfo/f; echo; cat {base}/sub/g; "
        f"touch {base}/new/podinfo/h || echo refused'"
    )
    res = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[:3] == ["volume file", "submount", "refused"], res.stdout
    assert "Read-only file system" in res.stderr
    assert sorted(p.name for p in base.iterdir()) == ["sub"]
    assert not (base / "sub" / "g").exists()
    assert not any((tmp_path / "scratch").iterdir())
