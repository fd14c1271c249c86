"""The shadow mirror in-process: a stable server copies a sample of its answered requests to a shadow
server (both real ModelServerApps with the noop model, joined by an in-process transport), compares the
answers and counts them; the user's answer is always the stable's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from localcluster.promtext import sample_sum, sample_values
from modelserver.app import ModelServerApp
from modelserver.config import load_settings
from modelserver.loader import create_model
from modelserver.service import ModelService
from modelserver.shadow import SHADOW_HEADER, MirrorConfig, MirrorConfigError, ShadowMirror

#: what the operator gives a pod of ModelDeployment "md" in namespace "team-a"
SERVICE = "http://md-{revision}.team-a.svc.cluster.local:8080"


async def server(version: str, uri: str = "noop://", *args: str) -> tuple[ModelServerApp, ModelService]:
    settings = load_settings(
        ["--model-name", "m", "--model-version", version, "--model-uri", uri, *args], environ={}
    )
    svc = ModelService(settings, create_model(settings))
    await svc.start()
    return ModelServerApp(svc), svc


class Recording:
    """Carries copies to the shadow app in-process (the mirror's ``post``); remembers every copy's
    headers. The real client (aiohttp) is exercised against real processes in tests/integration/server."""

    def __init__(self, app: ModelServerApp) -> None:
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shadow")
        self.headers: list[dict[str, str]] = []

    async def __call__(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        self.headers.append(headers)
        r = await self.client.post(httpx.URL(url).path, content=body, headers=headers)
        return r.status_code, dict(r.headers), r.content


async def pair(shadow_uri: str, rate: float = 1.0, timeout_ms: float = 5000, **mirror_kw):
    shadow_app, shadow_svc = await server("2", shadow_uri)
    transport = Recording(shadow_app)
    stable_app, stable_svc = await server("1")
    mirror = ShadowMirror("m", stable_svc.metrics, post=transport, **mirror_kw)
    stable_app.mirror = mirror
    cfg = MirrorConfig(
        url="http://shadow:8080", revision="rev2", sample_rate=rate, timeout_s=timeout_ms / 1000
    )
    mirror.configure(cfg)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=stable_app), base_url="http://stable")
    return client, mirror, stable_svc, shadow_svc, transport


def body(text: str) -> dict:
    return {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}]}


def shadow_counts(svc: ModelService) -> dict[str, float]:
    text = svc.metrics.exposition().decode()
    name = "modelserver_shadow_requests_total"
    return {
        r: sample_sum(text, name, shadow_revision="rev2", result=r)
        for r in ("agree", "disagree", "error", "timeout", "dropped")
    }


async def run_requests(client: httpx.AsyncClient, n: int) -> list[dict]:
    docs = []
    for i in range(n):
        r = await client.post("/v2/models/m/infer", json=body(f"request number {i}"))
        assert r.status_code == 200
        docs.append(r.json())
    return docs


async def close(client, mirror, *svcs):
    await client.aclose()
    await mirror.close()
    for s in svcs:
        await s.drain()


async def test_the_same_model_agrees_and_users_only_get_the_stable_answer():
    client, mirror, stable, shadow, transport = await pair("noop://")
    docs = await run_requests(client, 20)
    await mirror.drain()
    assert {d["model_version"] for d in docs} == {"1"}
    assert shadow_counts(stable) == {"agree": 20, "disagree": 0, "error": 0, "timeout": 0, "dropped": 0}
    assert len(transport.headers) == 20 and all(h[SHADOW_HEADER] == "1" for h in transport.headers)
    text = stable.metrics.exposition().decode()
    assert sample_values(text, "modelserver_shadow_similarity_count") == [20]
    assert sample_values(text, "modelserver_shadow_active") == [1]
    assert sample_values(text, "modelserver_shadow_active", shadow_revision="rev2", sample_rate="1") == [1]
    await close(client, mirror, stable, shadow)


async def test_a_model_that_answers_fast_200_and_wrong_disagrees():
    client, mirror, stable, shadow, _ = await pair("noop://?skew=1")
    docs = await run_requests(client, 10)
    await mirror.drain()
    assert all(d["model_version"] == "1" for d in docs)
    assert shadow_counts(stable)["disagree"] == 10 and shadow_counts(stable)["agree"] == 0
    await close(client, mirror, stable, shadow)


async def test_shadow_errors_and_timeouts_are_counted_and_users_are_unaffected():
    client, mirror, stable, shadow, _ = await pair("noop://?fail_rate=1")
    docs = await run_requests(client, 5)
    await mirror.drain()
    assert len(docs) == 5 and shadow_counts(stable)["error"] == 5
    await close(client, mirror, stable, shadow)

    client, mirror, stable, shadow, _ = await pair("noop://?delay_ms=300", timeout_ms=50)
    t0 = asyncio.get_running_loop().time()
    docs = await run_requests(client, 4)
    elapsed = asyncio.get_running_loop().time() - t0
    await mirror.drain()
    assert shadow_counts(stable)["timeout"] == 4
    assert elapsed < 1.2, "copies must never delay the user's answers (4 x 300 ms shadow)"
    await close(client, mirror, stable, shadow)


async def test_a_full_queue_drops_copies_and_counts_them():
    client, mirror, stable, shadow, _ = await pair("noop://?delay_ms=200", queue_size=1, concurrency=1)
    await run_requests(client, 6)
    counts_now = shadow_counts(stable)
    assert counts_now["dropped"] >= 3, counts_now
    await mirror.drain()
    counts = shadow_counts(stable)
    assert counts["dropped"] + counts["agree"] == 6
    await close(client, mirror, stable, shadow)


async def test_sample_rate_copies_that_share_of_requests():
    client, mirror, stable, shadow, _ = await pair("noop://", rate=0.25)
    values = iter([0.1, 0.3, 0.2, 0.9] * 5)
    mirror._sample = lambda: next(values)
    await run_requests(client, 20)
    await mirror.drain()
    assert shadow_counts(stable)["agree"] == 10  # 0.1 and 0.2 of every four are below 0.25
    await close(client, mirror, stable, shadow)


async def test_errors_of_the_stable_are_never_copied():
    client, mirror, stable, shadow, transport = await pair("noop://")
    r = await client.post("/v2/models/m/infer", json={"inputs": []})
    assert r.status_code == 400
    await mirror.drain()
    assert transport.headers == []
    await close(client, mirror, stable, shadow)


async def test_requested_outputs_and_binary_answers_are_compared():
    client, mirror, stable, shadow, _ = await pair("noop://?skew=1")
    r = await client.post(
        "/v2/models/m/infer",
        json={**body("a b c"), "outputs": [{"name": "echo", "parameters": {"binary_data": True}}]},
    )
    assert r.status_code == 200
    await mirror.drain()
    assert shadow_counts(stable)["agree"] == 1  # only `echo` was asked for, and it is right
    await close(client, mirror, stable, shadow)


async def test_the_target_file_is_followed_live(tmp_path: Path):
    shadow_app, shadow_svc = await server("2")
    _, stable_svc = await server("1")
    mirror = ShadowMirror("m", stable_svc.metrics, post=Recording(shadow_app), service=SERVICE)
    f = tmp_path / "shadow"
    watch = asyncio.get_running_loop().create_task(mirror.watch(f, period=0.02))
    await asyncio.sleep(0.05)
    assert mirror.config is None  # no file: no shadow
    f.write_text(json.dumps({"revision": "r9", "sampleRate": 0.5}))
    await asyncio.sleep(0.1)
    assert mirror.config is not None and mirror.config.revision == "r9" and mirror.config.sample_rate == 0.5
    assert mirror.config.url == "http://md-r9.team-a.svc.cluster.local:8080"
    f.write_text("{not json")
    await asyncio.sleep(0.1)
    assert mirror.config is None
    f.write_text("")
    await asyncio.sleep(0.1)
    assert mirror.config is None
    assert sample_values(stable_svc.metrics.exposition().decode(), "modelserver_shadow_active") == []
    watch.cancel()
    await mirror.close()
    await stable_svc.drain()
    await shadow_svc.drain()


async def test_a_target_file_missing_for_a_moment_keeps_the_copies_going(tmp_path: Path):
    """The kubelet swaps a downward-API volume atomically, but a reader can meet ENOENT in the swap (the
    old ..data directory removed under it): that is no reason to stop copying."""
    shadow_app, shadow_svc = await server("2")
    _, stable_svc = await server("1")
    mirror = ShadowMirror("m", stable_svc.metrics, post=Recording(shadow_app), service=SERVICE)
    f = tmp_path / "shadow"
    f.write_text(json.dumps({"revision": "r9", "sampleRate": 0.5}))
    watch = asyncio.get_running_loop().create_task(mirror.watch(f, period=0.02))
    await asyncio.sleep(0.1)
    assert mirror.config is not None and mirror.config.revision == "r9"
    f.unlink()
    await asyncio.sleep(0.1)
    assert mirror.config is not None and mirror.config.revision == "r9"
    f.write_text("")  # the annotation removed: the file is there, empty
    await asyncio.sleep(0.1)
    assert mirror.config is None
    watch.cancel()
    await mirror.close()
    await stable_svc.drain()
    await shadow_svc.drain()


@pytest.mark.parametrize(
    ("text", "error", "reason"),
    [
        ('{"sampleRate": 1}', "KeyError", "invalid"),
        ('{"revision": "r", "sampleRate": 2}', "sampleRate", "invalid"),
        ('{"revision": "r", "compare": {"method": "fuzzy"}}', "compare method", "invalid"),
        ("[1]", "JSON object", "invalid"),
        # the file picks a revision, never a host, a port, a path or a scheme
        ('{"revision": "evil.example:80/x"}', "DNS label", "revision"),
        ('{"revision": "r@evil.example"}', "DNS label", "revision"),
        ('{"revision": "R2"}', "DNS label", "revision"),
        ('{"revision": ""}', "DNS label", "revision"),
        ('{"revision": "r-"}', "DNS label", "revision"),
        (json.dumps({"revision": "a" * 64}), "DNS label", "revision"),
        ('{"revision": 7}', "DNS label", "revision"),
        # a url, when given, must be the one the server builds itself
        ('{"url": "http://evil.example:9999", "revision": "r2"}', "not this server's", "url"),
        (
            '{"url": "http://md-r2.team-b.svc.cluster.local:8080", "revision": "r2"}',
            "not this server's",
            "url",
        ),
        ('{"url": 5, "revision": "r2"}', "not this server's", "url"),
    ],
)
def test_bad_targets_are_refused_with_the_reason(text, error, reason):
    with pytest.raises(MirrorConfigError, match=error) as got:
        MirrorConfig.parse(text, SERVICE)
    assert got.value.reason == reason


def test_a_server_given_no_shadow_service_copies_nowhere():
    with pytest.raises(MirrorConfigError, match="no shadow service") as got:
        MirrorConfig.parse('{"revision": "r2"}', "")
    assert got.value.reason == "no_service"


def test_a_full_target_parses():
    cfg = MirrorConfig.parse(
        '{"url": "http://md-abc.team-a.svc.cluster.local:8080/", "revision": "abc", "sampleRate": 0.2,'
        ' "timeoutMs": 750, "compare": {"method": "cosine", "minCosine": 0.95}}',
        SERVICE,
    )
    assert cfg is not None
    assert (cfg.url, cfg.revision, cfg.sample_rate, cfg.timeout_s) == (
        "http://md-abc.team-a.svc.cluster.local:8080",
        "abc",
        0.2,
        0.75,
    )
    assert cfg.compare.method == "cosine" and cfg.compare.min_cosine == 0.95
    assert MirrorConfig.parse("  \n", SERVICE) is None


def test_a_service_without_a_placeholder_is_one_fixed_target():
    cfg = MirrorConfig.parse('{"revision": "r7"}', "http://127.0.0.1:9001/")
    assert cfg is not None and cfg.url == "http://127.0.0.1:9001"


async def test_a_refused_file_is_counted_by_reason_and_copies_nothing(tmp_path: Path):
    _, stable_svc = await server("1")
    sent: list[str] = []

    async def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        sent.append(url)
        return 200, {}, b"{}"

    mirror = ShadowMirror("m", stable_svc.metrics, post=post, service=SERVICE, sample=lambda: 0.0)
    f = tmp_path / "shadow"
    f.write_text(json.dumps({"url": "http://10.0.0.66:9999", "revision": "r2", "sampleRate": 1.0}))
    watch = asyncio.get_running_loop().create_task(mirror.watch(f, period=0.02))
    await asyncio.sleep(0.1)
    assert mirror.config is None
    mirror.offer(b"{}", None, "req-1", {})
    await asyncio.sleep(0.05)
    assert sent == []
    text = stable_svc.metrics.exposition().decode()
    assert sample_values(text, "modelserver_shadow_refused_total", reason="url") == [1.0]
    assert sample_values(text, "modelserver_shadow_active") == []
    watch.cancel()
    await mirror.close()
    await stable_svc.drain()
