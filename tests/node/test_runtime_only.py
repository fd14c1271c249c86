"""What only a real container runtime can prove about the serving pods the operator builds:

* a revision whose memory limit is too small for its server is killed by the kernel (the container's
  memory cgroup), the kubelet says ``OOMKilled``, and the operator rolls the canary back naming it within
  one analysis interval -- while the stable revision answers every request;
* the server runs as the image's user (uid 10001) on a read-only root filesystem, writing only where the
  pod gives it an emptyDir (``/tmp``, the download directory), and still serves.

The process node agent runs a server as a host process: no memory cgroup (nothing is ever OOM-killed),
no uid switch and no root filesystem of the image's own, so neither can be shown there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from e2e.canary_support import LoadGenerator, events, md_status, stable_on
from localcluster.testing import Kube, wait_for
from modeldeploy import builders as b

from .operator_support import md_crds, md_operator, noop_md  # noqa: F401 (fixtures)
from .support import py

INTERVAL_S = 10  # the noop_md's rollout.interval
TOO_SMALL = "48Mi"  # the noop server (FastAPI, numpy, uvicorn) needs ~70 MiB resident before it listens


pytestmark = pytest.mark.usefixtures("md_operator")


def _pods(kube: Kube, ns: str, revision: str) -> list[dict[str, Any]]:
    return kube.pods(ns, f"{b.LABEL_NAME}=echo,{b.LABEL_REVISION}={revision}")


def _oom_status(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The OOMKilled termination in a pod's container statuses (now or last), else None."""
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        for key in ("state", "lastState"):
            term = (st.get(key) or {}).get("terminated") or {}
            if term.get("reason") == "OOMKilled":
                return term
    return None


class OOMWatch:
    """Polls the canary's pods (every 0.1 s) for the first OOMKilled container status: when this test
    first saw it, and the termination the kubelet reported."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.revision: str | None = None
        self.seen: float | None = None  # time.monotonic()
        self.term: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.seen is None:
            if self.revision is not None:
                for pod in _pods(self.kube, self.ns, self.revision):
                    term = _oom_status(pod)
                    if term is not None:
                        self.seen, self.term = time.monotonic(), term
                        break
            time.sleep(0.1)

    def __enter__(self) -> OOMWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def load(kube: Kube, namespace: str) -> Iterator[LoadGenerator]:
    gen = LoadGenerator(kube, namespace, "echo", workers=2, pause=0.05, max_seconds=300)
    yield gen
    gen.stop()


def _time(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


def test_a_canary_oom_killed_by_the_kernel_is_rolled_back_naming_it_and_the_stable_serves(
    kube: Kube, namespace: str, load: LoadGenerator
) -> None:
    ns = namespace
    kube.apply(noop_md("echo", "1", "256Mi"), ns)
    stable = stable_on(kube, ns, "1", timeout=180)
    load.wait_serving(timeout=60).start()
    time.sleep(2)
    with OOMWatch(kube, ns) as watch:
        kube.apply(noop_md("echo", "2", TOO_SMALL), ns)
        canary = wait_for(
            lambda: (r := md_status(kube, ns, "echo").get("revision")) != stable and r,
            timeout=30,
            what="canary",
        )
        watch.revision = canary

        def rolled_back() -> dict[str, Any] | None:
            hist = md_status(kube, ns, "echo").get("history") or []
            return next((h for h in hist if h["revision"] == canary and h["outcome"] == "RolledBack"), None)

        entry = wait_for(rolled_back, timeout=180, interval=0.1, what="the canary rolled back")
        reported = time.monotonic()
    time.sleep(3)  # the stable keeps serving after the decision too
    load.stop()

    assert watch.seen is not None and watch.term is not None, "no OOMKilled container status seen"
    pod = next(iter(_pods(kube, ns, canary)), None)
    reason = entry["reason"]
    assert "OOMKilled" in reason and f"memory limit {TOO_SMALL}" in reason, reason
    assert f"container {b.CONTAINER_NAME} of pod echo-{canary}-" in reason and "restarted" in reason, reason
    said = [e for e in events(kube, ns, "echo") if e["reason"] == "RolledBack"]
    assert said and reason in said[-1]["message"]
    # within one analysis interval of the kill: as this test saw the status and the history appear
    # (0.1 s polls), and by the kubelet's and the operator's own clocks (second precision)
    seen_to_report = reported - watch.seen
    killed_to_history = (_time(entry["time"]) - _time(watch.term["finishedAt"])).total_seconds()
    print(
        f"\nOOM: status seen -> history seen {seen_to_report:.2f} s; "
        f"finishedAt -> history time {killed_to_history:.0f} s (interval {INTERVAL_S} s); "
        f"termination {watch.term}; reason: {reason}; canary pod now: "
        f"{(pod or {}).get('status', {}).get('containerStatuses')}"
    )
    assert seen_to_report < INTERVAL_S
    assert killed_to_history <= INTERVAL_S
    st = md_status(kube, ns, "echo")
    assert st["stableRevision"] == stable and not st.get("canaryRevision")
    kinds = load.by_kind()
    print(f"client: {dict(kinds)} over {len(load.records)} requests, by revision {dict(load.by_revision())}")
    assert kinds["ok"] == len(load.records) > 50, kinds
    assert set(load.by_revision()) == {stable}


def test_a_stable_revision_oom_killed_is_reported_and_kept(kube: Kube, namespace: str) -> None:
    """A first revision with too small a limit has nothing to roll back to: Degraded=True reason
    OOMKilled naming it, an OOMKilled Warning event, and its Deployment left as it is (the kubelet keeps
    restarting it; a new spec is the way out)."""
    ns = namespace
    kube.apply(noop_md("echo", "1", TOO_SMALL), ns)

    def degraded() -> dict[str, Any] | None:
        conds = md_status(kube, ns, "echo").get("conditions") or []
        return next((c for c in conds if c["type"] == "Degraded" and c["reason"] == "OOMKilled"), None)

    cond = wait_for(degraded, timeout=120, interval=0.2, what="Degraded=True reason OOMKilled")
    assert cond["status"] == "True" and f"OOMKilled (memory limit {TOO_SMALL})" in cond["message"]
    event = wait_for(
        lambda: next((e for e in events(kube, ns, "echo") if e["reason"] == "OOMKilled"), None),
        timeout=30,
        what="an OOMKilled event",
    )
    # through the kubelet's restarts (back-off 10 s, then 20 s: each restart runs a second or so before
    # the next kill) it stays reported: never a flap to AsExpected and back
    deadline, reasons, restarts = time.monotonic() + 25, set(), 0
    while time.monotonic() < deadline:
        c = next(c for c in md_status(kube, ns, "echo")["conditions"] if c["type"] == "Degraded")
        reasons.add(c["reason"])
        for pod in kube.pods(ns, f"{b.LABEL_NAME}=echo"):
            for cs in pod["status"].get("containerStatuses") or []:
                restarts = max(restarts, int(cs.get("restartCount", 0)))
        time.sleep(0.2)
    assert reasons == {"OOMKilled"} and restarts >= 1, (reasons, restarts)
    st = md_status(kube, ns, "echo")
    degraded_events = [e for e in events(kube, ns, "echo") if e["reason"] in ("OOMKilled", "AsExpected")]
    assert [e["reason"] for e in degraded_events] == ["OOMKilled"], degraded_events
    print(f"\nDegraded: {cond['message']}\nevent: {event['type']} {event['message']}")
    print(f"restarts seen: {restarts}")
    assert event["type"] == "Warning"
    assert [h["outcome"] for h in st.get("history") or []] == ["Deployed"]
    dep = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/echo-{st['revision']}")
    assert dep is not None and dep["spec"]["replicas"] == 1


NONROOT = (
    "import errno, os\n"
    "print('uid', os.getuid(), os.getgid())\n"
    "for d in ('/', '/opt/app', '/tmp', '/var/lib/modelserver'):\n"
    "    try:\n"
    "        open(os.path.join(d, 'probe-write'), 'w').close()\n"
    "        print('write', d, 'ok')\n"
    "    except OSError as e:\n"
    "        print('write', d, errno.errorcode[e.errno])\n"
)


def test_the_server_runs_as_the_images_user_on_a_read_only_root_and_serves(
    kube: Kube, namespace: str
) -> None:
    ns = namespace
    kube.apply(noop_md("echo", "1", "256Mi"), ns)
    revision = stable_on(kube, ns, "1", timeout=180)
    pod = _pods(kube, ns, revision)[0]
    name = pod["metadata"]["name"]
    out = py(kube, ns, name, NONROOT)
    print(f"\n{name}:\n{out}")
    lines = out.strip().splitlines()
    assert lines[0] == "uid 10001 10001"
    assert "write / EROFS" in lines and "write /opt/app EROFS" in lines
    assert "write /tmp ok" in lines and "write /var/lib/modelserver ok" in lines
    uid = kube.kubectl("exec", "-n", ns, name, "--", "id", "-u").stdout.strip()
    assert uid == "10001"
    # the kubelet's own report of the process's identity (containerStatuses[].user)
    user = (pod["status"]["containerStatuses"][0].get("user") or {}).get("linux") or {}
    assert (user.get("uid"), user.get("gid")) == (10001, 10001), user
    sc = pod["spec"]["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    # capabilities as the kernel holds them: none effective, none permitted
    caps = py(kube, ns, name, "print(open('/proc/self/status').read())")
    eff = {k: v for k, v in (line.split(":\t") for line in caps.splitlines() if line.startswith("Cap"))}
    assert int(eff["CapEff"], 16) == 0 and int(eff["CapPrm"], 16) == 0, eff
    assert "NoNewPrivs:\t1" in caps
    # and it serves
    ip = pod["status"]["podIP"]
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
    r = httpx.post(f"http://{ip}:8080/v2/models/echo/infer", json=body, timeout=10)
    assert r.status_code == 200 and r.headers["x-modeldeploy-revision"] == revision
