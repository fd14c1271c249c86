"""The local cluster's object store (versitygw): put/get through boto3 from the host and from a pod, its
access log, and refusals."""

from __future__ import annotations

import base64
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from localcluster.objectstore import ObjectStore
from localcluster.testing import Kube, wait_for

TESTAPP = "modeldeploy/testapp:dev"

# The init container's program: copy s3://$BUCKET/$PREFIX/ into $DEST with boto3; a failure writes a
# one-line reason to the termination-message file and exits 1.
FETCH = textwrap.dedent(
    """
    import os, sys, boto3
    from botocore.config import Config
    s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    bucket, prefix, dest = os.environ["BUCKET"], os.environ["PREFIX"], os.environ["DEST"]
    try:
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
        for key in keys:
            path = os.path.join(dest, os.path.relpath(key, prefix))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            s3.download_file(bucket, key, path)
        print(f"fetched {len(keys)} objects", flush=True)
    except Exception as exc:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", type(exc).__name__)
        open("/dev/termination-log", "w").write(f"{code}: s3://{bucket}/{prefix}")
        sys.exit(1)
    """
)


def _secret(s3: ObjectStore, secret_key: str | None = None) -> dict[str, Any]:
    def b64(v: str) -> str:
        return base64.b64encode(v.encode()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-creds"},
        "data": {
            "AWS_ACCESS_KEY_ID": b64(s3.access_key),
            "AWS_SECRET_ACCESS_KEY": b64(secret_key or s3.secret_key),
        },
    }


def _fetch_pod(s3: ObjectStore, bucket: str, prefix: str, restart: str = "Always") -> dict[str, Any]:
    def from_secret(name: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": name}}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fetcher"},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 2,
            "volumes": [{"name": "model", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "fetch",
                    "image": TESTAPP,
                    "command": ["python", "-c", FETCH],
                    "env": [
                        {"name": "S3_ENDPOINT", "value": s3.url},
                        {"name": "BUCKET", "value": bucket},
                        {"name": "PREFIX", "value": prefix},
                        {"name": "DEST", "value": "/mnt/models"},
                        from_secret("AWS_ACCESS_KEY_ID"),
                        from_secret("AWS_SECRET_ACCESS_KEY"),
                    ],
                    "volumeMounts": [{"name": "model", "mountPath": "/mnt/models"}],
                }
            ],
            "containers": [
                {
                    "name": "app",
                    "image": TESTAPP,
                    "args": ["--port", "8080"],
                    "volumeMounts": [{"name": "model", "mountPath": "/mnt/models", "readOnly": True}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }


def _model_dir(root: Path) -> Path:
    (root / "tokenizer").mkdir(parents=True)
    (root / "config.json").write_text('{"dim": 384}')
    (root / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    (root / "model.safetensors").write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    return root


def test_the_cluster_records_where_the_store_is(kube: Kube, s3: ObjectStore) -> None:
    if os.environ.get("E2E_KUBECONFIG"):
        pytest.skip("reads the local cluster's state directory")
    state = kube.cluster.state_dir
    assert (state / "s3-url").read_text().strip() == kube.cluster.s3_url == s3.url
    assert s3.url.startswith("http://10.244.") and s3.url.endswith(":9000")
    assert (state / "s3-credentials.json").stat().st_mode & 0o077 == 0
    # the secret is in no command line, log or record
    assert s3.secret_key not in (state / "cluster.json").read_text()
    for log in (state / "logs").iterdir():
        assert s3.secret_key not in log.read_text(errors="replace"), log


def test_put_and_get_from_the_host_with_boto3_and_the_access_log_counts_them(
    s3: ObjectStore, s3_bucket: str, tmp_path: Path
) -> None:
    src = _model_dir(tmp_path / "minilm")
    since = s3.log_offset()
    keys = s3.upload_dir(src, s3_bucket, "minilm/v1")
    assert keys == ["minilm/v1/config.json", "minilm/v1/model.safetensors", "minilm/v1/tokenizer/vocab.txt"]
    assert s3.keys(s3_bucket, "minilm/") == keys
    client = s3.client()
    for key in keys:
        body = client.get_object(Bucket=s3_bucket, Key=key)["Body"].read()
        assert body == (src / key.removeprefix("minilm/v1/")).read_bytes()
    assert s3.count("PutObject", bucket=s3_bucket, since=since) == 3
    assert s3.count("GetObject", bucket=s3_bucket, key_prefix="minilm/v1/", since=since) == 3
    assert s3.count("GetObject", bucket=s3_bucket, key_prefix="minilm/v2/", since=since) == 0
    # requests from the host come from the host end of the pod network, 10.244.N.1
    host_end = s3.url.removeprefix("http://").split(":")[0].rsplit(".", 1)[0] + ".1"
    assert {e.remote_ip for e in s3.requests(since)} == {host_end}
    # a ranged download (download_file of a big object in parts) is one GetObject line per part
    since = s3.log_offset()
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=1024 * 1024, multipart_chunksize=1024 * 1024)
    client.download_file(s3_bucket, "minilm/v1/model.safetensors", str(tmp_path / "out"), Config=cfg)
    assert (tmp_path / "out").read_bytes() == (src / "model.safetensors").read_bytes()
    assert s3.count("GetObject", bucket=s3_bucket, since=since) == 4  # 3 MiB + 17 B in 1 MiB parts


def test_wrong_credentials_and_missing_keys_are_refused_and_logged(s3: ObjectStore, s3_bucket: str) -> None:
    since = s3.log_offset()
    bad = s3.client(secret_key="not-the-secret")
    with pytest.raises(ClientError) as err:
        bad.get_object(Bucket=s3_bucket, Key="x")
    assert err.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as err:
        s3.client(access_key="NOSUCHUSER").get_object(Bucket=s3_bucket, Key="x")
    # versitygw's answer to an unknown access key (AWS: 403 InvalidAccessKeyId) is a 404: a fetch must
    # not take the status alone for a missing object
    assert err.value.response["Error"]["Code"] == "XAdminUserNotFound"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as err:
        s3.client().get_object(Bucket=s3_bucket, Key="missing")
    assert err.value.response["Error"]["Code"] == "NoSuchKey"
    errors = [(e.status, e.error) for e in s3.requests(since)]
    assert (403, "SignatureDoesNotMatch") in errors and (404, "NoSuchKey") in errors


def test_a_pod_fetches_from_the_store_in_an_init_container_and_serves_it_from_an_empty_dir(
    kube: Kube, namespace: str, s3: ObjectStore, s3_bucket: str, tmp_path: Path
) -> None:
    src = _model_dir(tmp_path / "minilm")
    s3.upload_dir(src, s3_bucket, "minilm/v1")
    kube.apply(_secret(s3), namespace)
    since = s3.log_offset()
    kube.apply(_fetch_pod(s3, s3_bucket, "minilm/v1"), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/fetcher"

    def ready() -> dict[str, Any] | None:
        p = kube.get(path)
        conds = {c["type"]: c["status"] for c in (p or {}).get("status", {}).get("conditions") or []}
        return p if conds.get("Ready") == "True" else None

    pod = wait_for(ready, timeout=60, what="the pod Ready after its init container")
    assert pod is not None
    init = pod["status"]["initContainerStatuses"][0]
    assert (
        init["state"]["terminated"]["exitCode"] == 0 and init["state"]["terminated"]["reason"] == "Completed"
    )
    assert init["ready"] is True and init["restartCount"] == 0
    ip = pod["status"]["podIP"]
    import httpx

    for rel in ("config.json", "tokenizer/vocab.txt", "model.safetensors"):
        r = httpx.get(f"http://{ip}:8080/file", params={"path": f"/mnt/models/{rel}"}, timeout=5)
        assert r.status_code == 200 and r.content == (src / rel).read_bytes(), rel
    # the main container mounts the model read-only
    r = httpx.put(f"http://{ip}:8080/file", params={"path": "/mnt/models/config.json"}, timeout=5)
    assert r.status_code == 409 and r.json()["errno"] == "EROFS"
    # the store saw the pod's requests, from inside the pod network: pods share its namespace, where a
    # connection to the store's (local) address comes from that address, the anchor
    anchor = s3.url.removeprefix("http://").split(":")[0]
    assert s3.count("GetObject", bucket=s3_bucket, remote_ip=anchor, since=since) == 3
    assert s3.count("ListObjectsV2", bucket=s3_bucket, remote_ip=anchor, since=since) == 1
    assert s3.count("GetObject", bucket=s3_bucket, since=since) == 3


def test_a_wrong_secret_shows_as_the_init_containers_termination_message(
    kube: Kube, namespace: str, s3: ObjectStore, s3_bucket: str
) -> None:
    kube.apply(_secret(s3, secret_key="wrong"), namespace)
    kube.apply(_fetch_pod(s3, s3_bucket, "minilm/v1"), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/fetcher"

    def failed_twice() -> dict[str, Any] | None:
        p = kube.get(path)
        st = ((p or {}).get("status", {}).get("initContainerStatuses") or [{}])[0]
        return st if st.get("restartCount", 0) >= 1 and st.get("lastState", {}).get("terminated") else None

    st = wait_for(failed_twice, timeout=60, what="the init container restarted after a failure")
    assert st["lastState"]["terminated"]["exitCode"] == 1
    assert st["lastState"]["terminated"]["message"] == f"SignatureDoesNotMatch: s3://{s3_bucket}/minilm/v1"
    pod = kube.get(path) or {}
    assert pod["status"]["phase"] == "Pending"
    init = next(c for c in pod["status"]["conditions"] if c["type"] == "Initialized")
    assert init["status"] == "False" and init["reason"] == "ContainersNotInitialized"
    assert pod["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}


def test_a_missing_secret_is_a_create_container_config_error_of_the_init_container(
    kube: Kube, namespace: str, s3: ObjectStore, s3_bucket: str
) -> None:
    kube.apply(_fetch_pod(s3, s3_bucket, "minilm/v1"), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/fetcher"

    def config_error() -> dict[str, Any] | None:
        p = kube.get(path)
        st = ((p or {}).get("status", {}).get("initContainerStatuses") or [{}])[0]
        w = st.get("state", {}).get("waiting") or {}
        return w if w.get("reason") == "CreateContainerConfigError" else None

    waiting = wait_for(config_error, timeout=30, what="CreateContainerConfigError")
    assert waiting["message"] == 'secret "s3-creds" not found'
    # created later, the init container starts and the pod initializes
    kube.apply(_secret(s3), namespace)
    wait_for(
        lambda: (kube.get(path) or {}).get("status", {}).get("phase") == "Running",
        timeout=60,
        what="the pod running once the secret exists",
    )
