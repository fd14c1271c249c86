"""A shortened soak of one generation server (bench/gen_soak.py; ``make bench-chaos`` runs it for 10 minutes):
honest and hostile traffic at once -- cut streams, cut non-streamed requests, stalled readers, 80 MiB bodies,
four 20,000-character stops, priority 1 from clients, top_p 1e-46, bursts of 4x the server's places -- then
every honest request answered whole or refused with Retry-After, the running / waiting / KV-cache gauges back
to 0, RSS within 10 % of its value after warm-up, no 5xx. ``GEN_SOAK_S`` sets the duration (default 60 s)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import GEN_MODEL, ServerProcess, gen_metric, start_gen_server

from bench.gen_soak import SoakConfig, logged_errors, soak

SOAK_S = float(os.environ.get("GEN_SOAK_S", "60"))
CONFIG = SoakConfig(duration_s=SOAK_S, request_timeout_s=30.0, burst_every_s=15.0, huge_every_s=12.0)


@pytest.fixture(scope="module")
def soak_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_gen_server(tmp_path_factory.mktemp("gen-soak") / "server.log", CONFIG.server_args())
    try:
        yield srv
    finally:
        srv.stop(timeout=15)


def test_soak_honest_traffic_survives_hostile_traffic(soak_server: ServerProcess, tmp_path: Path) -> None:
    doc = soak(soak_server.url, soak_server.proc.pid, CONFIG)
    (tmp_path / "gen_soak.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    summary = {
        k: doc[k]
        for k in (
            "honest",
            "hostile",
            "honest_lost",
            "gauges_after",
            "rss_mb",
            "server_codes",
            "preemptions",
            "finished",
        )
    }
    print(json.dumps(summary, indent=1, sort_keys=True))
    assert soak_server.proc.poll() is None, "the server died"
    assert doc["honest"].get("honest", {}).get("ok", 0) > 0, "no honest request was answered"
    # what the clients saw of each problem, and what the server logged
    seen = {k: v for k, v in doc["examples"].items() if not k.endswith((": ok", ": refused", ": cut"))}
    detail = (
        json.dumps(seen, indent=1)[:3000]
        + "\n"
        + json.dumps(logged_errors(soak_server.logs()), indent=1)[:2000]
    )
    assert not doc["problems"], "\n".join(doc["problems"]) + "\n" + detail


async def cut_while_running(srv: ServerProcess, body: dict) -> bool:
    """Send a non-streamed request, close its connection once it runs: whether it was cut while running."""
    async with httpx.AsyncClient(timeout=60) as client:
        task = asyncio.create_task(client.post(srv.url + "/v1/completions", json=body))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not task.done():
            if await asyncio.to_thread(gen_metric, srv, "modelserver_generation_requests_running") >= 1:
                task.cancel()  # httpx closes the connection: the client has gone away
                break
            await asyncio.sleep(0.02)
        try:
            await task
        except asyncio.CancelledError:
            return True
        return False


def test_a_cut_non_streamed_request_frees_its_sequence(soak_server: ServerProcess) -> None:
    """A client that gives up on a non-streamed answer: its sequence is cancelled at once (counted as an
    abort), not generated to the end for nobody."""
    srv = soak_server
    probe = {"model": GEN_MODEL, "prompt": "a", "max_tokens": 1, "ignore_eos": True}
    ignore_eos = httpx.post(srv.url + "/v1/completions", json=probe, timeout=30).status_code == 200
    body = {
        "model": GEN_MODEL,
        "prompt": "The licensee may",
        "max_tokens": CONFIG.max_new_tokens,
        "temperature": 0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    for _ in range(3):  # a busy machine may finish the answer before the cut: then try again
        aborts = gen_metric(srv, "modelserver_generation_finished_total", finish_reason="abort")
        tokens = gen_metric(srv, "modelserver_generation_tokens_total")
        if asyncio.run(cut_while_running(srv, body)):
            break
    else:
        pytest.fail("the answer always came before the cut")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and gen_metric(srv, "modelserver_generation_requests_running") > 0:
        time.sleep(0.05)
    assert gen_metric(srv, "modelserver_generation_requests_running") == 0
    assert gen_metric(srv, "modelserver_generation_finished_total", finish_reason="abort") == aborts + 1
    assert gen_metric(srv, "modelserver_generation_tokens_total") - tokens < CONFIG.max_new_tokens
