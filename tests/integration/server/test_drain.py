"""SIGTERM during load: stop admitting (503), finish every accepted request, exit 0.

"Refused at admission" and "accepted then lost" are told apart: a refusal is a 503 whose error is the
drain's own ("server is shutting down") with Retry-After, raised only when the queue admits a request;
anything else (another status, a reset connection) is a lost request, and none is allowed. The queue depth
at SIGTERM is a lower bound on what was accepted, and at least that many requests must come back 200."""

from __future__ import annotations

import asyncio
import time

import httpx
from conftest import ServerProcess, minilm_dir
from localcluster.promtext import sample_sum

N_REQUESTS = 24
TEXTS_PER_REQUEST = 6


def queue_depth(url: str) -> float:
    return sample_sum(httpx.get(url + "/metrics", timeout=30).text, "modelserver_queue_depth")


def is_drain_refusal(r: httpx.Response) -> bool:
    """The drain's admission refusal: 503, Retry-After, the Draining error's own text."""
    if r.status_code != 503 or "retry-after" not in r.headers:
        return False
    try:
        return "shutting down" in r.json().get("error", "")
    except ValueError:
        return False


async def test_sigterm_during_load_loses_no_accepted_request(tmp_path):
    srv = ServerProcess(
        [
            "--model-uri",
            f"file://{minilm_dir()}",
            "--num-threads",
            "1",
            "--warmup",
            "false",
            "--max-batch-size",
            "8",
        ],
        tmp_path / "server.log",
        name="minilm",
    )
    try:
        srv.wait_ready()
        body = {
            "inputs": [
                {
                    "name": "text",
                    "shape": [TEXTS_PER_REQUEST],
                    "datatype": "BYTES",
                    "data": [
                        f"request text number {i} " + "padding words " * 40 for i in range(TEXTS_PER_REQUEST)
                    ],
                }
            ],
            "parameters": {"timeout_ms": 60000},
        }
        async with httpx.AsyncClient(base_url=srv.url, timeout=180) as c:
            inflight = [
                asyncio.ensure_future(c.post("/v2/models/minilm/infer", json=body)) for _ in range(N_REQUESTS)
            ]
            # Wait until the server has accepted a backlog (a condition, not a timing assumption).
            deadline = time.monotonic() + 120
            while (depth := queue_depth(srv.url)) < N_REQUESTS * TEXTS_PER_REQUEST // 2:
                assert time.monotonic() < deadline, "the server never built a queue"
                await asyncio.sleep(0.05)
            srv.terminate()
            # Once the signal is handled the server reports not ready ...
            while (await c.get("/v2/health/ready")).status_code == 200:
                assert time.monotonic() < deadline, "SIGTERM was not handled"
                await asyncio.sleep(0.01)
            # ... and refuses new work with 503 + Retry-After while it finishes the backlog.
            probe = await c.post("/v2/models/minilm/infer", json=body)
            assert probe.status_code == 503, probe.text[:300]
            assert "retry-after" in probe.headers and "shutting down" in probe.json()["error"]
            results = await asyncio.gather(*inflight, return_exceptions=True)
        ok = [r for r in results if isinstance(r, httpx.Response) and r.status_code == 200]
        refused = [r for r in results if isinstance(r, httpx.Response) and is_drain_refusal(r)]
        lost = [r for r in results if not any(r is x for x in ok + refused)]
        # every request was either answered or refused at admission by the drain: none accepted then lost
        assert not lost, [
            r if not isinstance(r, httpx.Response) else (r.status_code, r.text[:200]) for r in lost
        ]
        # what was queued at SIGTERM had been accepted, and came back answered
        queued_requests = int(depth) // TEXTS_PER_REQUEST
        assert queued_requests >= N_REQUESTS // 2 and len(ok) >= queued_requests, (len(ok), depth)
        for r in ok:
            assert r.json()["outputs"][0]["shape"] == [TEXTS_PER_REQUEST, 384]
        rc = srv.proc.wait(120)
        assert rc == 0, srv.logs()[-3000:]
        assert "drained" in srv.logs()
    finally:
        srv.stop()
