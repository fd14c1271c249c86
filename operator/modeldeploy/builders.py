"""Pure builders: the desired children of a ModelDeployment, as plain dicts.

Nothing here does I/O. Each function takes the parsed ModelDeployment (and for a Deployment, the
revision's pod-shaping spec and its replica count) and returns the object the operator server-side
applies. Children:

* one ``Deployment`` per revision, named ``<md>-<revision>``;
* the model ``Service`` ``<md>`` over every pod of the ModelDeployment that is in traffic;
* one ``Service`` per revision, ``<md>-<revision>``, for routers that weight revisions (Gateway API)
  and to reach one revision directly;
* one ``PodDisruptionBudget`` ``<md>``.

A *revision* is the stable hash of everything that shapes the pods (model, image, batching, resources,
nodeSelector, tolerations) -- see :func:`revision_spec` and :func:`revision_hash`. Replicas and the
rollout policy are not part of it: changing them applies in place.

Traffic: serving pods carry the readiness gate ``modeldeploy.io/in-traffic``. The operator sets that pod
condition to True for pods that should serve and False for warm pods out of traffic, so pods go in and
out of the Service's endpoints without a restart.

Shadow copies: the operator sets the pod annotation ``modeldeploy.io/shadow`` on the pods that should copy
a sample of their requests to another revision; the server reads it from a downward-API volume
(``/etc/modeldeploy/podinfo/shadow``), which the kubelet refreshes without a restart. The annotation
picks the target *revision* only: the server builds the URL itself from ``MODELSERVER_SHADOW_SERVICE``,
which the pod template fixes to the ModelDeployment's own revision Services in its own namespace
(:func:`shadow_service`), so a patched annotation cannot send users' requests anywhere else. The target's
revision Service publishes its not-ready (warm, out-of-traffic) pods while they are a copy target.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from typing import Any

from kubernetes.utils import parse_quantity

from . import api, model_storage
from .api import ModelDeployment, ModelDeploymentSpec, default_image
from .api_generation import GenerationSpec

LABEL_NAME = "modeldeploy.io/name"
LABEL_REVISION = "modeldeploy.io/revision"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_REVISION_SPEC = "modeldeploy.io/revision-spec"
ANNOTATION_APPLIED = "modeldeploy.io/applied-hash"
READINESS_GATE = "modeldeploy.io/in-traffic"
#: on a serving pod: where to copy a sample of its answered requests (JSON; see modelserver.shadow)
ANNOTATION_SHADOW = "modeldeploy.io/shadow"
PODINFO_DIR = "/etc/modeldeploy/podinfo"
SHADOW_FILE = f"{PODINFO_DIR}/shadow"
FIELD_MANAGER = "modeldeploy"
MANAGED_BY = "modeldeploy-operator"

SERVER_PORT = 8080
PORT_NAME = "http"
CONTAINER_NAME = "modelserver"
READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"
#: seconds the pod keeps serving after it was removed from endpoints, before SIGTERM
PRESTOP_SLEEP_SECONDS = 5
#: slack on top of the preStop sleep and the longest request (drain) for the grace period
GRACE_SLACK_SECONDS = 10
REVISION_HASH_LENGTH = 10
SERVER_COMMAND = ["python", "-m", "modelserver"]
GPU_RESOURCE = "nvidia.com/gpu"
RUN_AS_USER = 10001
#: where the server writes a model it downloads (http(s)://) or unpacks (an archive): the image's
#: MODELSERVER_DOWNLOAD_DIR. The root filesystem is read-only, so it is an emptyDir of its own
DOWNLOAD_DIR = "/var/lib/modelserver"


# ---------------------------------------------------------------------------------------------- revision


def revision_spec(spec: ModelDeploymentSpec) -> dict[str, Any]:
    """Everything of the spec that shapes the pods, in wire form (camelCase, defaults filled in).

    Changing any of it makes a new revision. ``replicas`` and ``rollout`` are deliberately absent.
    """
    return {
        "model": spec.model.to_api(),
        "image": spec.image or default_image(),
        "resources": spec.resources.to_api(),
        "nodeSelector": dict(sorted(spec.node_selector.items())),
        "tolerations": [t.to_api() for t in spec.tolerations],
        "batching": spec.batching.to_api(),
    }


def revision_hash(rev_spec: dict[str, Any]) -> str:
    """A short, stable hash of a revision spec (canonical JSON, sha256, first 10 hex digits).

    Defaults are filled in before hashing (the apiserver fills them too), so spelling out a default
    value and omitting it give the same revision. Quantities are hashed as written.
    """
    canonical = json.dumps(rev_spec, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_HASH_LENGTH]


def spec_revision(spec: ModelDeploymentSpec) -> str:
    return revision_hash(revision_spec(spec))


def revision_spec_from_annotation(value: str) -> ModelDeploymentSpec:
    """Rebuild a (partial) spec from a Deployment's revision-spec annotation, to re-render it."""
    data = json.loads(value)
    return ModelDeploymentSpec.model_validate(data)


# ---------------------------------------------------------------------------------------------- common


def deployment_name(md_name: str, revision: str) -> str:
    return f"{md_name}-{revision}"


def revision_service_name(md_name: str, revision: str) -> str:
    return f"{md_name}-{revision}"


DEFAULT_CLUSTER_DOMAIN = "cluster.local"


def cluster_domain() -> str:
    """The cluster's DNS domain: ``$MODELDEPLOY_CLUSTER_DOMAIN`` (the chart's ``operator.clusterDomain``)
    or ``cluster.local``."""
    return os.environ.get("MODELDEPLOY_CLUSTER_DOMAIN") or DEFAULT_CLUSTER_DOMAIN


def shadow_service(md: ModelDeployment, revision: str = "{revision}") -> str:
    """The URL of ``revision``'s Service (by name, in the ModelDeployment's namespace). With the default
    ``{revision}`` it is the server's ``MODELSERVER_SHADOW_SERVICE``, the only place it copies to."""
    host = f"{revision_service_name(md.name, revision)}.{md.namespace}.svc.{cluster_domain()}"
    return f"http://{host}:{SERVER_PORT}"


def selector_labels(md_name: str) -> dict[str, str]:
    return {LABEL_NAME: md_name}


def revision_selector_labels(md_name: str, revision: str) -> dict[str, str]:
    return {LABEL_NAME: md_name, LABEL_REVISION: revision}


def common_labels(md: ModelDeployment) -> dict[str, str]:
    return {
        LABEL_NAME: md.name,
        "app.kubernetes.io/name": "modelserver",
        "app.kubernetes.io/instance": md.name,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def owner_reference(md: ModelDeployment) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": md.name,
        "uid": md.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(md: ModelDeployment, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": md.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(md)],
    }


def stamp(obj: dict[str, Any]) -> dict[str, Any]:
    """Record the hash of the desired object in an annotation (so a change of what we want, including
    a removed field, is seen without a field-by-field comparison)."""
    body = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    obj.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION_APPLIED] = digest
    return obj


# ---------------------------------------------------------------------------------------------- pods


def termination_grace_seconds(spec: ModelDeploymentSpec) -> int:
    """Long enough for the preStop sleep, the longest admissible request, and some slack."""
    return PRESTOP_SLEEP_SECONDS + math.ceil(spec.batching.max_timeout_ms / 1000) + GRACE_SLACK_SECONDS


def torch_threads(cpu: int | str) -> int:
    """torch's intra-op threads for a pod that requests ``cpu``: the whole cores it asked for, at least one.

    torch's default is one thread per core of the node: on a 64-core node, pods that asked for 2 cores
    would each run 64 threads and slow one another down; pods that stay within their request add
    throughput as they are added (the autoscaler's premise)."""
    return max(1, math.floor(parse_quantity(cpu)))


def server_env(
    md_name: str, spec: ModelDeploymentSpec, revision: str = "", shadow_to: str = ""
) -> list[dict[str, str]]:
    """Environment of the server container: model and batching settings (``MODELSERVER_*``; ``shadow_to``
    is :func:`shadow_service`), and the ModelDeployment's name and the pod's revision (``MODELDEPLOY_*``)."""
    m, b = spec.model, spec.batching
    source = model_storage.model_source(spec, "")  # the server's side: the same in every namespace
    env = {
        "MODELSERVER_MODEL_URI": source.server_uri,
        "MODELSERVER_MODEL_NAME": m.name,
        "MODELSERVER_MODEL_VERSION": m.version,
        "MODELSERVER_MODEL_FORMAT": m.format,
        "MODELSERVER_TASK": m.task,
        "MODELSERVER_PORT": str(SERVER_PORT),
        "MODELSERVER_MAX_BATCH_SIZE": str(b.max_batch_size),
        "MODELSERVER_MAX_QUEUE_DELAY_MS": str(b.max_queue_delay_ms),
        "MODELSERVER_MAX_QUEUE_SIZE": str(b.max_queue_size),
        "MODELSERVER_MAX_SEQUENCE_LENGTH": str(b.max_sequence_length),
        "MODELSERVER_BUCKETS": ",".join(str(x) for x in b.buckets) if b.buckets else "auto",
        "MODELSERVER_DEFAULT_TIMEOUT_MS": str(b.default_timeout_ms),
        "MODELSERVER_MAX_TIMEOUT_MS": str(b.max_timeout_ms),
        # "auto" picks CUDA when the pod got a GPU and falls back to CPU otherwise
        "MODELSERVER_DEVICE": "auto" if spec.resources.gpu > 0 else "cpu",
        "MODELSERVER_NUM_THREADS": str(torch_threads(spec.resources.cpu)),
        "MODELSERVER_SHADOW_FILE": SHADOW_FILE,
    }
    if shadow_to:
        env["MODELSERVER_SHADOW_SERVICE"] = shadow_to
    if m.task == "generation":
        env.update((spec.generation or GenerationSpec()).server_env())
    if m.sha256 and source.server_checks_sha256:
        env["MODELSERVER_MODEL_SHA256"] = m.sha256
    if m.handler:
        env["MODELSERVER_HANDLER"] = m.handler
    # the root filesystem is read-only and nothing may come from a model hub at run time
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_HOME"] = "/tmp/hf"
    out = [{"name": k, "value": v} for k, v in env.items()]
    out.append({"name": "MODELDEPLOY_NAME", "value": md_name})  # for logs; not a server setting
    if revision:
        # sent back in every answer's x-modeldeploy-revision header: who answered, behind a Service or a
        # gateway
        out.append({"name": "MODELDEPLOY_REVISION", "value": revision})
    return out


def resources(spec: ModelDeploymentSpec) -> dict[str, Any]:
    r = spec.resources
    requests: dict[str, Any] = {"cpu": str(r.cpu), "memory": str(r.memory)}
    limits: dict[str, Any] = {"memory": str(r.memory)}
    if r.gpu > 0:
        # extended resources: the request must equal the limit; setting the limit implies it
        limits[GPU_RESOURCE] = str(r.gpu)
        requests[GPU_RESOURCE] = str(r.gpu)
    return {"requests": requests, "limits": limits}


def _probe(path: str, period: int, failure_threshold: int, timeout: int = 2) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME, "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failure_threshold,
        "successThreshold": 1,
    }


CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_template(md: ModelDeployment, spec: ModelDeploymentSpec, revision: str) -> dict[str, Any]:
    labels = {**common_labels(md), LABEL_REVISION: revision, LABEL_COMPONENT: "server"}
    image = spec.image or default_image()
    source = model_storage.model_source(spec, md.namespace, CONTAINER_SECURITY, resources(spec))
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(SERVER_COMMAND),
        "ports": [{"name": PORT_NAME, "containerPort": SERVER_PORT, "protocol": "TCP"}],
        "env": server_env(md.name, spec, revision, shadow_service(md)),
        "resources": resources(spec),
        # loading a model can take minutes: the startup probe allows 10 min before liveness counts
        "startupProbe": _probe(LIVE_PATH, period=2, failure_threshold=300),
        "readinessProbe": _probe(READY_PATH, period=2, failure_threshold=2),
        "livenessProbe": _probe(LIVE_PATH, period=10, failure_threshold=3, timeout=5),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": copy.deepcopy(CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "downloads", "mountPath": DOWNLOAD_DIR},
            {"name": "podinfo", "mountPath": PODINFO_DIR, "readOnly": True},
            *source.server_mounts,
        ],
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "readinessGates": [{"conditionType": READINESS_GATE}],
        "terminationGracePeriodSeconds": termination_grace_seconds(spec),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "downloads", "emptyDir": {}},
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {
                            "path": "shadow",
                            "fieldRef": {
                                "apiVersion": "v1",
                                "fieldPath": f"metadata.annotations['{ANNOTATION_SHADOW}']",
                            },
                        }
                    ]
                },
            },
            *source.volumes,
        ],
    }
    if source.init_containers:
        pod_spec["initContainers"] = source.init_containers
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    if spec.tolerations:
        pod_spec["tolerations"] = [t.to_api() for t in spec.tolerations]
    return {
        "metadata": {
            "labels": labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(SERVER_PORT),
                "prometheus.io/path": "/metrics",
                "modeldeploy.io/model": f"{spec.model.name}:{spec.model.version}",
            },
        },
        "spec": pod_spec,
    }


# ---------------------------------------------------------------------------------------------- children


def build_deployment(
    md: ModelDeployment, spec: ModelDeploymentSpec, revision: str, replicas: int
) -> dict[str, Any]:
    """The Deployment of one revision. ``spec`` is the revision's pod-shaping spec (the current spec for
    the current revision, the recorded one for older revisions); ``replicas`` comes from the plan."""
    rev_spec = revision_spec(spec)
    labels = {**common_labels(md), LABEL_REVISION: revision, LABEL_COMPONENT: "server"}
    meta = _metadata(md, deployment_name(md.name, revision), labels)
    meta["annotations"] = {
        ANNOTATION_REVISION_SPEC: json.dumps(rev_spec, sort_keys=True, separators=(",", ":")),
    }
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": {
                "replicas": replicas,
                "revisionHistoryLimit": 2,
                # a revision's template never changes; 10 min covers a slow model load
                "progressDeadlineSeconds": 600,
                "selector": {"matchLabels": revision_selector_labels(md.name, revision)},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
                },
                "template": pod_template(md, spec, revision),
            },
        }
    )


def _service_port() -> dict[str, Any]:
    return {"name": PORT_NAME, "port": SERVER_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}


def build_model_service(md: ModelDeployment) -> dict[str, Any]:
    """The Service clients use: every pod of the ModelDeployment that is Ready (in traffic)."""
    labels = {**common_labels(md), LABEL_COMPONENT: "model-service"}
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(md, md.name, labels),
            "spec": {
                "type": "ClusterIP",
                "selector": selector_labels(md.name),
                "ports": [_service_port()],
            },
        }
    )


def build_revision_service(
    md: ModelDeployment, revision: str, publish_not_ready: bool = False
) -> dict[str, Any]:
    """A Service over one revision's pods (a Gateway API backend; direct access for debugging; where
    shadow copies go). ``publish_not_ready``: its warm, out-of-traffic pods are endpoints too (a shadow
    revision, or a warm previous one being compared with the stable during bakeTime)."""
    labels = {**common_labels(md), LABEL_REVISION: revision, LABEL_COMPONENT: "revision-service"}
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(md, revision_service_name(md.name, revision), labels),
            "spec": {
                "type": "ClusterIP",
                "selector": revision_selector_labels(md.name, revision),
                "ports": [_service_port()],
                # only when true: the apiserver drops a false value, which would read as drift; an
                # apply without the field releases it (server-side apply), i.e. back to false
                **({"publishNotReadyAddresses": True} if publish_not_ready else {}),
            },
        }
    )


def build_pdb(md: ModelDeployment) -> dict[str, Any]:
    """At most one serving pod voluntarily disrupted at a time; warm (not in traffic, hence not Ready)
    pods may always be evicted."""
    labels = {**common_labels(md), LABEL_COMPONENT: "disruption-budget"}
    return stamp(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _metadata(md, md.name, labels),
            "spec": {
                "maxUnavailable": 1,
                "selector": {"matchLabels": selector_labels(md.name)},
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
    )
