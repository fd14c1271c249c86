"""Where a revision's pods get the model from: the pure part of ``spec.model.uri``'s storage schemes.

* ``s3://bucket/prefix``: an init container ``fetch-model`` (the serving image, ``python -m
  modelserver.fetch``) downloads the object or prefix into the pod's ``model`` emptyDir, optionally
  through a node-local cache (a hostPath directory); the server then loads ``file:///mnt/models``.
  Credentials come from ``spec.model.storage.secretRef`` as ``secretKeyRef`` env: the operator never
  reads the Secret. A failed fetch writes one line ``<Reason>: <message>`` to its termination message,
  which :func:`fetch_failure` reads back from the pod status (the ``ModelAvailable`` condition).
* ``pvc://claim/path``: the claim is mounted read-only at ``/mnt/pvc``; no copy.
* ``file://``, ``http(s)://``, ``noop://``: the server loads the model itself, as before.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.utils import parse_quantity

from .api import ModelDeploymentSpec, StorageSpec, parse_duration

FETCH_CONTAINER = "fetch-model"
FETCH_COMMAND = ["python", "-m", "modelserver.fetch"]
MODEL_VOLUME = "model"
MODEL_DIR = "/mnt/models"
PVC_DIR = "/mnt/pvc"
CA_VOLUME = "s3-ca"
CA_DIR = "/etc/modeldeploy/s3-ca"
CACHE_VOLUME = "model-cache"
#: on the node: the directory the fetch containers of every pod share (``$MODELDEPLOY_NODE_CACHE_PATH``)
CACHE_HOST_PATH = "/var/lib/modeldeploy/model-cache"


def cache_host_path() -> str:
    """The node cache's hostPath: ``$MODELDEPLOY_NODE_CACHE_PATH`` (the chart's ``nodeCache.hostPath``) or
    :data:`CACHE_HOST_PATH`."""
    return os.environ.get("MODELDEPLOY_NODE_CACHE_PATH") or CACHE_HOST_PATH


#: in the fetch container
CACHE_DIR = "/var/cache/modeldeploy/models"
TERMINATION_LOG = "/dev/termination-log"
#: the reasons ``modelserver.fetch`` writes (anything else is reported as FetchFailed)
FETCH_REASONS = frozenset(
    {
        "AccessDenied",
        "NotFound",
        "ChecksumMismatch",
        "DownloadTimeout",
        "TooLarge",
        "InvalidURI",
        "FetchFailed",
    }
)
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass(frozen=True)
class ModelSource:
    """What the pod template needs for one revision's model."""

    server_uri: str
    #: the server verifies ``spec.model.sha256`` itself unless the fetch already did
    server_checks_sha256: bool = True
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    server_mounts: list[dict[str, Any]] = field(default_factory=list)


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0]


def _pvc_parts(uri: str) -> tuple[str, str]:
    rest = uri[len("pvc://") :]
    claim, _, path = rest.partition("/")
    return claim, path.strip("/")


def _fetch_env(storage: StorageSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    if storage.secret_ref is not None:
        env += [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": storage.secret_ref.name, "key": key}}}
            for key in SECRET_KEYS
        ]
    plain: dict[str, str] = {
        "S3_VERIFY_SSL": "1" if storage.verify_tls else "0",
        "S3_ADDRESSING_STYLE": storage.addressing_style,
    }
    if storage.endpoint:
        plain["S3_ENDPOINT"] = storage.endpoint
        plain["S3_USE_HTTPS"] = "1" if storage.endpoint.startswith("https://") else "0"
    if storage.region:
        plain["AWS_DEFAULT_REGION"] = storage.region
    if storage.ca_bundle is not None:
        plain["AWS_CA_BUNDLE"] = f"{CA_DIR}/{storage.ca_bundle.key}"
    env += [{"name": k, "value": v} for k, v in plain.items()]
    return env


def _fetch_args(spec: ModelDeploymentSpec, storage: StorageSpec) -> list[str]:
    args = [
        "--uri",
        spec.model.uri,
        "--dest",
        MODEL_DIR,
        "--timeout",
        str(math.ceil(parse_duration(storage.timeout))),
    ]
    args += ["--termination-log", TERMINATION_LOG]
    if spec.model.sha256:
        args += ["--sha256", spec.model.sha256]
    if storage.max_size is not None:
        args += ["--max-bytes", str(int(parse_quantity(storage.max_size)))]
    cache = storage.node_cache
    if cache is not None and cache.enabled:
        args += ["--cache-dir", CACHE_DIR, "--cache-max-bytes", str(int(parse_quantity(cache.max_size)))]
    return args


def _s3(
    spec: ModelDeploymentSpec, image: str, security: Mapping[str, Any], resources: Mapping[str, Any]
) -> ModelSource:
    storage = spec.model.storage or StorageSpec()
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": MODEL_VOLUME, "mountPath": MODEL_DIR},
    ]
    volumes: list[dict[str, Any]] = [{"name": MODEL_VOLUME, "emptyDir": {}}]
    container_security = dict(security)
    if storage.ca_bundle is not None:
        mounts.append({"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True})
        volumes.append(
            {
                "name": CA_VOLUME,
                "configMap": {
                    "name": storage.ca_bundle.config_map_ref.name,
                    "items": [{"key": storage.ca_bundle.key, "path": storage.ca_bundle.key}],
                },
            }
        )
    if storage.node_cache is not None and storage.node_cache.enabled:
        mounts.append({"name": CACHE_VOLUME, "mountPath": CACHE_DIR})
        volumes.append(
            {"name": CACHE_VOLUME, "hostPath": {"path": cache_host_path(), "type": "DirectoryOrCreate"}}
        )
        # the kubelet creates a hostPath directory as root, 0755, and fsGroup does not apply to hostPath:
        # only root can write the shared cache. The fetch still drops every capability but the file
        # ones it needs; the files it leaves in the model volume are world-readable for the server.
        container_security.update(
            {
                "runAsUser": 0,
                "runAsNonRoot": False,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            }
        )
    init = {
        "name": FETCH_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(FETCH_COMMAND),
        "args": _fetch_args(spec, storage),
        "env": _fetch_env(storage),
        "resources": dict(resources),
        "securityContext": container_security,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    return ModelSource(
        server_uri=f"file://{MODEL_DIR}",
        server_checks_sha256=False,
        init_containers=[init],
        volumes=volumes,
        server_mounts=[{"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}],
    )


def _pvc(spec: ModelDeploymentSpec) -> ModelSource:
    claim, path = _pvc_parts(spec.model.uri)
    return ModelSource(
        server_uri=f"file://{PVC_DIR}/{path}" if path else f"file://{PVC_DIR}",
        volumes=[{"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}],
        server_mounts=[{"name": MODEL_VOLUME, "mountPath": PVC_DIR, "readOnly": True}],
    )


def model_source(
    spec: ModelDeploymentSpec,
    image: str,
    security: Mapping[str, Any] | None = None,
    resources: Mapping[str, Any] | None = None,
) -> ModelSource:
    """How a pod of this spec gets its model. ``security`` and ``resources`` are the server container's
    (the fetch container runs under the same constraints)."""
    kind = scheme(spec.model.uri)
    if kind == "s3":
        return _s3(spec, image, security or {}, resources or {})
    if kind == "pvc":
        return _pvc(spec)
    return ModelSource(server_uri=spec.model.uri)


# ---------------------------------------------------------------------------------------------- pod status


@dataclass(frozen=True)
class FetchFailure:
    reason: str
    message: str


def parse_termination_message(message: str | None) -> FetchFailure:
    """``"NotFound: no object under s3://b/p"`` -> FetchFailure("NotFound", "no object under s3://b/p").
    Anything else (a traceback's tail, an empty message) is ``FetchFailed`` with its last line."""
    lines = [line.strip() for line in (message or "").strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    reason, sep, rest = first.partition(":")
    if sep and reason.strip() in FETCH_REASONS:
        return FetchFailure(reason.strip(), rest.strip())
    return FetchFailure("FetchFailed", (lines[-1] if lines else "the fetch init container failed")[:512])


def fetch_failure(pod: Mapping[str, Any]) -> FetchFailure | None:
    """The fetch init container's last failure, as the kubelet reports it: ``state.terminated`` with a
    non-zero exit, or ``lastState.terminated`` while it waits to be restarted (CrashLoopBackOff)."""
    for st in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if st.get("name") != FETCH_CONTAINER:
            continue
        now = (st.get("state") or {}).get("terminated")
        if now is not None and now.get("exitCode", 0) == 0:
            return None  # fetched (perhaps after failures)
        for key in ("state", "lastState"):
            term = (st.get(key) or {}).get("terminated")
            if term and term.get("exitCode", 0) != 0:
                return parse_termination_message(term.get("message"))
        return None
    return None
