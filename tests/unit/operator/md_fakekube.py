"""An in-memory stand-in for :class:`modeldeploy.kube.Kube` (enough apiserver for the reconciler)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from modeldeploy import kube as k


def _merge(base: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.writes: list[tuple[str, str, str]] = []
        self.events: list[dict[str, Any]] = []
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)

    # -- helpers for tests
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._rv))
        if obj["kind"] == "Service":  # the apiserver allocates a ClusterIP
            obj.setdefault("spec", {}).setdefault("clusterIP", f"10.96.0.{len(self.of_kind('Service')) + 10}")
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (kd, _, _), o in sorted(self.objects.items()) if kd == kind]

    def obj(self, kind: str, name: str, ns: str = "default") -> dict[str, Any] | None:
        return self.objects.get((kind, ns, name))

    # -- the Kube interface used by the reconciler
    def get(self, rt: k.ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        o = self.objects.get((rt.kind, namespace, name))
        return copy.deepcopy(o) if o else None

    def list(self, rt: k.ResourceType, namespace: str | None, label_selector: str | None = None):
        key, _, value = (label_selector or "").partition("=")
        out = []
        for (kind, ns, _), o in sorted(self.objects.items()):
            if kind != rt.kind or ns != namespace:
                continue
            if key and (o["metadata"].get("labels") or {}).get(key) != value:
                continue
            out.append(copy.deepcopy(o))
        return out

    def apply(self, obj: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        self.writes.append(("apply", obj["kind"], obj["metadata"]["name"]))
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        live = self.objects.get(key)
        if live is None:
            return copy.deepcopy(self.put(obj))
        merged = _merge(live, obj)
        # lists and owned fields are replaced wholesale, like an apply of the full desired object
        merged["spec"] = _merge(live.get("spec", {}), obj.get("spec", {}))
        if obj["kind"] == "Service":  # every field of a Service's spec is ours but the allocated ClusterIP:
            # a field left out of an apply is released (server-side apply), not kept
            merged["spec"] = {
                **copy.deepcopy(obj.get("spec", {})),
                "clusterIP": live["spec"].get("clusterIP"),
            }
        if merged != live:
            merged["metadata"]["resourceVersion"] = str(next(self._rv))
            self.objects[key] = merged
        return copy.deepcopy(self.objects[key])

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "Event":
            self.events.append(obj)
            return obj
        self.writes.append(("create", obj["kind"], obj["metadata"]["name"]))
        return self.put(obj)

    def delete(self, rt: k.ResourceType, namespace: str | None, name: str, uid: str | None = None) -> bool:
        self.writes.append(("delete", rt.kind, name))
        return self.objects.pop((rt.kind, namespace, name), None) is not None

    def merge_patch(self, rt, namespace, name, patch, sub=None):
        self.writes.append(("patch", rt.kind if sub is None else f"{rt.kind}/{sub}", name))
        key = (rt.kind, namespace, name)
        live = self.objects.get(key)
        if live is None:
            raise k.KubeError(404, {"message": "not found"}, "PATCH", name)
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != live["metadata"]["resourceVersion"]:
            raise k.KubeError(409, {"message": "conflict"}, "PATCH", name)
        body = {"status": patch["status"]} if sub == "status" else patch
        merged = _merge(live, body)
        merged["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[key] = merged
        return copy.deepcopy(merged)

    def strategic_patch(self, rt, namespace, name, patch, sub=None):
        self.writes.append(("patch", rt.kind if sub is None else f"{rt.kind}/{sub}", name))
        key = (rt.kind, namespace, name)
        live = self.objects.get(key)
        if live is None:
            raise k.KubeError(404, {"message": "not found"}, "PATCH", name)
        conds = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
        for c in patch["status"]["conditions"]:
            conds[c["type"]] = c
        live.setdefault("status", {})["conditions"] = list(conds.values())
        live["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(live)
