"""Shadow copies between real server processes (the noop model): the stable server follows its shadow
file, copies over its real HTTP client (aiohttp) and counts what it compared; its users only ever get
its own answers."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from conftest import ServerProcess, free_port, wait
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


def infer(stable: ServerProcess, n: int) -> list[str]:
    versions = []
    with httpx.Client(base_url=stable.url, timeout=10) as c:
        for i in range(n):
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [f"hello {i}"]}]}
            r = c.post("/v2/models/m/infer", json=body)
            assert r.status_code == 200
            versions.append(r.json()["model_version"])
    return versions


def refused(stable: ServerProcess, reason: str) -> float:
    text = httpx.get(stable.url + "/metrics", timeout=5).text
    return sample_sum(text, "modelserver_shadow_refused_total", reason=reason)


def test_copies_follow_the_file_and_are_compared(tmp_path: Path):
    # The shadow file picks a revision; the server builds the URL from its --shadow-service. Here the
    # revisions "2" and "3" are two loopback addresses on one port (in a pod: two revision Services).
    port = free_port()
    shadow_file = tmp_path / "shadow"
    good = ServerProcess(
        ["--model-uri", "noop://"], tmp_path / "good.log", version="2", host="127.0.0.2", port=port
    )
    wrong = ServerProcess(
        ["--model-uri", "noop://?skew=1"], tmp_path / "wrong.log", version="3", host="127.0.0.3", port=port
    )
    service = f"http://127.0.0.{{revision}}:{port}"
    stable = ServerProcess(
        ["--model-uri", "noop://", "--shadow-file", str(shadow_file), "--shadow-service", service],
        tmp_path / "stable.log",
    )
    try:
        for s in (good, wrong, stable):
            s.wait_ready()
        assert infer(stable, 5) == ["1"] * 5 and counts(stable, "2") == dict.fromkeys(RESULTS, 0.0)

        shadow_file.write_text(json.dumps({"revision": "2", "sampleRate": 1.0}))
        wait(lambda: active(stable, "2"))
        assert infer(stable, 30) == ["1"] * 30
        wait(lambda: counts(stable, "2")["agree"] == 30)
        assert counts(stable, "2")["disagree"] == 0

        shadow_file.write_text(json.dumps({"url": wrong.url, "revision": "3", "sampleRate": 1.0}))
        wait(lambda: active(stable, "3") and not active(stable, "2"))
        assert infer(stable, 20) == ["1"] * 20
        wait(lambda: counts(stable, "3")["disagree"] == 20)

        wrong.stop()  # nothing listens there any more: errors, never a failed user request
        assert infer(stable, 10) == ["1"] * 10
        wait(lambda: counts(stable, "3")["error"] == 10)

        shadow_file.write_text("")
        wait(lambda: not active(stable, "3"))
        infer(stable, 5)
        time.sleep(0.5)
        assert counts(stable, "3")["disagree"] + counts(stable, "3")["error"] == 30  # no more copies
        assert "shadow disagrees" in stable.logs()
    finally:
        for s in (good, wrong, stable):
            s.stop()


def test_a_shadow_file_naming_any_other_url_is_refused_and_nothing_is_sent(tmp_path: Path):
    """The attack of issue 24, finding 4: whoever may patch a stable pod's annotation points its copies
    (users' request bodies) at a listener of their own. The server refuses the file and sends nothing."""
    collector = socket.create_server(("127.0.0.1", 0))
    collector.settimeout(0.2)
    shadow_file = tmp_path / "shadow"
    stable = ServerProcess(
        [
            "--model-uri",
            "noop://",
            "--shadow-file",
            str(shadow_file),
            "--shadow-service",
            "http://md-{revision}.team-a.svc.cluster.local:8080",
        ],
        tmp_path / "stable.log",
    )
    try:
        stable.wait_ready()
        evil = f"http://127.0.0.1:{collector.getsockname()[1]}"
        shadow_file.write_text(json.dumps({"url": evil, "revision": "r2", "sampleRate": 1.0}))
        wait(lambda: refused(stable, "url") == 1)
        shadow_file.write_text(json.dumps({"revision": f"x@127.0.0.1:{collector.getsockname()[1]}"}))
        wait(lambda: refused(stable, "revision") == 1)
        assert infer(stable, 20) == ["1"] * 20
        time.sleep(0.5)
        with pytest.raises(TimeoutError):
            collector.accept()  # nobody ever connected
        assert not active(stable, "r2")
        assert "refused" in stable.logs()
    finally:
        stable.stop()
        collector.close()
