"""Pure builders: the desired Deployment, Services and PDB of a ModelDeployment, and the revision."""

from __future__ import annotations

import json

import pytest
from modeldeploy import builders as b
from modeldeploy.api import ModelDeployment


def make_md(**spec_over) -> ModelDeployment:
    spec = {"model": {"name": "minilm", "version": "1", "uri": "file:///models/minilm"}}
    spec.update(spec_over)
    return ModelDeployment.from_api(
        {
            "metadata": {"name": "minilm", "namespace": "ml", "uid": "u-1", "generation": 3},
            "spec": spec,
        }
    )


def deployment(md: ModelDeployment, replicas: int = 2):
    return b.build_deployment(md, md.spec, b.spec_revision(md.spec), replicas)


def container(dep):
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return c


def env(dep) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(dep)["env"]}


# ---------------------------------------------------------------------------------------------- revision


def test_revision_is_stable_and_short():
    md = make_md()
    r = b.spec_revision(md.spec)
    assert r == b.spec_revision(make_md().spec)
    assert len(r) == 10 and all(c in "0123456789abcdef" for c in r)


@pytest.mark.parametrize(
    "change",
    [
        {"model": {"name": "minilm", "version": "2", "uri": "file:///models/minilm"}},
        {"model": {"name": "minilm", "version": "1", "uri": "file:///models/other"}},
        {"image": "modeldeploy/modelserver:v2"},
        {"batching": {"maxBatchSize": 64}},
        {"resources": {"gpu": 1}},
        {"resources": {"memory": "4Gi"}},
        {"nodeSelector": {"pool": "a100"}},
        {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
    ],
)
def test_anything_shaping_the_pods_is_a_new_revision(change):
    assert b.spec_revision(make_md(**change).spec) != b.spec_revision(make_md().spec)


@pytest.mark.parametrize(
    "change",
    [
        {"replicas": 7},
        {"rollout": {"steps": [10, 100], "interval": "5m", "paused": True}},
        {"rollout": {"analysis": {"maxErrorRate": 0.5}}},
        # spelling out a default is the same revision as omitting it
        {"batching": {"maxBatchSize": 16}},
        {"image": "modeldeploy/modelserver:dev"},
    ],
)
def test_replicas_rollout_policy_and_defaults_are_not_a_new_revision(change):
    assert b.spec_revision(make_md(**change).spec) == b.spec_revision(make_md().spec)


def test_node_selector_order_does_not_matter():
    a = make_md(nodeSelector={"a": "1", "b": "2"})
    z = make_md(nodeSelector={"b": "2", "a": "1"})
    assert b.spec_revision(a.spec) == b.spec_revision(z.spec)


def test_revision_spec_annotation_round_trips():
    md = make_md(resources={"gpu": 2}, batching={"buckets": [16, 32]})
    dep = deployment(md)
    back = b.revision_spec_from_annotation(dep["metadata"]["annotations"][b.ANNOTATION_REVISION_SPEC])
    assert b.spec_revision(back) == b.spec_revision(md.spec)


# ---------------------------------------------------------------------------------------------- deployment


def test_deployment_identity_labels_and_owner():
    md = make_md()
    rev = b.spec_revision(md.spec)
    dep = deployment(md, replicas=3)
    assert dep["apiVersion"] == "apps/v1" and dep["kind"] == "Deployment"
    assert dep["metadata"]["name"] == f"minilm-{rev}"
    assert dep["metadata"]["namespace"] == "ml"
    assert dep["spec"]["replicas"] == 3
    sel = dep["spec"]["selector"]["matchLabels"]
    assert sel == {"modeldeploy.io/name": "minilm", "modeldeploy.io/revision": rev}
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in sel.items())
    assert dep["metadata"]["labels"]["modeldeploy.io/revision"] == rev
    (owner,) = dep["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "name": "minilm",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_gpu_limits_only_when_gpus_are_asked_for():
    cpu = container(deployment(make_md()))["resources"]
    assert "nvidia.com/gpu" not in cpu["limits"] and "nvidia.com/gpu" not in cpu["requests"]
    gpu = container(deployment(make_md(resources={"gpu": 2, "cpu": "4", "memory": "8Gi"})))["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "2"
    assert gpu["requests"] == {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2"}
    assert gpu["limits"]["memory"] == "8Gi"


def test_device_follows_the_gpu_count():
    assert env(deployment(make_md()))["MODELSERVER_DEVICE"] == "cpu"
    assert env(deployment(make_md(resources={"gpu": 1})))["MODELSERVER_DEVICE"] == "auto"


@pytest.mark.parametrize(
    ("cpu", "threads"), [("100m", 1), ("1", 1), ("1500m", 1), ("2", 2), (4, 4), ("7.9", 7), ("16", 16)]
)
def test_torch_threads_are_the_whole_cores_the_pod_requests(cpu, threads):
    """Not torch's default of one per node core: pods on one node would oversubscribe it."""
    assert env(deployment(make_md(resources={"cpu": cpu})))["MODELSERVER_NUM_THREADS"] == str(threads)


def test_node_selector_and_tolerations():
    md = make_md(
        nodeSelector={"nvidia.com/gpu.present": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    pod = deployment(md)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    plain = deployment(make_md())["spec"]["template"]["spec"]
    assert "nodeSelector" not in plain and "tolerations" not in plain


def test_probes_use_the_server_health_routes():
    c = container(deployment(make_md()))
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] == "http"
    # the startup probe gives a slow model load minutes, not seconds
    s = c["startupProbe"]
    assert s["periodSeconds"] * s["failureThreshold"] >= 300


def test_drain_prestop_and_grace_period_cover_the_longest_request():
    md = make_md(batching={"defaultTimeoutMs": 1000, "maxTimeoutMs": 45000})
    dep = deployment(md)
    c = container(dep)
    sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert sleep > 0
    assert grace >= sleep + 45


def test_restricted_pod_security():
    dep = deployment(make_md())
    pod = dep["spec"]["template"]["spec"]
    sc = container(dep)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsUser"] > 0
    assert sc["readOnlyRootFilesystem"] is True


def test_what_the_server_writes_is_an_emptydir_under_a_read_only_root():
    """torch, the HF libraries and tempfile write under /tmp; a downloaded or unpacked model goes to the
    image's MODELSERVER_DOWNLOAD_DIR: both are emptyDirs, so a read-only root keeps them working."""
    dep = deployment(make_md())
    pod = dep["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(dep)["volumeMounts"]}
    for path in ("/tmp", b.DOWNLOAD_DIR):
        assert vols[mounts[path]] == {"name": mounts[path], "emptyDir": {}}
    assert b.DOWNLOAD_DIR == "/var/lib/modelserver"


def test_model_and_batching_settings_reach_the_server():
    md = make_md(
        model={"name": "minilm", "version": "7", "uri": "file:///m", "format": "hf", "sha256": "a" * 64},
        batching={
            "maxBatchSize": 8,
            "maxQueueDelayMs": 3,
            "maxQueueSize": 99,
            "maxSequenceLength": 128,
            "buckets": [16, 128],
            "defaultTimeoutMs": 500,
            "maxTimeoutMs": 900,
        },
    )
    e = env(deployment(md))
    assert e["MODELSERVER_MODEL_URI"] == "file:///m"
    assert e["MODELSERVER_MODEL_NAME"] == "minilm"
    assert e["MODELSERVER_MODEL_VERSION"] == "7"
    assert e["MODELSERVER_MODEL_FORMAT"] == "hf"
    assert e["MODELSERVER_MODEL_SHA256"] == "a" * 64
    assert e["MODELSERVER_PORT"] == "8080"
    assert e["MODELSERVER_MAX_BATCH_SIZE"] == "8"
    assert e["MODELSERVER_MAX_QUEUE_DELAY_MS"] == "3"
    assert e["MODELSERVER_MAX_QUEUE_SIZE"] == "99"
    assert e["MODELSERVER_MAX_SEQUENCE_LENGTH"] == "128"
    assert e["MODELSERVER_BUCKETS"] == "16,128"
    assert e["MODELSERVER_DEFAULT_TIMEOUT_MS"] == "500"
    assert e["MODELSERVER_MAX_TIMEOUT_MS"] == "900"
    assert container(deployment(md))["command"] == ["python", "-m", "modelserver"]
    assert "MODELSERVER_HANDLER" not in e
    assert e["HF_HUB_OFFLINE"] == "1"  # nothing is downloaded from a hub at run time


def test_empty_buckets_let_the_server_choose():
    assert env(deployment(make_md(batching={"buckets": []})))["MODELSERVER_BUCKETS"] == "auto"


def test_generation_sizes_reach_a_generation_server_and_an_encoder_gets_none():
    gen = {"name": "llm", "version": "1", "uri": "file:///m", "format": "hf", "task": "generation"}
    sizes = {"kvCacheTokens": 4096, "maxRunningSequences": 8, "engine": "manager", "maxContextTokens": 1024}
    sized = env(deployment(make_md(model=gen, generation=sizes)))
    assert sized["MODELSERVER_KV_CACHE_TOKENS"] == "4096"
    assert sized["MODELSERVER_ENGINE"] == "manager"
    assert sized["MODELSERVER_MAX_CONTEXT_TOKENS"] == "1024"
    assert sized["MODELSERVER_MAX_RUNNING_SEQUENCES"] == "8"
    assert sized["MODELSERVER_MAX_WAITING_SEQUENCES"] == "64"  # the server's default, said explicitly
    assert env(deployment(make_md(model=gen)))["MODELSERVER_KV_CACHE_TOKENS"] == "16384"
    assert not any(k.startswith("MODELSERVER_KV_") for k in env(deployment(make_md())))


def test_generation_defaults_are_the_servers():
    from modeldeploy.api_generation import GenerationSpec
    from modelserver.config import Settings

    server = Settings.model_fields
    for key, value in GenerationSpec().server_env().items():
        assert str(server[key.removeprefix("MODELSERVER_").lower()].default) == value, key


def test_custom_handler_is_passed():
    md = make_md(model={"name": "m", "uri": "file:///m", "format": "custom", "handler": "h.py:H"})
    assert env(deployment(md))["MODELSERVER_HANDLER"] == "h.py:H"


def test_prometheus_annotations_and_readiness_gate():
    tmpl = deployment(make_md())["spec"]["template"]
    ann = tmpl["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/port"] == "8080"
    assert ann["prometheus.io/path"] == "/metrics"
    assert tmpl["spec"]["readinessGates"] == [{"conditionType": "modeldeploy.io/in-traffic"}]


def test_servers_may_copy_only_to_their_own_modeldeployments_revision_services(monkeypatch):
    # the server fills in the revision from the shadow annotation; host, namespace and port are fixed here
    assert env(deployment(make_md()))["MODELSERVER_SHADOW_SERVICE"] == (
        "http://minilm-{revision}.ml.svc.cluster.local:8080"
    )
    monkeypatch.setenv("MODELDEPLOY_CLUSTER_DOMAIN", "corp.internal")
    assert env(deployment(make_md()))["MODELSERVER_SHADOW_SERVICE"] == (
        "http://minilm-{revision}.ml.svc.corp.internal:8080"
    )
    assert b.shadow_service(make_md(), "abc") == "http://minilm-abc.ml.svc.corp.internal:8080"


def test_env_values_are_all_strings():
    for e in container(deployment(make_md(resources={"gpu": 3})))["env"]:
        assert isinstance(e["value"], str), e


def test_deployment_is_json_serialisable_and_deterministic():
    md = make_md()
    assert json.dumps(deployment(md), sort_keys=True) == json.dumps(deployment(md), sort_keys=True)


# ---------------------------------------------------------------------------------------------- others


def test_model_service_selects_every_revision():
    svc = b.build_model_service(make_md())
    assert svc["metadata"]["name"] == "minilm"
    assert svc["spec"]["selector"] == {"modeldeploy.io/name": "minilm"}
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_revision_service_selects_one_revision():
    svc = b.build_revision_service(make_md(), "abc123")
    assert svc["metadata"]["name"] == "minilm-abc123"
    assert svc["spec"]["selector"] == {"modeldeploy.io/name": "minilm", "modeldeploy.io/revision": "abc123"}
    assert svc["metadata"]["labels"]["modeldeploy.io/revision"] == "abc123"


def test_pdb():
    pdb = b.build_pdb(make_md())
    assert pdb["apiVersion"] == "policy/v1" and pdb["kind"] == "PodDisruptionBudget"
    assert pdb["spec"]["selector"] == {"matchLabels": {"modeldeploy.io/name": "minilm"}}
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["metadata"]["ownerReferences"][0]["kind"] == "ModelDeployment"


def test_every_child_carries_the_name_label_and_an_applied_hash():
    md = make_md()
    for obj in (
        deployment(md),
        b.build_model_service(md),
        b.build_revision_service(md, "r"),
        b.build_pdb(md),
    ):
        assert obj["metadata"]["labels"]["modeldeploy.io/name"] == "minilm"
        assert len(obj["metadata"]["annotations"][b.ANNOTATION_APPLIED]) == 16


def test_applied_hash_changes_with_the_object():
    md = make_md()
    h1 = deployment(md, 1)["metadata"]["annotations"][b.ANNOTATION_APPLIED]
    h2 = deployment(md, 2)["metadata"]["annotations"][b.ANNOTATION_APPLIED]
    assert h1 != h2
