"""The real-node tier: one local cluster per session whose pods run on a real kubelet with containerd, runc
and CNI (``up --node containerd``, docs/local-cluster.md "The real node"), instead of the process agent.

Needs root, the real node's binaries (tools/build-binaries.sh) and, for pods of our images, ``make images``
(the tests that need a Python image skip without one). One real kubelet per machine: the device-plugin
directory is fixed, so this tier never runs beside another real-node session.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from localcluster import realnode
from localcluster import realnode_config as rc
from localcluster.cluster import Cluster
from localcluster.testing import Kube, session_cluster

from .support import missing_image

#: images with a Python interpreter, most wanted first: the tests run small scripts in them
PYTHON_IMAGES = ("docker.io/modeldeploy/modelserver:dev", "docker.io/modeldeploy/operator:dev")


#: tests that bring a real node up and down themselves: they run first, before the session's cluster
#: starts (a second real node on the machine is refused), whatever their files' names sort after
OWN_NODE_MODULES = ("test_host_left_as_it_was.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in OWN_NODE_MODULES)  # stable: the rest keep their order
    if os.environ.get("E2E_KUBECONFIG"):
        skip = pytest.mark.skip(reason="the local cluster's real node only (E2E_KUBECONFIG names another)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from session_cluster(tmp_path_factory, node="containerd")


@pytest.fixture(scope="session")
def real_node(kube: Kube) -> dict[str, Any]:
    node = kube.get(f"/api/v1/nodes/{rc.NODE_NAME}")
    assert node is not None, f"no node {rc.NODE_NAME}"
    return node


@pytest.fixture(scope="session")
def python_image(crictl: list[str]) -> str:
    """An image of ours with Python on the node (imported at ``up`` from ``make images``' archives), as
    the CRI lists it (the node's ``status.images`` lags behind by a status update)."""
    out = subprocess.run([*crictl, "images", "-o", "json"], capture_output=True, text=True, check=True)
    names = {t for img in json.loads(out.stdout)["images"] for t in img.get("repoTags") or []}
    for image in PYTHON_IMAGES:
        if image in names:
            return image
    missing_image(f"none of {PYTHON_IMAGES} on {rc.NODE_NAME}: run `make images` before the tier")


@pytest.fixture(scope="session")
def crictl(cluster: Cluster) -> list[str]:
    """crictl against the node's containerd."""
    from localcluster.state import ClusterRecord

    rec = ClusterRecord.load(cluster.state_dir)
    assert rec is not None
    sock = realnode.node_paths(cluster.state_dir).containerd_socket
    return [f"{rec.bin_dir}/crictl", "--runtime-endpoint", f"unix://{sock}"]
