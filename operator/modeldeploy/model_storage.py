"""Where a revision's pods get the model from: the pure part of ``spec.model.uri``'s storage schemes.

* ``s3://bucket/prefix``: an init container ``fetch-model`` downloads the object or prefix into the pod's
  ``model`` emptyDir (``sizeLimit``: ``storage.maxSize``, else the chart's), optionally through a
  node-local cache; the server then loads ``file:///mnt/models``. The init container runs the operator's
  fetch image (:func:`fetch_image`, the chart's ``operator.fetchImage``), never the author's
  ``spec.image``: it is the only code that writes the node cache (issue 24, finding 1). The cache is one
  hostPath directory per namespace, ``<nodeCachePath>/<namespace>``, the only one mounted writable; the
  whole cache is mounted read-only beside it so that a fill can keep the node under the chart's node-wide
  cap by evicting its own namespace's entries. Both caps are the chart's; ``nodeCache.maxSize`` may only
  lower the namespace's.
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

from .api import ModelDeploymentSpec, StorageSpec, default_image, parse_duration

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


#: in the fetch container: this namespace's cache (read-write) and the node's whole cache (read-only)
CACHE_DIR = "/var/cache/modeldeploy/models"
NODE_CACHE_VOLUME = "model-cache-node"
NODE_CACHE_DIR = "/var/cache/modeldeploy/node"
#: the chart's caps (``nodeCache.maxSizePerNamespace``, ``nodeCache.maxSize``) and the model emptyDir's
#: ``sizeLimit`` where ``storage.maxSize`` is unset (``operator.modelVolumeSizeLimit``)
DEFAULT_NAMESPACE_CACHE_MAX = "100Gi"
DEFAULT_NODE_CACHE_MAX = "200Gi"
DEFAULT_MODEL_VOLUME_LIMIT = "100Gi"


def fetch_image() -> str:
    """The fetch init container's image: ``$MODELDEPLOY_FETCH_IMAGE`` (the chart's ``operator.fetchImage``,
    pinned by digest in production) or the operator's default serving image -- never ``spec.image``."""
    return os.environ.get("MODELDEPLOY_FETCH_IMAGE") or default_image()


def _env_bytes(name: str, default: str) -> int:
    return int(parse_quantity(os.environ.get(name) or default))


def namespace_cache_max() -> int:
    return _env_bytes("MODELDEPLOY_NODE_CACHE_NAMESPACE_MAX", DEFAULT_NAMESPACE_CACHE_MAX)


def node_cache_max() -> int:
    return _env_bytes("MODELDEPLOY_NODE_CACHE_MAX", DEFAULT_NODE_CACHE_MAX)


def model_volume_limit(storage: StorageSpec) -> str:
    env = os.environ.get("MODELDEPLOY_MODEL_VOLUME_SIZE_LIMIT")
    return str(storage.max_size or env or DEFAULT_MODEL_VOLUME_LIMIT)


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


def _fetch_args(spec: ModelDeploymentSpec, storage: StorageSpec, namespace: str) -> list[str]:
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
        own = min(int(parse_quantity(cache.max_size)), namespace_cache_max())
        args += ["--cache-dir", CACHE_DIR, "--cache-max-bytes", str(own)]
        args += ["--cache-node-dir", NODE_CACHE_DIR, "--cache-node-max-bytes", str(node_cache_max())]
        args += ["--cache-namespace", namespace]
    return args


def _cache_volumes(namespace: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(mounts, volumes) of the node cache: this namespace's directory writable, the whole cache read-only."""
    mounts: list[dict[str, Any]] = [
        {"name": CACHE_VOLUME, "mountPath": CACHE_DIR},
        {"name": NODE_CACHE_VOLUME, "mountPath": NODE_CACHE_DIR, "readOnly": True},
    ]
    root = cache_host_path().rstrip("/")
    volumes: list[dict[str, Any]] = [
        {"name": CACHE_VOLUME, "hostPath": {"path": f"{root}/{namespace}", "type": "DirectoryOrCreate"}},
        {"name": NODE_CACHE_VOLUME, "hostPath": {"path": root, "type": "DirectoryOrCreate"}},
    ]
    return mounts, volumes


def _s3(
    spec: ModelDeploymentSpec, namespace: str, security: Mapping[str, Any], resources: Mapping[str, Any]
) -> ModelSource:
    storage = spec.model.storage or StorageSpec()
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": MODEL_VOLUME, "mountPath": MODEL_DIR},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": MODEL_VOLUME, "emptyDir": {"sizeLimit": model_volume_limit(storage)}}
    ]
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
        cache_mounts, cache_volumes = _cache_volumes(namespace)
        mounts += cache_mounts
        volumes += cache_volumes
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
        "image": fetch_image(),
        "imagePullPolicy": "IfNotPresent",
        "command": list(FETCH_COMMAND),
        "args": _fetch_args(spec, storage, namespace),
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
    namespace: str,
    security: Mapping[str, Any] | None = None,
    resources: Mapping[str, Any] | None = None,
) -> ModelSource:
    """How a pod of this spec, in ``namespace``, gets its model. ``security`` and ``resources`` are the
    server container's (the fetch container runs under the same constraints)."""
    kind = scheme(spec.model.uri)
    if kind == "s3":
        return _s3(spec, namespace, security or {}, resources or {})
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
