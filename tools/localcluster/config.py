"""The local cluster's configuration: pure builders of command lines, kubeconfigs, objects and
configuration files for each part, and the constants they share. Nothing here starts a process or
touches the network. Each part has a module of its own, and this one gathers their names:

* :mod:`localcluster.control_plane_config`: kubeconfigs, etcd, kube-apiserver (its audit policy),
  kube-controller-manager, kube-scheduler, the ``default/kubernetes`` EndpointSlice;
* :mod:`localcluster.proxy_config`: kube-proxy;
* :mod:`localcluster.gateway_config`: Traefik and the shared Gateway;
* :mod:`localcluster.objectstore_config`: versitygw;
* :mod:`localcluster.kwok_config`: the fake nodes and kwok's stages;
* :mod:`localcluster.monitoring_config`: Prometheus;
* :mod:`localcluster.keda_config`: the aggregation layer and KEDA.
"""

from __future__ import annotations

from .control_plane_config import (
    AUDIT_POLICY,
    HPA_SYNC_PERIOD,
    READ_VERBS,
    WRITE_VERBS,
    apiserver_args,
    controller_manager_args,
    etcd_args,
    kubeconfig,
    kubernetes_endpointslice,
    scheduler_args,
)
from .gateway_config import (
    GATEWAY_API_RESOURCES,
    GATEWAY_CLASS,
    GATEWAY_CONTROLLER,
    GATEWAY_NAME,
    GATEWAY_NAMESPACE,
    GATEWAY_PORT,
    TRAEFIK_PING_PORT,
    TRAEFIK_RULES,
    TRAEFIK_THROTTLE,
    gateway_objects,
    gateway_programmed,
    traefik_args,
)
from .keda_config import (
    FRONT_PROXY_CLIENT,
    KEDA_ADAPTER_METRICS_PORT,
    KEDA_ADAPTER_PORT,
    KEDA_APISERVICE,
    KEDA_GRPC_PORT,
    KEDA_METRICS_SERVICE,
    KEDA_NAMESPACE,
    KEDA_OPERATOR_METRICS_PORT,
    KEDA_OPERATOR_PROBE_PORT,
    KEDA_SERVICE_ACCOUNT,
    KEDA_USER,
    aggregation_layer_args,
    api_service_available,
    json_patch,
    keda_adapter_args,
    keda_crds,
    keda_env,
    keda_metrics_objects,
    keda_operator_args,
    keda_rbac,
)
from .kwok_config import (
    AGENT_IMAGE_PATTERN,
    CPU_NODE,
    GPU_NODE,
    GPU_RESOURCE,
    KWOK_NODE_ANNOTATION,
    NODE_IP,
    default_nodes,
    kwok_args,
    kwok_stages,
    node_manifest,
)
from .monitoring_config import (
    prometheus_args,
    prometheus_config,
)
from .objectstore_config import (
    S3_HEALTH_PATH,
    S3_PORT,
    S3_REGION,
    versitygw_args,
)
from .proxy_config import (
    KUBE_PROXY_HEALTHZ_PORT,
    KUBE_PROXY_METRICS_PORT,
    kube_proxy_args,
    kube_proxy_config,
    proxy_mode,
)

__all__ = [
    "AGENT_IMAGE_PATTERN",
    "AUDIT_POLICY",
    "CPU_NODE",
    "FRONT_PROXY_CLIENT",
    "GATEWAY_API_RESOURCES",
    "GATEWAY_CLASS",
    "GATEWAY_CONTROLLER",
    "GATEWAY_NAME",
    "GATEWAY_NAMESPACE",
    "GATEWAY_PORT",
    "GPU_NODE",
    "GPU_RESOURCE",
    "HPA_SYNC_PERIOD",
    "KEDA_ADAPTER_METRICS_PORT",
    "KEDA_ADAPTER_PORT",
    "KEDA_APISERVICE",
    "KEDA_GRPC_PORT",
    "KEDA_METRICS_SERVICE",
    "KEDA_NAMESPACE",
    "KEDA_OPERATOR_METRICS_PORT",
    "KEDA_OPERATOR_PROBE_PORT",
    "KEDA_SERVICE_ACCOUNT",
    "KEDA_USER",
    "KUBE_PROXY_HEALTHZ_PORT",
    "KUBE_PROXY_METRICS_PORT",
    "KWOK_NODE_ANNOTATION",
    "NODE_IP",
    "READ_VERBS",
    "S3_HEALTH_PATH",
    "S3_PORT",
    "S3_REGION",
    "TRAEFIK_PING_PORT",
    "TRAEFIK_RULES",
    "TRAEFIK_THROTTLE",
    "WRITE_VERBS",
    "aggregation_layer_args",
    "api_service_available",
    "apiserver_args",
    "controller_manager_args",
    "default_nodes",
    "etcd_args",
    "gateway_objects",
    "gateway_programmed",
    "json_patch",
    "keda_adapter_args",
    "keda_crds",
    "keda_env",
    "keda_metrics_objects",
    "keda_operator_args",
    "keda_rbac",
    "kube_proxy_args",
    "kube_proxy_config",
    "kubeconfig",
    "kubernetes_endpointslice",
    "kwok_args",
    "kwok_stages",
    "node_manifest",
    "prometheus_args",
    "prometheus_config",
    "proxy_mode",
    "scheduler_args",
    "traefik_args",
    "versitygw_args",
]
