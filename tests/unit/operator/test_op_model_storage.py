"""Models from storage: what the pod template gets for s3:// and pvc:// uris, and how a failed fetch
becomes the ModelAvailable condition (and an event) without the operator ever reading a Secret."""

from __future__ import annotations

import json

import pytest
from md_fakekube import FakeKube
from modeldeploy import builders as b
from modeldeploy import model_storage as ms
from modeldeploy.api import ModelDeployment
from modeldeploy.reconciler import Reconciler
from test_op_reconciler import Clock, cond, md_raw, revision, settle, spawn_pods

S3_MODEL = {
    "name": "minilm",
    "uri": "s3://models/minilm/v2/",
    "storage": {
        "secretRef": {"name": "s3-credentials"},
        "endpoint": "http://10.244.0.254:7070",
        "region": "us-east-1",
        "addressingStyle": "path",
    },
}


def make_md(model: dict) -> ModelDeployment:
    return ModelDeployment.from_api(
        {
            "metadata": {"name": "minilm", "namespace": "ml", "uid": "u-1", "generation": 1},
            "spec": {"model": model},
        }
    )


def pod_spec(md: ModelDeployment) -> dict:
    dep = b.build_deployment(md, md.spec, b.spec_revision(md.spec), 1)
    return dep["spec"]["template"]["spec"]


def server_env(spec: dict) -> dict[str, str]:
    (c,) = spec["containers"]
    return {e["name"]: e.get("value") for e in c["env"]}


def flags(args: list[str]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2], strict=True))


# ---------------------------------------------------------------------------------------------- s3://


def test_s3_model_is_fetched_by_an_init_container_into_the_model_volume():
    spec = pod_spec(make_md(S3_MODEL))
    (init,) = spec["initContainers"]
    assert init["name"] == ms.FETCH_CONTAINER
    assert init["command"] == ["python", "-m", "modelserver.fetch"]
    args = flags(init["args"])
    assert args["--uri"] == "s3://models/minilm/v2/"
    assert args["--dest"] == "/mnt/models"
    assert args["--timeout"] == "600"  # the default 10m
    assert "--cache-dir" not in args and "--sha256" not in args
    assert init["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # the server loads the fetched directory, read-only
    assert server_env(spec)["MODELSERVER_MODEL_URI"] == "file:///mnt/models"
    (server,) = spec["containers"]
    assert {"name": "model", "mountPath": "/mnt/models", "readOnly": True} in server["volumeMounts"]
    # the emptyDir is bounded: storage.maxSize where set, else the chart's limit
    assert {"name": "model", "emptyDir": {"sizeLimit": ms.DEFAULT_MODEL_VOLUME_LIMIT}} in spec["volumes"]


def test_credentials_come_from_the_secret_by_reference_only():
    (init,) = pod_spec(make_md(S3_MODEL))["initContainers"]
    env = {e["name"]: e for e in init["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": "s3-credentials", "key": key}},
        }
    assert env["S3_ENDPOINT"]["value"] == "http://10.244.0.254:7070"
    assert env["S3_USE_HTTPS"]["value"] == "0"
    assert env["S3_ADDRESSING_STYLE"]["value"] == "path"
    assert env["AWS_DEFAULT_REGION"]["value"] == "us-east-1"
    assert env["S3_VERIFY_SSL"]["value"] == "1"


def test_no_secret_means_anonymous_and_a_ca_bundle_is_mounted_from_its_configmap():
    model = {
        **S3_MODEL,
        "storage": {"endpoint": "https://s3.internal", "caBundle": {"configMapRef": {"name": "ca"}}},
    }
    spec = pod_spec(make_md(model))
    (init,) = spec["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert "AWS_ACCESS_KEY_ID" not in env
    assert env["S3_USE_HTTPS"] == "1"
    assert env["AWS_CA_BUNDLE"] == "/etc/modeldeploy/s3-ca/ca.crt"
    vol = next(v for v in spec["volumes"] if v["name"] == "s3-ca")
    assert vol["configMap"] == {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}


def test_sha256_and_size_limit_go_to_the_fetch_not_the_server():
    model = {**S3_MODEL, "sha256": "a" * 64, "storage": {**S3_MODEL["storage"], "maxSize": "2Gi"}}
    spec = pod_spec(make_md(model))
    args = flags(spec["initContainers"][0]["args"])
    assert args["--sha256"] == "a" * 64
    assert args["--max-bytes"] == str(2 * 1024**3)
    # the server would hash the directory it loads, which is not what the sha256 names
    assert "MODELSERVER_MODEL_SHA256" not in server_env(spec)


def test_node_cache_is_one_hostpath_directory_per_namespace_written_only_by_the_operators_fetch_image(
    monkeypatch,
):
    """Issue 24, finding 1: the author's image never runs with the cache mounted, and a namespace's fetch
    writes its own namespace's directory only (the whole cache is read-only beside it, for the node cap)."""
    monkeypatch.setenv("MODELDEPLOY_FETCH_IMAGE", "registry.example/modeldeploy/fetch@sha256:" + "1" * 64)
    model = {**S3_MODEL, "storage": {**S3_MODEL["storage"], "nodeCache": {"maxSize": "50Gi"}}}
    md = make_md(model)
    md.spec = md.spec.model_copy(update={"image": "evil.example/takeover:latest"})
    spec = pod_spec(md)
    (init,) = spec["initContainers"]
    assert init["image"] == "registry.example/modeldeploy/fetch@sha256:" + "1" * 64
    assert spec["containers"][0]["image"] == "evil.example/takeover:latest"  # the server: the author's
    args = flags(init["args"])
    assert args["--cache-dir"] == "/var/cache/modeldeploy/models"
    assert args["--cache-max-bytes"] == str(50 * 1024**3)  # under the chart's per-namespace cap
    assert args["--cache-node-dir"] == "/var/cache/modeldeploy/node"
    assert args["--cache-namespace"] == "ml"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["model-cache"]["hostPath"] == {
        "path": "/var/lib/modeldeploy/model-cache/ml",
        "type": "DirectoryOrCreate",
    }
    assert vols["model-cache-node"]["hostPath"]["path"] == "/var/lib/modeldeploy/model-cache"
    mounts = {m["name"]: m for m in init["volumeMounts"]}
    assert mounts["model-cache-node"].get("readOnly") is True and not mounts["model-cache"].get("readOnly")
    # only the fetch container sees the cache; the server sees its own copy
    (server,) = spec["containers"]
    assert all(not m["name"].startswith("model-cache") for m in server["volumeMounts"])


def test_the_caches_caps_are_the_charts_and_the_spec_can_only_lower_them(monkeypatch):
    monkeypatch.setenv("MODELDEPLOY_NODE_CACHE_NAMESPACE_MAX", "10Gi")
    monkeypatch.setenv("MODELDEPLOY_NODE_CACHE_MAX", "40Gi")
    big = {**S3_MODEL, "storage": {**S3_MODEL["storage"], "nodeCache": {"maxSize": "500Gi"}}}
    args = flags(pod_spec(make_md(big))["initContainers"][0]["args"])
    assert args["--cache-max-bytes"] == str(10 * 1024**3)
    assert args["--cache-node-max-bytes"] == str(40 * 1024**3)
    small = {**S3_MODEL, "storage": {**S3_MODEL["storage"], "nodeCache": {"maxSize": "1Gi"}}}
    assert flags(pod_spec(make_md(small))["initContainers"][0]["args"])["--cache-max-bytes"] == str(1024**3)


def test_the_fetch_image_defaults_to_the_operators_serving_image_not_the_authors(monkeypatch):
    monkeypatch.delenv("MODELDEPLOY_FETCH_IMAGE", raising=False)
    monkeypatch.setenv("MODELDEPLOY_DEFAULT_IMAGE", "modeldeploy/modelserver:1.2.3")
    md = make_md(S3_MODEL)
    md.spec = md.spec.model_copy(update={"image": "evil.example/takeover:latest"})
    assert pod_spec(md)["initContainers"][0]["image"] == "modeldeploy/modelserver:1.2.3"


def test_the_model_volume_is_bounded_by_max_size():
    model = {**S3_MODEL, "storage": {**S3_MODEL["storage"], "maxSize": "3Gi"}}
    vol = next(v for v in pod_spec(make_md(model))["volumes"] if v["name"] == "model")
    assert vol["emptyDir"] == {"sizeLimit": "3Gi"}


def test_the_node_cache_directory_is_the_operators_setting(monkeypatch):
    monkeypatch.setenv("MODELDEPLOY_NODE_CACHE_PATH", "/data/model-cache")
    model = {**S3_MODEL, "storage": {**S3_MODEL["storage"], "nodeCache": {}}}
    vol = next(v for v in pod_spec(make_md(model))["volumes"] if v["name"] == "model-cache")
    assert vol["hostPath"]["path"] == "/data/model-cache/ml"


def test_storage_settings_are_part_of_the_revision():
    a = make_md(S3_MODEL)
    b2 = make_md({**S3_MODEL, "storage": {**S3_MODEL["storage"], "endpoint": "http://other:9000"}})
    assert b.spec_revision(a.spec) != b.spec_revision(b2.spec)


def test_a_model_without_storage_keeps_its_revision():
    """Adding the optional storage field to the API must not roll every existing Deployment."""
    md = make_md({"name": "minilm", "uri": "file:///models/minilm"})
    assert "storage" not in b.revision_spec(md.spec)["model"]
    assert "initContainers" not in pod_spec(md)


# ---------------------------------------------------------------------------------------------- pvc://


def test_pvc_model_is_mounted_read_only_without_a_copy():
    spec = pod_spec(make_md({"name": "minilm", "uri": "pvc://models/minilm/v1"}))
    assert "initContainers" not in spec
    vol = next(v for v in spec["volumes"] if v["name"] == "model")
    assert vol["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert server_env(spec)["MODELSERVER_MODEL_URI"] == "file:///mnt/pvc/minilm/v1"


def test_pvc_uri_without_a_path_is_the_volume_root():
    spec = pod_spec(make_md({"name": "minilm", "uri": "pvc://models"}))
    assert server_env(spec)["MODELSERVER_MODEL_URI"] == "file:///mnt/pvc"


# ---------------------------------------------------------------------------------------------- pod status


@pytest.mark.parametrize(
    ("message", "reason", "text"),
    [
        (
            "AccessDenied: s3://models/minilm/v2/: access denied",
            "AccessDenied",
            "s3://models/minilm/v2/: access denied",
        ),
        ("NotFound: no object under s3://models/x/\n", "NotFound", "no object under s3://models/x/"),
        ("ChecksumMismatch: sha256 abc != def", "ChecksumMismatch", "sha256 abc != def"),
        ("Traceback (most recent call last):\n  ...\nKeyError: 'x'", "FetchFailed", "KeyError: 'x'"),
        ("", "FetchFailed", "the fetch init container failed"),
    ],
)
def test_termination_message_to_reason(message, reason, text):
    assert ms.parse_termination_message(message) == ms.FetchFailure(reason, text)


def fetch_status(state: dict, last: dict | None = None) -> dict:
    st = {"name": ms.FETCH_CONTAINER, "state": state}
    if last is not None:
        st["lastState"] = last
    return {"status": {"initContainerStatuses": [st]}}


def test_fetch_failure_reads_the_current_or_the_last_attempt():
    failed = {"terminated": {"exitCode": 3, "message": "NotFound: gone"}}
    assert ms.fetch_failure(fetch_status(failed)) == ms.FetchFailure("NotFound", "gone")
    # crash-looping: waiting now, the failure is in lastState
    waiting = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert ms.fetch_failure(fetch_status(waiting, failed)) == ms.FetchFailure("NotFound", "gone")
    # succeeded after a failure: no failure
    assert ms.fetch_failure(fetch_status({"terminated": {"exitCode": 0}}, failed)) is None
    assert ms.fetch_failure({"status": {}}) is None


# ---------------------------------------------------------------------------------------------- condition


@pytest.fixture
def s3_world(md_body):
    md_body["spec"]["model"] = dict(S3_MODEL)
    fake = FakeKube()
    fake.put(md_body)
    clock = Clock()
    return fake, Reconciler(fake, clock=clock), clock  # type: ignore[arg-type]


def fail_fetch(fake: FakeKube, message: str) -> None:
    for p in fake.of_kind("Pod"):
        p["status"]["initContainerStatuses"] = [
            {
                "name": ms.FETCH_CONTAINER,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
            }
        ]


def test_a_failed_fetch_is_a_condition_and_a_warning_event(s3_world):
    fake, rec, clock = s3_world
    rec.reconcile("default", "minilm")
    spawn_pods(fake, revision(fake), 1, ready=False)
    fail_fetch(fake, "AccessDenied: s3://models/minilm/v2/: the credentials were refused")
    clock.tick()
    rec.reconcile("default", "minilm")
    c = cond(fake, "ModelAvailable")
    assert c["status"] == "False" and c["reason"] == "AccessDenied"
    assert "1 pod(s) could not fetch s3://models/minilm/v2/" in c["message"]
    assert cond(fake, "Degraded")["reason"] == "ModelUnavailable"
    assert md_raw(fake)["status"]["phase"] == "Degraded"
    warnings = [e for e in fake.events if e.get("type") == "Warning"]
    assert any(e["reason"] == "AccessDenied" for e in warnings), warnings


def test_loaded_model_is_available(s3_world):
    fake, rec, _ = s3_world
    rec.reconcile("default", "minilm")
    c = cond(fake, "ModelAvailable")
    assert c["status"] == "Unknown" and c["reason"] == "ModelLoading"
    spawn_pods(fake, revision(fake), 1)
    settle(fake, rec)
    c = cond(fake, "ModelAvailable")
    assert c["status"] == "True" and c["reason"] == "ModelLoaded"
    assert cond(fake, "Degraded")["status"] == "False"


def test_the_operator_never_reads_a_secret(s3_world):
    fake, rec, _ = s3_world
    secret_value = "wJalrXUtnFEMI-not-for-the-operator"
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-credentials", "namespace": "default"},
            "stringData": {"AWS_ACCESS_KEY_ID": "AKIA-test", "AWS_SECRET_ACCESS_KEY": secret_value},
        }
    )
    asked: list[str] = []
    get, list_ = fake.get, fake.list
    fake.get = lambda rt, *a, **kw: (asked.append(rt.kind), get(rt, *a, **kw))[1]  # type: ignore[method-assign]
    fake.list = lambda rt, *a, **kw: (asked.append(rt.kind), list_(rt, *a, **kw))[1]  # type: ignore[method-assign]
    rec.reconcile("default", "minilm")
    spawn_pods(fake, revision(fake), 1)
    fail_fetch(fake, "AccessDenied: the credentials were refused")
    settle(fake, rec)
    assert asked and "Secret" not in asked
    written = json.dumps([fake.of_kind("Deployment"), md_raw(fake)["status"], fake.events])
    assert secret_value not in written and "AKIA-test" not in written
    assert '"secretKeyRef": {"name": "s3-credentials"' in written  # referenced, for the kubelet to resolve


def test_a_model_in_the_image_has_no_model_condition(md_body):
    fake = FakeKube()
    fake.put(md_body)
    rec = Reconciler(fake, clock=Clock())  # type: ignore[arg-type]
    rec.reconcile("default", "minilm")
    assert all(c["type"] != "ModelAvailable" for c in md_raw(fake)["status"]["conditions"])
