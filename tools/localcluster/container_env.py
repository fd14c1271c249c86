"""A process-run container's environment, as the kubelet makes it: the agent's own environment less
its Kubernetes settings, the pod's name, ``env`` and ``envFrom`` (values from fields, Secrets and
ConfigMaps resolved) and ``KUBECONFIG``, a kubeconfig with the pod's service-account token (the local
stand-in for in-cluster config). A missing object or key is a :class:`ConfigError`."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from . import images
from .kubeapi import KubeError

if TYPE_CHECKING:
    from .agent import NodeAgent

log = logging.getLogger("localcluster.agent")


class ConfigError(RuntimeError):
    """A container's configuration cannot be made (a missing Secret or ConfigMap key): the kubelet's
    ``CreateContainerConfigError``, retried."""


class ContainerEnv:
    """Builds the environment of one pod's containers (:meth:`build`); ``pod_dir`` keeps the pod's
    service-account kubeconfig."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any], *, ip: str, pod_dir: Path) -> None:
        self.agent = agent
        self.uid: str = pod["metadata"]["uid"]
        self.ns: str = pod["metadata"]["namespace"]
        self.name: str = pod["metadata"]["name"]
        self.ip = ip
        self.dir = pod_dir

    def build(self, container: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
        """The container's environment; :class:`ConfigError` when a referenced object or key is missing."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_"))}
        env.update({"HOSTNAME": self.name, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        entry = images.entry_for(container["image"])
        if entry and entry.host_env:
            env[entry.host_env] = self.ip
        sa_kubeconfig = self._service_account_kubeconfig(pod)
        if sa_kubeconfig:
            env["KUBECONFIG"] = str(sa_kubeconfig)
        for src in container.get("envFrom") or []:
            env.update(self._env_from(src))
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif "valueFrom" in e:
                value = self._value_from(e["valueFrom"], pod)
                if value is not None:
                    env[e["name"]] = value
            else:
                env[e["name"]] = ""
        return env

    def _object(self, kind: str, name: str) -> dict[str, Any] | None:
        plural = "secrets" if kind == "Secret" else "configmaps"
        return self.agent.api.get(f"/api/v1/namespaces/{self.ns}/{plural}/{name}", ok_missing=True)

    def _referenced(self, kind: str, ref: dict[str, Any]) -> dict[str, Any] | None:
        """The Secret or ConfigMap ``ref`` names; None when it is missing and ``optional``, else
        :class:`ConfigError`."""
        obj = self._object(kind, ref["name"])
        if obj is None and not ref.get("optional"):
            raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
        return obj

    @staticmethod
    def _data(kind: str, obj: dict[str, Any]) -> dict[str, str]:
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return {str(k): str(v) for k, v in (obj.get("data") or {}).items()}

    def _env_from(self, src: dict[str, Any]) -> dict[str, str]:
        prefix = str(src.get("prefix") or "")
        for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            if key in src:
                ref = src[key]
                obj = self._referenced(kind, ref)
                if obj is None:
                    return {}
                return {prefix + k: v for k, v in self._data(kind, obj).items()}
        return {}

    def _value_from(self, source: dict[str, Any], pod: dict[str, Any]) -> str | None:
        if "fieldRef" in source:
            fields = {
                "metadata.name": self.name,
                "metadata.namespace": self.ns,
                "metadata.uid": self.uid,
                "spec.nodeName": pod["spec"].get("nodeName", ""),
                "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                "status.podIP": self.ip,
                "status.hostIP": "127.0.0.1",
            }
            path = source["fieldRef"]["fieldPath"]
            if path.startswith("metadata.labels['") or path.startswith("metadata.annotations['"):
                kind, key = path.split("['", 1)
                return str((pod["metadata"].get(kind.split(".")[1]) or {}).get(key.rstrip("']"), ""))
            return fields.get(path)
        for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            if ref_key in source:
                ref = source[ref_key]
                obj = self._referenced(kind, ref)
                if obj is None:
                    return None
                data = self._data(kind, obj)
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(f"couldn't find key {ref['key']} in {kind} {self.ns}/{ref['name']}")
                return data[ref["key"]]
        return None

    def _service_account_kubeconfig(self, pod: dict[str, Any]) -> Path | None:
        """A kubeconfig with the pod's service-account token: the local stand-in for in-cluster config."""
        spec = pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        path = self.dir / "serviceaccount.kubeconfig"
        if path.exists():
            return path
        sa = spec.get("serviceAccountName") or "default"
        try:
            resp = self.agent.api.create(
                f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {
                        "expirationSeconds": 86400,
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": self.name,
                            "uid": self.uid,
                        },
                    },
                },
            )
        except KubeError as exc:
            log.warning("no service-account token for %s/%s: %s", self.ns, self.name, exc)
            return None
        token = (resp or {})["status"]["token"]
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {
                        "server": self.agent.server_for_pods,
                        "certificate-authority": self.agent.ca_file,
                    },
                }
            ],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [
                {"name": "in-cluster", "context": {"cluster": "in-cluster", "user": sa, "namespace": self.ns}}
            ],
            "current-context": "in-cluster",
        }
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path
