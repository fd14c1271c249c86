"""The CPU fallback as a spec: when the GPU revision has no pod in traffic for `after`, a CPU revision
answers; when every GPU pod is ready again for `returnAfter`, traffic goes back (make before break) --
the reconciler against the in-memory apiserver with a fake clock (md_canary.py), GPUs switched off and on
by the test."""

from __future__ import annotations

import copy
from typing import Any

from md_canary import World, canary_md, watch_the_route
from modeldeploy import builders as b
from modeldeploy.api import ModelDeploymentSpec
from modeldeploy.fallback import fallback_spec

FALLBACK = {"after": "60s", "returnAfter": "30s", "replicas": 1, "cpu": "2", "memory": "4Gi"}


def gpu_md(fallback: dict[str, Any] | None = None, **rollout: Any) -> dict[str, Any]:
    body = canary_md(**rollout)
    body["spec"]["resources"] = {"gpu": 1, "cpu": "1", "memory": "2Gi"}
    body["spec"]["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
    if fallback is not None:
        body["spec"]["fallback"] = fallback
    return body


class GPUWorld(World):
    """Pods that request a GPU cannot be scheduled while ``gpu_up`` is False."""

    gpu_up = True

    def gpu_revisions(self) -> set[str]:
        out = set()
        for d in self.fake.of_kind("Deployment"):
            c = d["spec"]["template"]["spec"]["containers"][0]
            if "nvidia.com/gpu" in (c["resources"].get("limits") or {}):
                out.add(d["metadata"]["labels"][b.LABEL_REVISION])
        return out

    def controllers(self) -> None:
        super().controllers()
        gpu = self.gpu_revisions()
        for p in self.pods():
            if p["metadata"]["labels"][b.LABEL_REVISION] not in gpu:
                continue
            conds = {c["type"]: c for c in p["status"]["conditions"]}
            if self.gpu_up:
                if conds["PodScheduled"]["status"] == "False":  # scheduled again, started, ready
                    conds["PodScheduled"] = {"type": "PodScheduled", "status": "True"}
                    conds["ContainersReady"] = {"type": "ContainersReady", "status": "True"}
                    p["spec"]["nodeName"] = "gpu-node-0"
                gate = conds.get(b.READINESS_GATE, {}).get("status") == "True"
                conds["Ready"] = {"type": "Ready", "status": "True" if gate else "False"}
            else:
                conds["PodScheduled"] = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                }
                conds["ContainersReady"] = {"type": "ContainersReady", "status": "False"}
                conds["Ready"] = {"type": "Ready", "status": "False"}
                p["spec"].pop("nodeName", None)
            p["status"]["conditions"] = list(conds.values())

    def fallback_revision(self) -> str | None:
        return (self.status.get("fallback") or {}).get("revision")


def test_the_fallback_spec_is_the_serving_spec_on_cpu_with_an_optional_lighter_model():
    spec = ModelDeploymentSpec.model_validate(gpu_md(FALLBACK)["spec"])
    fb = fallback_spec(spec)
    assert fb is not None
    assert (fb.resources.gpu, fb.resources.cpu, fb.resources.memory) == (0, "2", "4Gi")
    assert fb.node_selector == {} and fb.tolerations == []
    assert fb.model == spec.model and fb.batching == spec.batching
    assert b.spec_revision(fb) != b.spec_revision(spec)
    light = ModelDeploymentSpec.model_validate(
        gpu_md({**FALLBACK, "model": {"version": "1-int8", "uri": "file:///models/small"}})["spec"]
    )
    fbl = fallback_spec(light)
    assert fbl is not None and (fbl.model.version, fbl.model.uri, fbl.model.name) == (
        "1-int8",
        "file:///models/small",
        "minilm",
    )
    assert (
        fallback_spec(ModelDeploymentSpec.model_validate(gpu_md({**FALLBACK, "enabled": False})["spec"]))
        is None
    )
    # the fallback settings are not part of the GPU revision: changing them makes no new revision
    assert b.spec_revision(spec) == b.spec_revision(ModelDeploymentSpec.model_validate(gpu_md()["spec"]))


def test_gpus_gone_the_fallback_answers_after_after_and_traffic_returns_with_hysteresis():
    w = GPUWorld(gpu_md(FALLBACK))
    stable = w.deploy_first()
    assert w.pods_in_traffic(stable) == 2 and w.status["fallback"]["state"] == "Idle"
    assert w.cond("FallbackActive")["status"] == "False"
    assert len(w.fake.of_kind("Deployment")) == 1  # idleReplicas 0: nothing warm

    w.gpu_up = False
    w.run_for(59)
    assert w.status["fallback"]["state"] == "Idle" and w.status["fallback"]["noTrafficSince"]
    w.run_for(2)
    st = w.status
    fb = w.fallback_revision()
    assert st["fallback"]["state"] == "Active" and fb is not None
    assert w.pods_in_traffic(fb) == 1 and w.pods_in_traffic(stable) == 0
    assert st["phase"] == "Degraded" and w.cond("Degraded")["reason"] == "FallbackActive"
    c = w.cond("FallbackActive")
    assert c["status"] == "True" and "unschedulable" in c["message"] and "nvidia.com/gpu" in c["message"]
    dep = w.fake.obj("Deployment", f"minilm-{fb}")
    ctr = dep["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in (ctr["resources"].get("limits") or {})
    assert "nodeSelector" not in dep["spec"]["template"]["spec"]
    assert {r["revision"]: r["role"] for r in st["revisions"]}[fb] == "fallback"
    assert w.fake.obj("Deployment", f"minilm-{stable}")["spec"]["replicas"] == 2  # keeps trying
    assert "FallbackActivated" in w.event_reasons()

    w.gpu_up = True
    w.run_for(25)
    assert w.status["fallback"]["state"] == "Active" and w.pods_in_traffic(stable) == 0  # hysteresis
    w.gpu_up = False  # a flap within returnAfter restarts the count
    w.run_for(3)
    w.gpu_up = True
    w.run_for(25)
    assert w.status["fallback"]["state"] == "Active"
    w.run_for(10)
    st = w.status
    assert st["fallback"]["state"] == "Idle" and w.pods_in_traffic(stable) == 2
    assert w.fake.obj("Deployment", f"minilm-{fb}") is None
    assert st["phase"] == "Healthy" and w.cond("FallbackActive")["status"] == "False"
    reasons = w.event_reasons()
    assert reasons.count("FallbackActivated") == 1 and reasons.count("FallbackDeactivated") == 1


def test_returning_keeps_the_fallback_in_traffic_until_a_gpu_pod_is_ready():
    w = GPUWorld(gpu_md(FALLBACK))
    stable = w.deploy_first()
    w.gpu_up = False
    w.run_for(61)
    fb = w.fallback_revision()
    w.gpu_up = True
    w.run_for(30)
    # one reconcile without the controllers: the stable's gates are True but its pods not yet Ready
    w.clock.tick(1)
    w.rec.reconcile("default", "minilm")
    assert w.status["fallback"]["state"] == "Returning"
    assert w.pods_in_traffic(fb) == 1  # still answering: never a moment without an endpoint
    w.controllers()
    w.reconcile()
    assert w.status["fallback"]["state"] == "Idle" and w.pods_in_traffic(stable) == 2


class LoadingWorld(GPUWorld):
    """Pods are scheduled and running but never ready (a model that takes long to load)."""

    def controllers(self) -> None:
        super().controllers()
        for p in self.pods():
            conds = {c["type"]: c for c in p["status"]["conditions"]}
            conds["ContainersReady"] = {"type": "ContainersReady", "status": "False"}
            conds["Ready"] = {"type": "Ready", "status": "False"}
            p["status"]["conditions"] = list(conds.values())


def test_a_first_revision_still_loading_is_no_reason_to_fall_back():
    w = LoadingWorld(gpu_md(FALLBACK))
    w.reconcile()
    w.run_for(120)
    assert w.status["fallback"]["state"] == "Idle" and "noTrafficSince" not in w.status["fallback"]
    assert w.fallback_revision() is not None and w.pods_in_traffic(w.fallback_revision()) == 0


def test_unschedulable_pods_with_nothing_in_traffic_do_trigger_it_even_before_any_service():
    w = GPUWorld(gpu_md(FALLBACK))
    w.gpu_up = False
    w.reconcile()
    assert w.pods() and w.status["fallback"]["noTrafficSince"]  # pods exist, unschedulable
    w.run_for(61)
    assert w.status["fallback"]["state"] == "Active"


def test_a_canary_is_held_while_the_fallback_serves_and_resumes_after():
    w = GPUWorld(gpu_md(FALLBACK))
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(5)
    assert w.status["canaryRevision"] == new
    w.gpu_up = False
    w.run_for(61)
    assert w.status["fallback"]["state"] == "Active" and w.status["canaryRevision"] == new
    windows = w.prom.windows(new)
    w.run_for(60)
    assert w.prom.windows(new) == windows  # nothing judged on fallback data
    assert w.status["canaryRevision"] == new and [h["outcome"] for h in w.status["history"]] == ["Deployed"]
    w.gpu_up = True
    w.run_for(35)
    assert w.status["fallback"]["state"] == "Idle"
    w.run_for(40)
    assert w.status["stableRevision"] == new and w.prom.windows(new) > windows
    assert w.pods_in_traffic(old) == 0


def test_idle_replicas_keep_warm_fallback_pods_out_of_traffic():
    w = GPUWorld(gpu_md({**FALLBACK, "idleReplicas": 1}))
    stable = w.deploy_first()
    fb = w.fallback_revision()
    assert fb is not None and len(w.pods(fb)) == 1
    assert w.pods_in_traffic(fb) == 0 and w.pods_in_traffic(stable) == 2
    w.gpu_up = False
    w.run_for(61)
    assert w.pods_in_traffic(fb) == 1  # the warm pod goes into traffic: no cold start


def test_gateway_mode_routes_everything_to_the_fallback_while_it_serves():
    body = gpu_md(
        FALLBACK, trafficRouting={"mode": "gatewayAPI", "gatewayAPI": {"parentRefs": [{"name": "gw"}]}}
    )
    w = GPUWorld(copy.deepcopy(body))
    stable = w.deploy_first()
    w.gpu_up = False
    w.run_for(61)
    fb = w.fallback_revision()
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{fb}", 100)]
    # the way back: the fallback keeps the route until a GPU pod's endpoint is ready in the slices
    w.reconcile()  # (its own endpoint is ready by now: before, nothing was routable to begin with)
    violations = watch_the_route(w)
    w.gpu_up = True
    w.run_for(40)
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{stable}", 100)]
    assert violations == []


def test_editing_the_fallback_while_it_serves_keeps_it_active_on_its_new_revision():
    w = GPUWorld(gpu_md(FALLBACK))
    w.deploy_first()
    w.gpu_up = False
    w.run_for(61)
    first = w.fallback_revision()
    w.raw["spec"]["fallback"] = {**FALLBACK, "cpu": "3"}
    w.raw["metadata"]["generation"] += 1
    w.run_for(2)
    second = w.fallback_revision()
    assert second != first and w.status["fallback"]["state"] == "Active"
    assert w.pods_in_traffic(second) == 1 and w.fake.obj("Deployment", f"minilm-{first}") is None


def test_removing_the_fallback_while_it_serves_says_so():
    w = GPUWorld(gpu_md(FALLBACK))
    stable = w.deploy_first()
    w.gpu_up = False
    w.run_for(61)
    fb = w.fallback_revision()
    del w.raw["spec"]["fallback"]
    w.raw["metadata"]["generation"] += 1
    w.run_for(2)
    assert "fallback" not in w.status and "FallbackRemoved" in w.event_reasons()
    # make before break: its pods are the only ones in traffic, so they keep serving until a GPU pod is
    w.run_for(20)
    assert w.pods_in_traffic(fb) == 1 and w.pods_in_traffic(stable) == 0
    w.gpu_up = True
    w.run_for(3)
    assert w.pods_in_traffic(stable) == 2 and w.fake.obj("Deployment", f"minilm-{fb}") is None
