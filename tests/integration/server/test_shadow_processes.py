"""Shadow copies between real server processes (the noop model): the stable server follows its shadow
file, copies over its real HTTP client (aiohttp) and counts what it compared; its users only ever get
its own answers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from conftest import ServerProcess
from localcluster.promtext import sample_sum

RESULTS = ("agree", "disagree", "error", "timeout", "dropped")


def counts(stable: ServerProcess, revision: str) -> dict[str, float]:
    text = httpx.get(stable.url + "/metrics", timeout=5).text
    return {
        r: sample_sum(text, "modelserver_shadow_requests_total", shadow_revision=revision, result=r)
        for r in RESULTS
    }


def active(stable: ServerProcess, revision: str) -> bool:
    text = httpx.get(stable.url + "/metrics", timeout=5).text
    return sample_sum(text, "modelserver_shadow_active", shadow_revision=revision) == 1


def wait(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def infer(stable: ServerProcess, n: int) -> list[str]:
    versions = []
    with httpx.Client(base_url=stable.url, timeout=10) as c:
        for i in range(n):
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [f"hello {i}"]}]}
            r = c.post("/v2/models/m/infer", json=body)
            assert r.status_code == 200
            versions.append(r.json()["model_version"])
    return versions


def test_copies_follow_the_file_and_are_compared(tmp_path: Path):
    shadow_file = tmp_path / "shadow"
    good = ServerProcess(["--model-uri", "noop://"], tmp_path / "good.log", version="2")
    wrong = ServerProcess(["--model-uri", "noop://?skew=1"], tmp_path / "wrong.log", version="3")
    stable = ServerProcess(
        ["--model-uri", "noop://", "--shadow-file", str(shadow_file)], tmp_path / "stable.log"
    )
    try:
        for s in (good, wrong, stable):
            s.wait_ready()
        assert infer(stable, 5) == ["1"] * 5 and counts(stable, "r2") == dict.fromkeys(RESULTS, 0.0)

        shadow_file.write_text(json.dumps({"url": good.url, "revision": "r2", "sampleRate": 1.0}))
        wait(lambda: active(stable, "r2"))
        assert infer(stable, 30) == ["1"] * 30
        wait(lambda: counts(stable, "r2")["agree"] == 30)
        assert counts(stable, "r2")["disagree"] == 0

        shadow_file.write_text(json.dumps({"url": wrong.url, "revision": "r3", "sampleRate": 1.0}))
        wait(lambda: active(stable, "r3") and not active(stable, "r2"))
        assert infer(stable, 20) == ["1"] * 20
        wait(lambda: counts(stable, "r3")["disagree"] == 20)

        wrong.stop()  # nothing listens there any more: errors, never a failed user request
        assert infer(stable, 10) == ["1"] * 10
        wait(lambda: counts(stable, "r3")["error"] == 10)

        shadow_file.write_text("")
        wait(lambda: not active(stable, "r3"))
        infer(stable, 5)
        time.sleep(0.5)
        assert counts(stable, "r3")["disagree"] + counts(stable, "r3")["error"] == 30  # no more copies
        assert "shadow disagrees" in stable.logs()
    finally:
        for s in (good, wrong, stable):
            s.stop()
