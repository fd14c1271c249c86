"""Pods for the real-node tests: a small Python HTTP server (``python -m http.server``-like, printing its
GPU env first, serving a one-line ``/metrics.txt`` from its working directory), started and waited on."""

from __future__ import annotations

import os
import time
from typing import Any, NoReturn

import pytest
from localcluster.testing import Kube, wait_for

#: set by `make test` / `make test-node`, which build the images first: a missing image is then a failure
#: of the set-up, not a reason to skip (a skipped tier must never read as a passing one)
REQUIRE_IMAGES = "MODELDEPLOY_NODE_REQUIRE_IMAGES"


def missing_image(message: str) -> NoReturn:
    """Skip the test for want of ``make images`` -- or fail it where the images were required."""
    if os.environ.get(REQUIRE_IMAGES):
        pytest.fail(f"{message} (${REQUIRE_IMAGES} is set: the images were to be built first)")
    pytest.skip(message)


SERVER = (
    "import http.server, os; "
    "open('metrics.txt', 'w').write('node_test_served 1\\n'); "
    "print('NVIDIA_VISIBLE_DEVICES=' + os.environ.get('NVIDIA_VISIBLE_DEVICES', ''), flush=True); "
    "http.server.ThreadingHTTPServer(('', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()"
)


def server_pod(
    name: str, image: str, *, gpus: int = 0, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "app",
        "image": image,
        "imagePullPolicy": "Never",  # nothing to pull from: the image was imported at up
        "command": ["python", "-c", SERVER],
        "workingDir": "/tmp",
        "ports": [{"containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"containers": [container], "terminationGracePeriodSeconds": 1},
    }


def ready(kube: Kube, ns: str, name: str) -> bool:
    pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}") or {}
    conds = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def run_pod(kube: Kube, ns: str, pod: dict[str, Any], timeout: float = 60) -> tuple[dict[str, Any], float]:
    """Create ``pod`` and wait until it is Ready; the pod and the seconds from create to Ready."""
    start = time.monotonic()
    kube.api.create(f"/api/v1/namespaces/{ns}/pods", pod)
    name = pod["metadata"]["name"]
    wait_for(lambda: ready(kube, ns, name), timeout=timeout, what=f"pod {name} Ready")
    took = time.monotonic() - start
    got = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    assert got is not None
    return got, took


def py(kube: Kube, ns: str, pod: str, code: str, *, check: bool = True) -> str:
    """Run Python ``code`` in the pod's container (``kubectl exec``: apiserver -> kubelet -> containerd);
    its output (with ``check=False``, whatever it printed even when it failed)."""
    return kube.kubectl("exec", "-n", ns, pod, "--", "python", "-c", code, check=check).stdout
