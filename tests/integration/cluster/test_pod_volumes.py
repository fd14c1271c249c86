"""The node agent runs what a kubelet runs: init containers (in order, to completion; a failure's
termination message in initContainerStatuses), emptyDir shared by a pod's containers, hostPath and
persistentVolumeClaim volumes (a static PV bound by kube-controller-manager), configMap volumes,
readOnly mounts, and an emptyDir over /tmp that hides the host's files without hiding the pod's own."""

from __future__ import annotations

import os
import textwrap
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from localcluster.testing import Kube, wait_for

TESTAPP = "modeldeploy/testapp:dev"

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("E2E_KUBECONFIG")), reason="process pods of the local node agent (host paths)"
)


def _pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 2, "containers": containers, **spec},
    }


def _app(*mounts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": "app",
        "image": TESTAPP,
        "args": ["--port", "8080"],
        "volumeMounts": list(mounts),
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
        **extra,
    }


def _script(name: str, code: str, *mounts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": TESTAPP,
        "command": ["python", "-c", textwrap.dedent(code)],
        "volumeMounts": list(mounts),
        **extra,
    }


def _ready(kube: Kube, path: str) -> dict[str, Any] | None:
    p = kube.get(path)
    conds = {c["type"]: c["status"] for c in (p or {}).get("status", {}).get("conditions") or []}
    return p if conds.get("Ready") == "True" else None


def _read(ip: str, path: str) -> httpx.Response:
    return httpx.get(f"http://{ip}:8080/file", params={"path": path}, timeout=5)


def _write(ip: str, path: str) -> httpx.Response:
    return httpx.put(f"http://{ip}:8080/file", params={"path": path}, timeout=5)


def _run(kube: Kube, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    kube.apply(pod, namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
    ready = wait_for(lambda: _ready(kube, path), timeout=60, what=f"pod {pod['metadata']['name']} Ready")
    assert ready is not None
    return ready


def test_init_containers_run_in_order_into_an_empty_dir_the_main_container_reads(
    kube: Kube, namespace: str
) -> None:
    work = {"name": "work", "mountPath": "/mnt/work"}
    first = _script("first", "open('/mnt/work/order', 'a').write('first\\n')", work)
    second = _script(
        "second",
        """
        import os, time
        assert open('/mnt/work/order').read() == 'first\\n'
        time.sleep(1)
        open('/mnt/work/order', 'a').write('second\\n')
        """,
        work,
    )
    pod = _pod(
        "init-order",
        [_app({"name": "work", "mountPath": "/mnt/work", "readOnly": True})],
        initContainers=[first, second],
        volumes=[{"name": "work", "emptyDir": {}}],
    )
    ready = _run(kube, namespace, pod)
    ip, uid = ready["status"]["podIP"], ready["metadata"]["uid"]
    assert _read(ip, "/mnt/work/order").text == "first\nsecond\n"
    inits = ready["status"]["initContainerStatuses"]
    assert [s["name"] for s in inits] == ["first", "second"]
    for s in inits:
        t = s["state"]["terminated"]
        assert (t["exitCode"], t["reason"], s["ready"], s["restartCount"]) == (0, "Completed", True, 0)
    # the second started after the first finished
    assert inits[1]["state"]["terminated"]["startedAt"] >= inits[0]["state"]["terminated"]["finishedAt"]
    conds = {c["type"]: c for c in ready["status"]["conditions"]}
    assert conds["Initialized"]["status"] == "True"
    assert _write(ip, "/mnt/work/order").json()["errno"] == "EROFS"
    # nothing on the host outside the pod's directory; the emptyDir goes with the pod
    assert not Path("/mnt/work").exists()
    pod_dir = kube.cluster.state_dir / "agent" / "pods" / f"{namespace}_init-order_{uid[:8]}"
    assert (pod_dir / "volumes" / "work" / "order").read_text() == "first\nsecond\n"
    kube.kubectl("delete", "pod", "init-order", "-n", namespace, "--wait=false")
    wait_for(lambda: not (pod_dir / "volumes").exists(), timeout=30, what="the emptyDir removed")


def test_a_failing_init_container_restarts_with_its_termination_message_in_the_status(
    kube: Kube, namespace: str
) -> None:
    failing = _script(
        "fetch",
        """
        import sys
        open('/dev/termination-log', 'w').write('NotFound: s3://models/missing/')
        sys.exit(3)
        """,
    )
    kube.apply(_pod("init-fails", [_app()], initContainers=[failing]), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/init-fails"

    def restarted() -> dict[str, Any] | None:
        p = kube.get(path)
        st = ((p or {}).get("status", {}).get("initContainerStatuses") or [{}])[0]
        return p if st.get("restartCount", 0) >= 2 else None

    pod = wait_for(restarted, timeout=60, what="two restarts of the failing init container")
    assert pod is not None
    st = pod["status"]["initContainerStatuses"][0]
    last = st["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"], last["message"]) == (
        3,
        "Error",
        "NotFound: s3://models/missing/",
    )
    assert st["ready"] is False
    if "waiting" in st["state"]:
        assert st["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert "restarting failed container=fetch" in st["state"]["waiting"]["message"]
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    init = next(c for c in pod["status"]["conditions"] if c["type"] == "Initialized")
    assert (init["status"], init["reason"]) == ("False", "ContainersNotInitialized")
    assert init["message"] == "containers with incomplete status: [fetch]"


def test_with_restart_policy_never_a_failed_init_container_fails_the_pod_and_logs_stand_in(
    kube: Kube, namespace: str
) -> None:
    failing = _script(
        "fetch",
        """
        import sys
        for i in range(100):
            print(f'progress line {i}')
        print('DownloadTimeout: no byte in 30s', flush=True)
        sys.exit(2)
        """,
        terminationMessagePolicy="FallbackToLogsOnError",
    )
    kube.apply(_pod("init-never", [_app()], initContainers=[failing], restartPolicy="Never"), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/init-never"
    pod = wait_for(
        lambda: (p := kube.get(path)) and p["status"].get("phase") == "Failed" and p,
        timeout=60,
        what="the pod Failed",
    )
    st = pod["status"]["initContainerStatuses"][0]
    t = st["state"]["terminated"]
    assert t["exitCode"] == 2 and t["reason"] == "Error" and st["restartCount"] == 0
    lines = t["message"].splitlines()
    assert (
        lines[-1] == "DownloadTimeout: no byte in 30s" and len(lines) == 80 and lines[0] == "progress line 21"
    )
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodFailed")
    # the main container never ran
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_a_main_containers_termination_message_from_a_custom_path(kube: Kube, namespace: str) -> None:
    main = _script(
        "job",
        "import sys; open('/etc/modeldeploy-term/reason', 'w').write('done: 3 files'); sys.exit(0)",
        terminationMessagePath="/etc/modeldeploy-term/reason",
    )
    kube.apply(_pod("job", [main], restartPolicy="Never"), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/job"
    pod = wait_for(
        lambda: (p := kube.get(path)) and p["status"].get("phase") == "Succeeded" and p,
        timeout=60,
        what="the pod Succeeded",
    )
    t = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (t["exitCode"], t["reason"], t["message"]) == (0, "Completed", "done: 3 files")
    assert not Path("/etc/modeldeploy-term").exists()


def test_host_path_volumes_are_the_hosts_directories(kube: Kube, namespace: str, tmp_path: Path) -> None:
    created = tmp_path / "node-cache" / "models"
    existing = tmp_path / "data"
    existing.mkdir()
    (existing / "weights.bin").write_bytes(b"on the host")
    pod = _pod(
        "hostpath",
        [
            _app(
                {"name": "cache", "mountPath": "/mnt/cache"},
                {"name": "data", "mountPath": "/mnt/data", "readOnly": True},
            )
        ],
        volumes=[
            {"name": "cache", "hostPath": {"path": str(created), "type": "DirectoryOrCreate"}},
            {"name": "data", "hostPath": {"path": str(existing), "type": "Directory"}},
        ],
    )
    ip = _run(kube, namespace, pod)["status"]["podIP"]
    assert created.is_dir()
    assert _write(ip, "/mnt/cache/entry").status_code == 200
    assert (created / "entry").read_text() == "written by testapp\n"
    assert _read(ip, "/mnt/data/weights.bin").content == b"on the host"
    assert _write(ip, "/mnt/data/weights.bin").json()["errno"] == "EROFS"
    kube.kubectl("delete", "pod", "hostpath", "-n", namespace, "--wait=true", "--timeout=30s")
    assert (created / "entry").exists()  # hostPath data outlives the pod


def test_a_missing_host_path_directory_is_a_failed_mount_until_it_exists(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    later = tmp_path / "later"
    pod = _pod(
        "waits",
        [_app({"name": "d", "mountPath": "/mnt/d"})],
        volumes=[{"name": "d", "hostPath": {"path": str(later), "type": "Directory"}}],
    )
    kube.apply(pod, namespace)

    def failed_mount() -> bool:
        events = kube.get(f"/api/v1/namespaces/{namespace}/events") or {}
        return any(
            e["reason"] == "FailedMount" and "is not a directory" in e["message"]
            for e in events.get("items", [])
        )

    wait_for(failed_mount, timeout=30, what="a FailedMount event")

    def waiting() -> str | None:
        # the status is written apart from the event (as the kubelet does): it may come a moment later
        st = (kube.get(f"/api/v1/namespaces/{namespace}/pods/waits") or {}).get("status") or {}
        cs = st.get("containerStatuses") or [{}]
        return (
            cs[0].get("state", {}).get("waiting", {}).get("reason") if st.get("phase") == "Pending" else None
        )

    assert wait_for(waiting, timeout=10, what="Pending, the container waiting") == "ContainerCreating"
    later.mkdir()
    wait_for(lambda: _ready(kube, f"/api/v1/namespaces/{namespace}/pods/waits"), timeout=30, what="Ready")


def test_a_claim_bound_to_a_static_pv_by_the_controller_manager_is_mounted(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    data = tmp_path / "pv-data"
    data.mkdir()
    (data / "model.bin").write_bytes(b"weights on the PV")
    pv_name = f"pv-{uuid.uuid4().hex[:8]}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "local": {"path": str(data)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": ["gpu-node-0", "cpu-node-0"],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "models"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "volumeName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    del pvc["spec"]["volumeName"]  # let the binder choose
    kube.api.create("/api/v1/persistentvolumes", pv)
    try:
        kube.apply(pvc, namespace)
        claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/models"
        claim = wait_for(
            lambda: (c := kube.get(claim_path)) and c.get("status", {}).get("phase") == "Bound" and c,
            timeout=60,
            what="the claim bound by kube-controller-manager's PV binder",
        )
        assert claim["spec"]["volumeName"] == pv_name
        pod = _pod(
            "pvc",
            [_app({"name": "m", "mountPath": "/mnt/pvc"})],
            volumes=[{"name": "m", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}],
        )
        ip = _run(kube, namespace, pod)["status"]["podIP"]
        assert _read(ip, "/mnt/pvc/model.bin").content == b"weights on the PV"
        # readOnly on the claim: the mount is read-only although the volumeMount does not say so
        assert _write(ip, "/mnt/pvc/model.bin").json()["errno"] == "EROFS"
        assert (data / "model.bin").read_bytes() == b"weights on the PV"
    finally:
        kube.kubectl("delete", "pod", "pvc", "-n", namespace, "--ignore-not-found", "--wait=true")
        kube.kubectl("delete", "pvc", "models", "-n", namespace, "--ignore-not-found", "--wait=false")
        kube.api.delete(f"/api/v1/persistentvolumes/{pv_name}")


def test_config_map_volumes_are_files_that_follow_the_config_map(kube: Kube, namespace: str) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings"},
        "data": {"model.yaml": "name: minilm\n", "other": "x"},
    }
    kube.apply(cm, namespace)
    pod = _pod(
        "cm",
        [_app({"name": "cfg", "mountPath": "/etc/modeldeploy-cfg"})],
        volumes=[
            {
                "name": "cfg",
                "configMap": {"name": "settings", "items": [{"key": "model.yaml", "path": "m.yaml"}]},
            }
        ],
    )
    ip = _run(kube, namespace, pod)["status"]["podIP"]
    assert _read(ip, "/etc/modeldeploy-cfg/m.yaml").text == "name: minilm\n"
    assert _read(ip, "/etc/modeldeploy-cfg/other").status_code == 404
    assert _write(ip, "/etc/modeldeploy-cfg/m.yaml").json()["errno"] == "EROFS"
    cm["data"]["model.yaml"] = "name: minilm-v2\n"
    kube.apply(cm, namespace)
    wait_for(
        lambda: _read(ip, "/etc/modeldeploy-cfg/m.yaml").text == "name: minilm-v2\n",
        timeout=20,
        what="the new content in the file",
    )
    assert not Path("/etc/modeldeploy-cfg").exists()


def test_an_empty_dir_over_tmp_hides_the_hosts_tmp_but_not_the_pods_own_files(
    kube: Kube, namespace: str
) -> None:
    marker = Path("/tmp") / f"host-only-{uuid.uuid4().hex[:8]}"
    marker.write_text("host")
    try:
        # the chart's operator pod does this; the cluster under test lives below /tmp (pytest's tmp dirs)
        pod = _pod(
            "tmp", [_app({"name": "tmp", "mountPath": "/tmp"})], volumes=[{"name": "tmp", "emptyDir": {}}]
        )
        ready = _run(kube, namespace, pod)
        ip, uid = ready["status"]["podIP"], ready["metadata"]["uid"]
        assert _read(ip, str(marker)).status_code == 404
        assert _write(ip, "/tmp/pod-file").status_code == 200
        assert not Path("/tmp/pod-file").exists()
        pod_dir = kube.cluster.state_dir / "agent" / "pods" / f"{namespace}_tmp_{uid[:8]}"
        assert (pod_dir / "volumes" / "tmp" / "pod-file").exists()
        # its service-account kubeconfig (in the cluster's state directory) is still there for it
        kcfg = pod_dir / "serviceaccount.kubeconfig"
        assert _read(ip, str(kcfg)).content == kcfg.read_bytes()
    finally:
        marker.unlink()
