"""Text generation end to end (issue 25) on the local cluster: a ``task: generation`` ModelDeployment of a
small Llama built offline (localcluster.genmodel) streams OpenAI completions through kube-proxy and
through the Gateway (Traefik), token by token; a revision whose first token comes later is rolled back
on ``ttft-p99-ms``; a revision with the same weights is promoted; a revision with other weights is caught
in the shadow stage (its greedy answers disagree with the stable's) before any user gets an answer from
it; and every stream open while a revision leaves traffic either finishes (``[DONE]``) or is counted by
its client as failed -- none is cut.

The slow revision is a real, bigger model (``size="bench"``: 25.6 M parameters against 1.4 M, 6 layers
against 2), not an injected delay: its prefill of the clients' ~60-token prompts takes several times as
long, so its first token comes several times later (the figures are printed)."""

from __future__ import annotations

import time
from typing import Any

import httpx
from localcluster import genmodel
from localcluster.kubeapi import service_url
from localcluster.testing import Kube, WaitTimeout, wait_for

from .canary_support import gateway_routing, md_status
from .gen_support import Stream, StreamLoad, stream_once

NAME = "writer"
MODEL = "tiny-llama"
#: the canary's p99 time to first token, at most: between the small model's and the big one's (printed).
#: On a bucket boundary of the server's TTFT histogram: Prometheus interpolates within a bucket, so a limit
#: inside one (150 ms, in 0.1-0.25 s) read the same big model as 243 ms in one run and 99 ms in another.
MAX_TTFT_P99_MS = 100
#: the limit everywhere else: the rollouts there are judged on other things (the same weights are promoted,
#: other weights are caught by the shadow stage), and the small model's TTFT p99 under a loaded machine
#: (23 ms idle, 66 ms beside two busy loops, 161 ms beside a pytest run) rolled back a same-weights revision
#: on the 100 ms limit -- what CI saw twice as a promotion that never came
LOOSE_TTFT_P99_MS = 2000


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def gen_md(
    version: str, size: str = "test", seed: int = 0, max_ttft_ms: int = LOOSE_TTFT_P99_MS, **rollout: Any
) -> dict[str, Any]:
    analysis = {
        "maxErrorRate": 0.05,
        "maxTTFTP99Ms": max_ttft_ms,
        "minRequests": 10,
        "failureLimit": 1,
        "onNoData": "hold",
        "noDataTimeout": "60s",
    }
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "model": {
                "name": MODEL,
                "version": version,
                "uri": genmodel.cached(seed=seed, size=size).as_uri(),
                "format": "hf",
                "task": "generation",
            },
            "replicas": 1,
            "resources": {"cpu": "1", "memory": "2Gi"},  # one torch thread per pod
            "rollout": {
                "steps": [50, 100],
                "interval": "8s",
                "bakeTime": "20s",
                "keepPrevious": {"replicas": 1, "ttl": "10m"},
                "analysis": analysis,
                **rollout,
            },
        },
    }


def history_outcome(st: dict[str, Any], revision: str) -> dict[str, Any] | None:
    return next((h for h in reversed(st.get("history", [])) if h["revision"] == revision), None)


def until_healthy_on(kube: Kube, ns: str, version: str, timeout: float = 180) -> str:
    def ok() -> str | None:
        st = md_status(kube, ns, NAME)
        revs = {r["revision"]: r for r in st.get("revisions", [])}
        stable = st.get("stableRevision")
        healthy = st.get("phase") == "Healthy" and not st.get("canaryRevision")
        return str(stable) if healthy and revs.get(stable, {}).get("modelVersion") == version else None

    return wait_for(ok, timeout=timeout, interval=0.5, what=f"{NAME} healthy on version {version}")


def new_revision(kube: Kube, ns: str, old: str) -> str:
    """The revision the ModelDeployment's spec now asks for (``status.revision``), once it is not ``old``."""
    return wait_for(
        lambda: (r := md_status(kube, ns, NAME).get("revision")) != old and r,
        timeout=30,
        what="the new revision in status",
    )


def rollout_summary(kube: Kube, ns: str) -> str:
    """Where a rollout stands, short (CI shows the head of a failure message): phase, revisions with their
    pods, the conditions, the history, the last analysis measurements, the pods' states."""
    st = md_status(kube, ns, NAME)
    revs = [
        f"{r['revision']}({r.get('role')}: {r.get('readyReplicas', 0)}/{r.get('replicas', 0)} ready, "
        f"{r.get('inTrafficReplicas', 0)} in traffic)"
        for r in st.get("revisions", [])
    ]
    conds = [
        f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message', '')[:160]}"
        for c in st.get("conditions", [])
    ]
    hist = [
        f"{h.get('revision')} {h.get('outcome')}: {str(h.get('reason', ''))[:160]}"
        for h in st.get("history", [])
    ]
    meas = [
        f"{m.get('metric')}={m.get('value')} {m.get('verdict')} {m.get('error') or ''}"[:160]
        for m in (st.get("analysis") or {}).get("measurements", [])[-4:]
    ]
    pods = [
        f"{p['metadata']['name']} {p.get('status', {}).get('phase')} "
        f"ready={[c.get('ready') for c in p.get('status', {}).get('containerStatuses', [])]}"
        for p in (kube.get(f"/api/v1/namespaces/{ns}/pods") or {}).get("items", [])
    ]
    return (
        f"phase={st.get('phase')} step={st.get('step')} "
        f"weight={st.get('canaryWeight')}/{st.get('achievedCanaryWeight')}; "
        f"revisions {revs}; conditions {conds}; history {hist}; measurements {meas}; pods {pods}"
    )


def outcome_of(kube: Kube, ns: str, revision: str, outcome: str, timeout: float) -> dict[str, Any]:
    """Wait until ``revision`` has ``outcome`` in the history (a rolled-back revision leaves
    ``status.revisions``, so it is known by its id, not its model version). Another outcome of it fails at
    once, and a timeout says where the rollout stood (CI twice saw a same-weights promotion time out after
    240 s, its cause cut off the end of the message)."""

    def seen() -> dict[str, Any] | None:
        st = md_status(kube, ns, NAME)
        for h in st.get("history", []):
            if h["revision"] == revision and h["outcome"] == outcome:
                return {**h, "status": st}
            if h["revision"] == revision:
                raise AssertionError(
                    f"revision {revision} {h['outcome']}, not {outcome}: {rollout_summary(kube, ns)}"
                )
        return None

    try:
        return wait_for(seen, timeout=timeout, interval=0.5, what=f"revision {revision} {outcome}")
    except WaitTimeout as e:
        raise AssertionError(f"no {outcome} for {revision}: {rollout_summary(kube, ns)} ({e})") from e


def failures(streams: list[Stream]) -> list[tuple[str, int, str | None, str | None]]:
    return [(s.kind, s.code, s.revision, s.error) for s in streams if s.kind != "ok"]


def ttfts(streams: list[Stream], revision: str) -> list[float]:
    return [s.ttft for s in streams if s.kind == "ok" and s.revision == revision and s.ttft is not None]


def test_a_generation_deployment_streams_token_by_token_through_kube_proxy_and_the_gateway(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    body = gen_md("1", trafficRouting=gateway_routing(ns, NAME))
    kube.apply(body, ns)
    until_healthy_on(kube, ns, "1")
    host = f"{NAME}.{ns}.test"
    via = {"kube-proxy": (service_url(kube.api, ns, NAME), None), "gateway": (kube.cluster.gateway_url, host)}
    for what, (url, vhost) in via.items():
        assert url, f"no URL for {what}"
        StreamLoad(url, MODEL, host=vhost).wait_serving(timeout=90)
        headers = {"Connection": "close", **({"Host": vhost} if vhost else {})}
        with httpx.Client(timeout=60, headers=headers) as client:
            body = {
                "model": MODEL,
                "prompt": "a canary judged by its clients",
                # 400 tokens: the small model writes them in ~0.4 s on a fast day (96 took 0.12 s through
                # the gateway once, in 8 bursts), so a proxy that flushes every 100 ms shows <= 5 arrivals
                "max_tokens": 400,
                "temperature": 0,
            }
            s = stream_once(client, url, body)
            whole = client.post(f"{url}/v1/completions", json=body).json()["choices"][0]["text"]
        assert s.kind == "ok" and s.revision, (what, s)
        # the same greedy answer streamed and whole
        assert s.text == whole, (what, s.text, whole)
        # the events came one by one, not buffered to the end: many distinct arrivals, the first well before
        # the last (a proxy that buffers the answer delivers every event at once)
        spread = s.arrivals[-1] - s.arrivals[0]
        print(f"{what}: {len(s.arrivals)} text events over {spread:.3f}s, first after {s.ttft:.3f}s")
        assert len({round(t, 3) for t in s.arrivals}) >= 10, (what, s.arrivals)
        assert s.first is not None and s.last is not None and s.last - s.first > 0.5 * (s.last - s.sent), what


def test_a_revision_with_a_slower_first_token_is_rolled_back_on_ttft_and_no_stream_is_cut(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    kube.apply(gen_md("1", max_ttft_ms=MAX_TTFT_P99_MS), ns)
    v1 = until_healthy_on(kube, ns, "1")
    genmodel.cached(seed=0, size="bench")  # built before the clock starts
    # prompts of ~100 words: the big model's prefill puts its first token well past 100 ms (~60 words gave a
    # median of 76 ms, its p99 on either side of 100 ms by run), the small model's stays well under
    load = StreamLoad(service_url(kube.api, ns, NAME), MODEL, workers=3, prompt_words=100).wait_serving()
    load.start()
    start = time.monotonic()
    try:
        kube.apply(gen_md("2-big", size="bench", max_ttft_ms=MAX_TTFT_P99_MS), ns)
        h = outcome_of(kube, ns, new_revision(kube, ns, v1), "RolledBack", timeout=240)
        decided = time.monotonic()
        time.sleep(8)  # streams open on v2 when it left traffic run to their end
    finally:
        load.stop()
    st = h["status"]
    v2 = h["revision"]
    m = h["measurement"]
    streams = load.snapshot(start)
    v1_ttft, v2_ttft = ttfts(streams, v1), ttfts(streams, v2)
    print(
        f"v1 TTFT p50/p99 {quantile(v1_ttft, 0.5):.3f}/{quantile(v1_ttft, 0.99):.3f}s ({len(v1_ttft)}), v2 "
        f"{quantile(v2_ttft, 0.5):.3f}/{quantile(v2_ttft, 0.99):.3f}s ({len(v2_ttft)}); decided "
        f"{decided - start:.1f}s after v2 was applied on {m}; streams {load.by_kind()} by revision "
        f"{load.by_revision(start)}"
    )
    assert m["metric"] == "ttft-p99-ms" and m["value"] > m["threshold"] == MAX_TTFT_P99_MS, m
    assert st["stableRevision"] == v1 and v2 != v1
    assert v2_ttft, "no stream reached v2: the canary was judged on nothing the clients saw"
    assert quantile(v2_ttft, 0.5) > 2 * quantile(v1_ttft, 0.5)
    # what clients saw: every stream finished, on v1 or on v2 while it was the canary
    assert not failures(streams), failures(streams)[:10]
    late = [s for s in streams if s.sent > decided + 5 and s.revision != v1]
    assert not late, late[:5]


def test_a_revision_with_the_same_weights_is_promoted_and_no_stream_is_cut(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    kube.apply(gen_md("1"), ns)
    v1 = until_healthy_on(kube, ns, "1")
    prompts = [f"prompt {i}: a stable revision keeps serving" for i in range(4)]
    url = service_url(kube.api, ns, NAME)
    load = StreamLoad(url, MODEL, workers=3, max_tokens=64, prompts=prompts).wait_serving()
    load.start()
    start = time.monotonic()
    try:
        kube.apply(gen_md("2"), ns)
        h = outcome_of(kube, ns, new_revision(kube, ns, v1), "Promoted", timeout=240)
        promoted = time.monotonic()
        time.sleep(8)  # streams open on v1 when it left traffic run to their end
    finally:
        load.stop()
    v2 = h["revision"]
    streams = load.snapshot(start)
    print(
        f"promoted {promoted - start:.1f}s after v2 was applied; streams {load.by_kind()} "
        f"{load.by_revision(start)}"
    )
    assert v2 != v1 and md_status(kube, ns, NAME)["stableRevision"] == v2
    assert not failures(streams), failures(streams)[:10]
    by_rev = load.by_revision(start)
    assert by_rev[v1] > 0 and by_rev[v2] > 0
    # the same weights: the same greedy answer to the same prompt from both revisions
    answers: dict[str, dict[str, set[str]]] = {}
    for s in streams:
        answers.setdefault(s.prompt, {}).setdefault(s.revision or "", set()).add(s.text)
    assert all(s.finish_reason in ("length", "stop") for s in streams)
    for p, by_revision in answers.items():
        assert len(set().union(*by_revision.values())) == 1, (p, by_revision)


#: every greedy answer copied, judged after 20 s on at least 20 compared answers
SHADOW = {
    "duration": "20s",
    "sampleRate": 1.0,
    "minSamples": 20,
    "minAgreement": 0.9,
    "compare": {"method": "tokenAgreement", "minTokenAgreement": 0.9},
}


def test_a_revision_with_other_weights_is_caught_in_the_shadow_stage_and_no_user_gets_its_answer(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    kube.apply(gen_md("1", shadow=SHADOW), ns)
    v1 = until_healthy_on(kube, ns, "1")
    genmodel.cached(seed=1, size="test")  # built before the clock starts
    prompts = [f"prompt {i}: the stable revision answers" for i in range(6)]
    url = service_url(kube.api, ns, NAME)
    load = StreamLoad(url, MODEL, workers=3, max_tokens=32, prompts=prompts).wait_serving()
    load.start()
    start = time.monotonic()
    try:
        kube.apply(gen_md("2-other", seed=1, shadow=SHADOW), ns)
        v2 = new_revision(kube, ns, v1)
        h = outcome_of(kube, ns, v2, "RolledBack", timeout=240)
        decided = time.monotonic()
        time.sleep(3)
    finally:
        load.stop()
    streams = load.snapshot(start)
    m = h["measurement"]
    print(
        f"rolled back {decided - start:.1f}s after v2 was applied on {m}; streams {load.by_kind()} "
        f"{load.by_revision(start)}"
    )
    assert "shadow stage failed" in h["reason"]
    assert m["metric"] == "agreement" and m["value"] < SHADOW["minAgreement"], m
    assert md_status(kube, ns, NAME)["stableRevision"] == v1
    # what clients saw: every stream finished, every one on v1
    assert not failures(streams), failures(streams)[:10]
    assert set(load.by_revision(start)) == {v1}, load.by_revision(start)
