"""TorchServe 0.12.0 as a peer of modelserver (next to mosec, bench.serving_mosec): the same MiniLM and the
same tokenizing and forward code (modelserver.models.hf, as mosec's ``Embed``), torch with 2 threads, in one
Python backend worker behind TorchServe's Java frontend. Installed for the bench only (Makefile
``bench-serving``).

The settings, the rest TorchServe's defaults:

- the model: ``torch-model-archiver --archive-format no-archive`` into a temporary model store, the handler a
  generated shim that imports ``handle`` (below, TorchServe's function-style entry point); its
  ``model-config.yaml``: ``minWorkers: 1``, ``maxWorkers: 1``, ``batchSize: 16`` (MAX_BATCH),
  ``maxBatchDelay: 10`` (ms, WAIT_MS), ``responseTimeout: 1`` (s: DEADLINE_MS, TorchServe counts it in whole
  seconds; it bounds one batch's time in the worker, which is then killed and restarted, not a request's
  time in the queue). ``clientTimeoutInMills`` (a per-request expiry in the queue) stays 0 (off):
  TorchServe drops an expired request without answering it, which would leave the client's connection
  waiting.
- ``config.properties``: inference, management and metrics addresses on free ports of HOST, nothing else;
  the model loaded at start (``--models minilm=minilm``) with the model API off (the default).
- ``torchserve --start --foreground --ncs --disable-token-auth``; its logs (LOG_LOCATION, METRICS_LOCATION)
  and its pid file and Unix sockets (TMPDIR, TEMP) under ``log_dir/torchserve``; ``job_queue_size`` 100,
  netty threads and the JVM's flags as TorchServe sets them.

Request: POST ``/predictions/minilm`` with JSON ``{"text": "..."}``; answer ``{"embedding": [...]}`` (orjson,
as modelserver's encoder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.serving import HOST, ROOT, free_port, minilm_dir
from bench.serving_load import build_request
from bench.serving_mosec import DEADLINE_MS, MAX_BATCH, THREADS, WAIT_MS, peer_packing

NAME = "minilm"
HANDLER = "ts_minilm_handler"
#: DEADLINE_MS in TorchServe's whole seconds: a batch longer than this in the worker gets the worker killed
#: and restarted (seconds of errors), so a machine busy with other work can trip it
RESPONSE_TIMEOUT_S = max(1, round(DEADLINE_MS / 1000))
_STATE: dict[str, Any] = {}  # the worker's model, loaded by handle(None, context)


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[bytes] | None:
    """TorchServe's entry point in its backend worker: ``handle(None, context)`` once to load the model, then
    a batch of up to MAX_BATCH requests per call (one answer each)."""
    if data is None:
        import torch
        from modelserver.models.hf import HFModel

        torch.set_num_threads(THREADS)
        model = HFModel(minilm_dir(), packing=peer_packing())
        model.load()
        _STATE["model"] = model
        return None
    import numpy as np

    model = _STATE["model"]
    texts = np.array([_text(d) for d in data], dtype=object)
    prepared = model.preprocess({"text": texts})
    out = model.predict([p.payload for p in prepared])
    for i in range(len(data)):
        context.set_response_content_type(i, "application/json")
    return [orjson.dumps({"embedding": o["embedding"].tolist()}) for o in out]


def _text(request: dict[str, Any]) -> str:
    """The text of one request: TorchServe hands a JSON body over decoded (a dict), other bodies as bytes."""
    body = request.get("body") if request.get("body") is not None else request.get("data")
    if isinstance(body, bytes | bytearray):
        body = orjson.loads(body)
    return str(body["text"])  # type: ignore[index]


def requests_for_torchserve(texts: list[str]) -> list[tuple[bytes, int]]:
    return [(build_request(HOST, f"/predictions/{NAME}", orjson.dumps({"text": t})), 1) for t in texts]


def model_config() -> str:
    return (
        f"minWorkers: 1\nmaxWorkers: 1\nbatchSize: {MAX_BATCH}\nmaxBatchDelay: {WAIT_MS}\n"
        f"responseTimeout: {RESPONSE_TIMEOUT_S}\n"
    )


def make_model_store(home: Path) -> Path:
    """``home/model-store/minilm``: the handler shim and the model config, archived as a directory."""
    src, store = home / "src", home / "model-store"
    src.mkdir(parents=True)
    store.mkdir()
    shim = src / f"{HANDLER}.py"
    shim.write_text(
        f"import sys\n\nsys.path.insert(0, {str(ROOT)!r})\n"
        "from bench.serving_torchserve import handle  # noqa: E402, F401\n"
    )
    (src / "model-config.yaml").write_text(model_config())
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    cmd = [str(archiver), "--model-name", NAME, "--version", "1.0", "--handler", str(shim)]
    cmd += ["--config-file", str(src / "model-config.yaml"), "--export-path", str(store)]
    cmd += ["--archive-format", "no-archive"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=home)
    return store


def distinct_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        if (p := free_port()) not in ports:
            ports.append(p)
    return ports


@contextlib.contextmanager
def torchserve_server(log_dir: Path) -> Iterator[tuple[int, int]]:
    """TorchServe with the model on free ports, its output in ``log_dir/torchserve.log`` and its logs under
    ``log_dir/torchserve/logs``: (inference port, pid of the ``torchserve --foreground`` launcher, whose
    process tree holds the Java frontend and the Python worker) once a prediction answers 200; the whole
    tree stopped on the way out."""
    home = log_dir / "torchserve"
    tmp = home / "tmp"
    tmp.mkdir(parents=True)
    store = make_model_store(home)
    port, mgmt, metrics = distinct_ports(3)
    conf = home / "config.properties"
    conf.write_text(
        f"inference_address=http://{HOST}:{port}\nmanagement_address=http://{HOST}:{mgmt}\n"
        f"metrics_address=http://{HOST}:{metrics}\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp)}
    env |= {"LOG_LOCATION": str(home / "logs"), "METRICS_LOCATION": str(home / "logs")}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), env.get("PYTHONPATH", "")) if x)
    cmd = [sys.executable, "-m", "ts.model_server", "--start", "--foreground", "--ncs"]
    cmd += ["--disable-token-auth", "--model-store", str(store), "--ts-config", str(conf)]
    cmd += ["--models", f"{NAME}={NAME}"]
    with (log_dir / "torchserve.log").open("wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, cwd=home, env=env, start_new_session=True
        )
        try:
            wait_torchserve(port, proc)
            yield port, proc.pid
        finally:
            stop_tree(proc)


def wait_torchserve(port: int, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"torchserve exited ({proc.returncode})")
        with contextlib.suppress(httpx.HTTPError):
            url = f"http://{HOST}:{port}/predictions/{NAME}"
            if httpx.post(url, json={"text": "warm"}, timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError("torchserve not ready")


def stop_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the Java frontend (as ``torchserve --stop`` does: it stops its workers), then to whatever
    of the tree is left; SIGKILL after 30 s; last, SIGKILL to the process group (the launcher's session)."""
    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    java = [p for p in tree if p.pid != proc.pid and "java" in _name(p)]
    for p in java or tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    psutil.wait_procs(java or tree, timeout=30)
    for p in tree:  # the launcher leaves with Java; a worker left behind gets the same signal
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(tree, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""
