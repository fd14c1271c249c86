"""``make bench-storage``: model fetch from the local cluster's S3 (versitygw), against plain boto3, and
pod-Ready time with the node cache (issue 12, "Bench").

One run, on a fresh local cluster (no KEDA):

1. **fetch throughput**: a generated model of ~218 MB (random bytes: a 160 MiB file, so ranged GETs of a
   multipart-sized object, a 40 MiB one, an 8 MiB one and a few small ones) uploaded to the cluster's
   versitygw, then downloaded from the host in interleaved rounds by

   * ``plain``: a plain ``boto3`` client (path-style), ``list_objects_v2`` then ``download_file`` of each
     object in turn, default ``TransferConfig`` (what a user would write);
   * ``fetch``: ``python -m modelserver.fetch --uri s3://... --dest DIR``, the real CLI, default settings
     (10 concurrent requests, 8 MiB ranges, store checksums checked: the objects' CRC32 flexible
     checksums, which boto3 writes on upload, else their ETags);
   * ``fetch --etag-check off``: the same without checking any store checksum;
   * ``fetch (CRC64NVME)``: the CLI again, on a copy of the model uploaded with ``ChecksumAlgorithm=
     CRC64NVME`` (what S3 gives every new object), checked with it through ``awscrt`` (before awscrt was in
     the image, such objects fell back to the MD5 ETag).

   Each is its own Python process (the same interpreter, so each pays the same start-up and ``import
   boto3``), timed from spawn to exit; the order rotates per round. Medians over the rounds, and the
   ratio of the CLI's throughput to plain boto3's (target >= 0.9x). Every download is checked (sizes; the
   first round's sha256 of every file) outside the timed span.
2. **pod-Ready time** of a ModelDeployment (``format: noop``, so loading the files costs nothing) whose
   ``spec.model.uri`` is that model on ``s3://`` with ``storage.nodeCache`` on: a **cold** fetch (the
   first pod of a model the node cache has never seen: one ModelDeployment per uploaded copy) and a
   **cache hit** (its pod deleted: the ReplicaSet's replacement fetches from the node cache), each from
   the pod's creation (first seen by a pod watch) to its ``Ready`` condition (seen by the same watch).
   The fetch container's own ``done`` log line says where the files came from (``download``/``cache``).

The operator runs as a process on the host (as in the e2e tests), its node cache under the cluster's
state directory. Results: ``bench/results/storage.json`` and ``storage.md``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from localcluster.cluster import Cluster, down, up
from localcluster.kubeapi import KubeAPI, KubeError
from localcluster.objectstore import ObjectStore
from localcluster.operator_process import OperatorProcess
from localcluster.state import REPO_ROOT

from bench.provenance import provenance

RESULTS = REPO_ROOT / "bench" / "results" / "storage.json"
RESULTS_MD = REPO_ROOT / "bench" / "results" / "storage.md"
NAMESPACE = "bench-storage"
BUCKET = "bench-models"
TARGET_RATIO = 0.95  # issue 12 asked 0.9x; issue 28 0.95x once awscrt computes the checksums
MIB = 1 << 20
#: the generated model: (relative path, size in bytes)
MODEL_FILES = (
    ("model-00001-of-00002.safetensors", 160 * MIB),
    ("model-00002-of-00002.safetensors", 40 * MIB),
    ("tokenizer.json", 8 * MIB),
    ("vocab.txt", 900_000),
    ("config.json", 1_200),
    ("generation_config.json", 180),
)

# the plain-boto3 baseline, in a process of its own like the CLI: argv = bucket prefix dest
PLAIN = """
import json, os, sys, time
import boto3
from botocore.config import Config
t0 = time.monotonic()  # after the imports, as the CLI's own time (from its argument parsing)
bucket, prefix, dest = sys.argv[1:4]
s3 = boto3.client(
    "s3",
    endpoint_url=os.environ["S3_ENDPOINT"],
    region_name=os.environ["AWS_DEFAULT_REGION"],
    config=Config(s3={"addressing_style": "path"}),
)
keys = []
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
    keys += [o["Key"] for o in page.get("Contents") or []]
for key in keys:
    path = os.path.join(dest, key[len(prefix):])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s3.download_file(bucket, key, path)
print(json.dumps({"seconds": time.monotonic() - t0, "objects": len(keys)}))
"""


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def _epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------------------------------------- the model


def generate_model(root: Path) -> int:
    """The model's files under ``root`` (random bytes, seeded); their total size."""
    rng = random.Random(12)
    total = 0
    for rel, size in MODEL_FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            left = size
            while left:
                n = min(left, 8 * MIB)
                f.write(rng.randbytes(n))
                left -= n
        total += size
    return total


def digests(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h = hashlib.sha256()
        with p.open("rb") as f:
            while chunk := f.read(4 * MIB):
                h.update(chunk)
        out[p.relative_to(root).as_posix()] = h.hexdigest()
    return out


def sizes(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    }


# ------------------------------------------------------------------------------------------- 1. fetch


def s3_env(s3: ObjectStore) -> dict[str, str]:
    return {
        **os.environ,
        "S3_ENDPOINT": s3.url,
        "AWS_DEFAULT_REGION": s3.region,
        "S3_ADDRESSING_STYLE": "path",
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
    }


def one_download(
    method: str, s3: ObjectStore, prefix: str, dest: Path, work: Path
) -> tuple[float, float | None, dict[str, int] | None]:
    """Download ``s3://BUCKET/prefix/`` into ``dest`` with ``method``: (wall seconds of the process, the
    seconds it reports itself, how the fetch checked the objects: check -> objects)."""
    env = s3_env(s3)
    if method == "plain":
        argv = [sys.executable, "-c", PLAIN, BUCKET, f"{prefix}/", str(dest)]
    else:
        argv = [sys.executable, "-m", "modelserver.fetch", "--uri", f"s3://{BUCKET}/{prefix}/"]
        argv += ["--dest", str(dest), "--termination-log", str(work / "termination-log")]
        if method == "fetch-etag-off":
            argv += ["--etag-check", "off"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{method} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    inner, checks = None, None
    for line in proc.stdout.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if method == "plain" or doc.get("event") == "done":
            inner = float(doc["seconds"])
        if doc.get("event") == "store_checksums":
            checks = doc.get("checks")
    return wall, inner, checks


METHODS = ("plain", "fetch", "fetch-etag-off", "fetch-crc64nvme")
#: the copy of the model each method downloads: "crc32" (boto3's default upload) or "crc64nvme"
COPY = {"plain": "crc32", "fetch": "crc32", "fetch-etag-off": "crc32", "fetch-crc64nvme": "crc64nvme"}


def throughput(
    s3: ObjectStore, prefixes: dict[str, str], model: Path, total: int, rounds: int, work: Path
) -> dict:
    """``prefixes``: each copy of the model (:data:`COPY`) -> its prefix."""
    want_sizes = sizes(model)
    want_digests = digests(model)
    runs: dict[str, list[dict[str, float | None]]] = {m: [] for m in METHODS}
    checks: dict[str, dict[str, int] | None] = {}
    for r in range(rounds):
        order = METHODS[r % len(METHODS) :] + METHODS[: r % len(METHODS)]
        for method in order:
            dest = work / f"dest-{method}-{r}"
            wall, inner, checks[method] = one_download(method, s3, prefixes[COPY[method]], dest, work)
            got = sizes(dest)
            if got != want_sizes:
                raise RuntimeError(f"{method}: wrong files {got} != {want_sizes}")
            if r == 0 and digests(dest) != want_digests:
                raise RuntimeError(f"{method}: the downloaded bytes differ from the model's")
            shutil.rmtree(dest)
            mbps = total / wall / 1e6
            runs[method].append(
                {"wall_seconds": _r(wall, 3), "inner_seconds": _r(inner, 3), "mb_s": _r(mbps, 1)}
            )
            print(
                f"  round {r + 1} {method:15s} {wall:6.2f} s ({mbps:6.1f} MB/s; own {inner or 0:.2f} s)",
                flush=True,
            )

    def med(method: str, key: str) -> float:
        return statistics.median(float(x[key]) for x in runs[method] if x[key] is not None)  # type: ignore[arg-type]

    out: dict[str, Any] = {"rounds": rounds, "runs": runs, "median": {}, "checks": checks}
    for m in METHODS:
        w = med(m, "wall_seconds")
        out["median"][m] = {
            "wall_seconds": _r(w, 3),
            "inner_seconds": _r(med(m, "inner_seconds"), 3),
            "mb_s": _r(total / w / 1e6, 1),
        }
    plain = out["median"]["plain"]
    for m in METHODS[1:]:
        out[f"ratio_{m.replace('-', '_')}"] = _r(plain["wall_seconds"] / out["median"][m]["wall_seconds"], 2)
        out[f"ratio_inner_{m.replace('-', '_')}"] = _r(
            plain["inner_seconds"] / out["median"][m]["inner_seconds"], 2
        )
    out["ratio_per_round_fetch"] = [
        _r(float(p["wall_seconds"]) / float(f["wall_seconds"]), 2)  # type: ignore[arg-type]
        for p, f in zip(runs["plain"], runs["fetch"], strict=True)
    ]
    return out


# ------------------------------------------------------------------------------------------- 2. pods


class PodWatch:
    """Each pod of the namespace: when a watch first saw it and when it first saw it Ready (monotonic)."""

    def __init__(self, api: KubeAPI, ns: str) -> None:
        self.api, self.ns = api, ns
        self.seen: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.objects: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _note(self, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        with self.lock:
            self.seen.setdefault(name, now)
            self.objects[name] = pod
            conds = (pod.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                self.ready.setdefault(name, now)

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.ns}/pods"
        while not self.stop.is_set():
            try:
                lst = self.api.get(path) or {}
                for p in lst.get("items") or []:
                    self._note(p)
                rv = lst["metadata"]["resourceVersion"]
                for ev in self.api.watch(path, rv, timeout_s=30):
                    if self.stop.is_set():
                        return
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self._note(ev["object"])
            except Exception as e:  # a closed stream, a 410: list and watch again
                print(f"  (pod watch restarts: {type(e).__name__})", flush=True)
                time.sleep(0.2)

    def wait_ready(self, exclude: set[str], timeout: float) -> str:
        """The name of a pod not in ``exclude`` once it is Ready."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                for name in self.ready:
                    if name not in exclude:
                        return name
            time.sleep(0.05)
        raise TimeoutError(f"no new pod Ready within {timeout:.0f}s")


def fetch_log(cluster: Cluster, pod: str) -> dict[str, Any]:
    """The fetch container's ``done`` line (``source``: download or cache, ``seconds``)."""
    for log in cluster.state_dir.glob(f"**/pods/{NAMESPACE}_{pod}_*/fetch-model.log"):
        for line in log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if doc.get("event") == "done":
                return {"source": doc.get("source"), "fetch_seconds": doc.get("seconds")}
    return {}


def pod_record(cluster: Cluster, watch: PodWatch, pod: str) -> dict[str, Any]:
    obj = watch.objects[pod]
    conds = {c["type"]: c for c in obj["status"].get("conditions") or []}
    created = _epoch(obj["metadata"]["creationTimestamp"])
    ready_at = conds.get("Ready", {}).get("lastTransitionTime")
    init = (obj["status"].get("initContainerStatuses") or [{}])[0].get("state", {}).get("terminated", {})
    return {
        "pod": pod,
        "ready_seconds": _r(watch.ready[pod] - watch.seen[pod], 2),
        # the API server's timestamps (whole seconds): a cross-check
        "ready_seconds_timestamps": ready_at and round(_epoch(ready_at) - created, 0),
        "fetch_container_seconds_timestamps": init.get("finishedAt")
        and round(_epoch(init["finishedAt"]) - _epoch(init["startedAt"]), 0),
        **fetch_log(cluster, pod),
    }


def md_body(name: str, uri: str, s3: ObjectStore) -> dict[str, Any]:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "name": "bench",
                "version": "1",
                "uri": uri,
                "format": "noop",
                "storage": {
                    "endpoint": s3.url,
                    "region": s3.region,
                    "addressingStyle": "path",
                    "secretRef": {"name": "s3-credentials"},
                    "timeout": "3m",
                    "nodeCache": {"maxSize": "4Gi"},
                },
            },
            "replicas": 1,
            "resources": {"cpu": "100m", "memory": "256Mi"},
        },
    }


def pod_ready(cluster: Cluster, s3: ObjectStore, prefixes: list[str], hits: int, timeout: float) -> dict:
    api = KubeAPI(cluster.kubeconfig)
    api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    for _ in range(100):  # the namespace's default ServiceAccount, which pods need
        if api.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default", ok_missing=True):
            break
        time.sleep(0.2)
    api.create(
        f"/api/v1/namespaces/{NAMESPACE}/secrets",
        {
            "metadata": {"name": "s3-credentials"},
            "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
        },
    )
    watch = PodWatch(KubeAPI(cluster.kubeconfig), NAMESPACE)  # a client of its own (its thread)
    cold: list[dict[str, Any]] = []
    hit: list[dict[str, Any]] = []
    try:
        for i, prefix in enumerate(prefixes):
            name = f"model-{i + 1}"
            with watch.lock:
                before = set(watch.seen)
            api.create(
                f"/apis/modeldeploy.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments",
                md_body(name, f"s3://{BUCKET}/{prefix}/", s3),
            )
            pod = watch.wait_ready(before, timeout)
            cold.append(pod_record(cluster, watch, pod))
            print(f"  {name} cold: {cold[-1]}", flush=True)
            for _ in range(hits):
                with watch.lock:
                    before = set(watch.seen)
                api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
                pod = watch.wait_ready(before, timeout)
                hit.append(pod_record(cluster, watch, pod))
                print(f"  {name} cache hit: {hit[-1]}", flush=True)
            with contextlib.suppress(KubeError):
                api.delete(f"/apis/modeldeploy.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments/{name}")
    finally:
        watch.stop.set()
    return {
        "cold": cold,
        "cache_hit": hit,
        "median_cold_seconds": _r(statistics.median(x["ready_seconds"] for x in cold)),
        "median_cache_hit_seconds": _r(statistics.median(x["ready_seconds"] for x in hit)) if hit else None,
    }


# ------------------------------------------------------------------------------------------- operator


def install_crds(cluster: Cluster) -> None:
    from localcluster.cluster import binaries_dir

    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    kubectl = str(binaries_dir() / "kubectl")
    subprocess.run(
        [kubectl, "apply", "--server-side", "-f", str(REPO_ROOT / "crds")],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            kubectl,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/modeldeployments.modeldeploy.io",
        ],
        env=env,
        check=True,
        capture_output=True,
    )


# ------------------------------------------------------------------------------------------- report


def markdown(r: dict[str, Any]) -> str:
    t, p = r["throughput"], r["pods"]
    mb = r["model_bytes"] / 1e6
    lines = [
        "# Model storage: fetch throughput and pod-Ready time with the node cache",
        "",
        f"{r['when']}, commit {r.get('commit')}; {r['machine']}; load average before {r['load_before']}, "
        f"after {r['load_after']} "
        f"(a shared machine). Command: `{r['command']}` ({r['wall_seconds']:.0f} s in all, cluster "
        f"bring-up included). Object store: the local cluster's versitygw (POSIX backend, same machine).",
        "",
        f"## Fetch throughput: {mb:.0f} MB model, {len(MODEL_FILES)} objects (largest "
        f"{MODEL_FILES[0][1] / MIB:.0f} MiB), {t['rounds']} interleaved rounds, medians",
        "",
        "Each download is a process of its own, timed from spawn to exit (interpreter start-up and "
        '`import boto3` included on every side); "own" is the time the process reports itself.',
        "",
        "| method | wall (median) | throughput | own time | vs plain boto3 | objects checked by |",
        "|---|---|---|---|---|---|",
    ]
    names = {
        "plain": "plain boto3 (`list_objects_v2` + `download_file` per object, default TransferConfig)",
        "fetch": "`python -m modelserver.fetch` (defaults: every object checked against its CRC32)",
        "fetch-etag-off": "`python -m modelserver.fetch --etag-check off`",
        "fetch-crc64nvme": "`python -m modelserver.fetch`, a copy uploaded with CRC64NVME checksums",
    }
    for m in METHODS:
        x = t["median"][m]
        ratio = "1.00x" if m == "plain" else f"**{t['ratio_' + m.replace('-', '_')]:.2f}x**"
        how = t.get("checks", {}).get(m)
        checked = ", ".join(f"{k}: {v}" for k, v in sorted(how.items())) if how else "-"
        lines.append(
            f"| {names[m]} | {x['wall_seconds']:.2f} s | {x['mb_s']} MB/s "
            f"| {x['inner_seconds']:.2f} s | {ratio} | {checked} |"
        )
    verdict = "met" if t["ratio_fetch"] >= TARGET_RATIO else "not met"
    lines += [
        "",
        f"Ratio = plain wall time / CLI wall time (= throughput ratio). Target >= {TARGET_RATIO}x with the "
        f"defaults: **{verdict}** ({t['ratio_fetch']:.2f}x; per round {t['ratio_per_round_fetch']}; on the "
        f"processes' own times {t['ratio_inner_fetch']:.2f}x); on the CRC64NVME copy "
        f"{t['ratio_fetch_crc64nvme']:.2f}x. Every download was checked (sizes; sha256 of every file in "
        "round 1).",
        "",
        "## Pod-Ready time, `s3://` + `storage.nodeCache`, `format: noop`",
        "",
        "From the pod's creation to its `Ready` condition, both as seen by a pod watch; cold: the first pod "
        "of a ModelDeployment whose model (a copy under its own prefix) the node cache has never seen; "
        "cache hit: that pod deleted, the ReplicaSet's replacement. `source` is what the fetch container "
        "logged.",
        "",
        "| pod | Ready after | fetch container (own) | source |",
        "|---|---|---|---|",
    ]
    for kind, rows in (("cold", p["cold"]), ("cache hit", p["cache_hit"])):
        for x in rows:
            lines.append(
                f"| {kind} ({x['pod']}) | {x['ready_seconds']:.2f} s | {x.get('fetch_seconds')} s "
                f"| {x.get('source')} |"
            )
    lines += [
        "",
        f"Median: **cold {p['median_cold_seconds']} s, cache hit {p['median_cache_hit_seconds']} s**.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.storage")
    p.add_argument(
        "--rounds", type=int, default=9, help="interleaved rounds of the throughput part (the order rotates)"
    )
    p.add_argument("--cold", type=int, default=2, help="cold pods (one uploaded copy of the model each)")
    p.add_argument("--hits", type=int, default=2, help="cache-hit pods per cold one")
    p.add_argument("--timeout", type=float, default=180.0, help="per pod, to Ready")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still clean up the cluster

    started = time.monotonic()
    result: dict[str, Any] = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        **provenance(),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join(["python -m bench.storage", *(sys.argv[1:] if argv is None else argv)]),
        "target_ratio": TARGET_RATIO,
    }
    work = Path(tempfile.mkdtemp(prefix="bench-storage-"))
    state = work / "cluster"
    operator = None
    try:
        model = work / "model"
        total = generate_model(model)
        result["model_bytes"] = total
        result["model_files"] = [{"path": rel, "bytes": size} for rel, size in MODEL_FILES]
        t = time.monotonic()
        cluster = up(state, keda=False)
        print(f"cluster up in {time.monotonic() - t:.1f}s; S3 at {cluster.s3_url}", flush=True)
        s3 = ObjectStore.of_cluster(cluster)
        assert s3 is not None, "the local cluster has no object store"
        s3.make_bucket(BUCKET)
        prefixes = [f"model-{i + 1}" for i in range(max(args.cold, 1))]
        t = time.monotonic()
        for prefix in prefixes:
            s3.upload_dir(model, BUCKET, prefix)
        s3.upload_dir(model, BUCKET, "model-crc64nvme", checksum="CRC64NVME")
        result["upload_seconds"] = _r(time.monotonic() - t, 1)
        print(f"uploaded {len(prefixes)} x {total / 1e6:.0f} MB in {result['upload_seconds']} s", flush=True)

        print(f"fetch throughput, {args.rounds} rounds", flush=True)
        copies = {"crc32": prefixes[0], "crc64nvme": "model-crc64nvme"}
        result["throughput"] = throughput(s3, copies, model, total, args.rounds, work)

        print("pod-Ready time, cold vs node-cache hit", flush=True)
        install_crds(cluster)
        operator = OperatorProcess(cluster, work / "operator.log").wait_live()
        result["pods"] = pod_ready(cluster, s3, prefixes[: args.cold], args.hits, args.timeout)
    finally:
        if operator is not None:
            operator.stop()
            if "pods" not in result:
                print("--- operator log (tail) ---\n" + operator.log_tail(15), flush=True)
        if state.exists():
            down(state)
        shutil.rmtree(work, ignore_errors=True)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    RESULTS_MD.write_text(markdown(result))
    print(RESULTS_MD.read_text())
    print(f"written to {RESULTS} and {RESULTS_MD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
