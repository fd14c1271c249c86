"""Text generation throughput and latency (``make bench-generate``), written to bench/results/generate.json
and generate.md with the commit and the machine's load.

Same model files (localcluster.genmodel ``size="bench"``: a 25.6 M-parameter Llama, random weights, seed 0),
same prompts (token lengths 16-512, output 16-256, both skewed: lognormal, clipped), greedy decoding, the
same clients -- closed loop (``concurrency`` streams at a time, each the next request of one fixed list) and
Poisson arrivals (``RATES`` requests/s, exponential gaps, each request sent as it comes) -- against, in one
run:

* ``modelserver-own`` -- this server's generation path with its own engine (``python -m modelserver --task
  generation --engine own``: modelserver.gen_own_engine, slot-based KV cache);
* ``modelserver-manager`` -- the same server with ``--engine manager``: transformers'
  ContinuousBatchingManager (paged KV cache) behind the same admission (modelserver.gen_engine);
* ``transformers-serve`` -- the library's own server, ``transformers serve --continuous-batching`` with
  the same KV cache (blocks of 32 tokens, ``KV_TOKENS``) and per-step token budget (512);
* ``naive`` -- ``transformers serve`` without continuous batching: ``generate()`` per request;
* ``limit`` -- the model's batched decode step alone, no server: ``generate()`` on a batch of
  ``concurrency`` equal prompts, decode tokens per second (the 64-token run less the 1-token run).
* ``limit with prefill`` -- the work any server must do for the closed-loop run at ``concurrency``, no
  server: its prompts prefilled one forward each (timed), its answers' tokens decoded at the limit; output
  tokens/s of that plain loop, and the share of its time that prefill alone takes (when over 30 %, 70 % of
  the decode-alone limit is out of reach for any server on this workload).

Every server runs on one CPU (``taskset``, one torch thread), the clients on the others. Streams use the
OpenAI ``/v1/completions`` API with ``stream: true``; a client measures TTFT (sent -> first text event),
the gaps between text events (inter-token) and the output tokens of each answer (``usage``, else the
tokenizer's count of the text). Output tokens/s = the answers' tokens / the run's makespan. modelserver's
KV cache use (``modelserver_generation_kv_cache_usage_ratio``) is polled during every run.

Overload (each modelserver engine): 4x more concurrent streams than it admits (running + waiting
sequences): what they got (200, 429 with ``Retry-After``, 503), whether the server lived, its peak RSS
against the KV cache's budget.

Targets (issue 25), at concurrency 32: output tokens/s >= 1.5x transformers-serve and >= 5x naive, TTFT p99
no worse than transformers-serve's; >= 70 % of the limit (also reported: share of the limit with prefill).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from localcluster.promtext import sample_sum

from bench.generate_report import ENGINES, kv_bytes_per_token, markdown, ratios_of
from bench.serving import HOST, RESULTS, Proc, log

CONCURRENCY = (1, 8, 32, 64)
#: Poisson arrivals: requests per second, and requests per rate
RATES, POISSON_REQUESTS = (1.5, 4.0), 40
#: 24576 = 32 running sequences x 768 tokens (the longest request: 512 + 256): the own engine's slots each
#: hold the longest request; every server gets the same cache
KV_TOKENS, PAGE, BATCH_TOKENS, RUNNING, WAITING = 24576, 32, 512, 32, 64


def commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    # bench/results is what the benches write (bench.generate_bound runs after bench.generate has written)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", ".", ":(exclude)bench/results"], capture_output=True, text=True
    ).stdout.strip()
    return res.stdout.strip() + ("-dirty" if dirty else "")


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)), 4) if xs else None


# -- the workload ----------------------------------------------------------------------------------


def workload(tokenizer: Any, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` requests: a prompt of 16-512 tokens (lognormal, median 64) cut from local text, and
    ``max_tokens`` 16-256 (lognormal, median 40)."""
    from localcluster.genmodel import corpus_files

    text = "".join(Path(f).read_text(errors="replace") for f in corpus_files(300_000))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        plen = int(min(512, max(16, rnd.lognormvariate(math.log(64), 0.9))))
        olen = int(min(256, max(16, rnd.lognormvariate(math.log(40), 0.7))))
        start = rnd.randrange(0, len(ids) - plen)
        out.append({"prompt": tokenizer.decode(ids[start : start + plen]), "max_tokens": olen})
    return out


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], count: Any) -> dict[str, Any]:
    sent = time.monotonic()
    rec: dict[str, Any] = {"code": 0, "ttft": None, "gaps": [], "tokens": 0, "retry_after": None}
    last = None
    text = ""
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            rec["code"] = resp.status_code
            rec["retry_after"] = resp.headers.get("retry-after")
            if resp.status_code != 200:
                await resp.aread()
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                if "error" in doc:
                    rec["code"] = -1
                    break
                if doc.get("usage"):
                    rec["tokens"] = int(doc["usage"]["completion_tokens"])
                piece = (doc.get("choices") or [{}])[0].get("text") or ""
                if piece:
                    now = time.monotonic()
                    if last is None:
                        rec["ttft"] = now - sent
                    else:
                        rec["gaps"].append(now - last)
                    last = now
                    text += piece
    except httpx.HTTPError as exc:
        rec["code"], rec["error"] = 0, f"{type(exc).__name__}: {exc}"
    if rec["code"] == 200 and not rec["tokens"]:
        rec["tokens"] = count(text)
    return rec


async def closed_loop(
    url: str, requests: list[dict[str, Any]], concurrency: int, extra: dict[str, Any], count: Any
):
    """Each of ``concurrency`` clients takes the next request of the list until none is left."""
    queue = list(reversed(requests))
    recs: list[dict[str, Any]] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker() -> None:
            while queue:
                r = queue.pop()
                body = {"model": "bench-llama", **r, "temperature": 0, "stream": True, **extra}
                recs.append(await one_stream(client, url, body, count))

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        makespan = time.monotonic() - t0
    return recs, makespan


async def poisson(
    url: str, requests: list[dict[str, Any]], rate: float, extra: dict[str, Any], count: Any, seed: int = 1
):
    """The requests sent at Poisson arrivals of ``rate`` per second (exponential gaps), each as it comes,
    whatever is still running."""
    rnd = random.Random(seed)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:
        t0 = time.monotonic()
        tasks = []
        for r in requests:
            await asyncio.sleep(rnd.expovariate(rate))
            body = {"model": "bench-llama", **r, "temperature": 0, "stream": True, **extra}
            tasks.append(asyncio.create_task(one_stream(client, url, body, count)))
        recs = list(await asyncio.gather(*tasks))
        makespan = time.monotonic() - t0
    return recs, makespan


async def kv_polled(url: str | None, run: Any) -> tuple[Any, dict[str, float] | None]:
    """``run`` (a coroutine) with modelserver's KV cache use polled every 0.25 s: mean and max."""
    if url is None:
        return await run, None
    seen: list[float] = []

    async def poll() -> None:
        async with httpx.AsyncClient(timeout=5) as c:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    text = (await c.get(url + "/metrics")).text
                    seen.append(sample_sum(text, "modelserver_generation_kv_cache_usage_ratio"))
                await asyncio.sleep(0.25)

    task = asyncio.create_task(poll())
    try:
        out = await run
    finally:
        task.cancel()
    kv = {"mean": round(sum(seen) / len(seen), 3), "max": round(max(seen), 3)} if seen else None
    return out, kv


def summary(recs: list[dict[str, Any]], makespan: float) -> dict[str, Any]:
    ok = [r for r in recs if r["code"] == 200]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": len(recs),
        "ok": len(ok),
        "output_tokens": tokens,
        "makespan_s": round(makespan, 2),
        "output_tokens_per_s": round(tokens / makespan, 1),
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "inter_token_p99_s": pct(gaps, 99),
    }


# -- the servers -----------------------------------------------------------------------------------


class Server(Proc):
    """A server process on one CPU with one torch thread; ``ready`` is its health path."""

    def __init__(self, args: list[str], name: str, log_dir: Path, cpu: str, ready: str) -> None:
        os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"})
        super().__init__(args, name, log_dir, cpus=cpu)
        self.ready_path = ready
        self.url = f"http://{HOST}:{self.port}"

    def wait(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} not ready: {self.log_path.read_text()[-2000:]}")

    def rss_peak_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def modelserver_args(model: Path, engine: str) -> list[str]:
    return [
        "-m", "modelserver", "--model-uri", f"file://{model}", "--model-name", "bench-llama",
        "--engine", engine,
        "--task", "generation", "--host", HOST, "--port", "{port}", "--num-threads", "1",
        "--kv-cache-tokens", str(KV_TOKENS), "--kv-page-size", str(PAGE),
        "--max-batch-tokens", str(BATCH_TOKENS), "--max-running-sequences", str(RUNNING),
        "--max-waiting-sequences", str(WAITING), "--max-new-tokens", "512", "--log-level", "warning",
    ]  # fmt: skip


def tserve_args(model: Path, cb: bool) -> list[str]:
    args = ["-m", "transformers.cli.transformers", "serve", str(model), "--device", "cpu",
            "--dtype", "float32", "--host", HOST, "--port", "{port}", "--log-level", "error"]  # fmt: skip
    if cb:
        args += ["--continuous-batching", "--cb-block-size", str(PAGE), "--cb-num-blocks",
                 str(KV_TOKENS // PAGE), "--cb-max-batch-tokens", str(BATCH_TOKENS)]  # fmt: skip
    return args


# -- the limit -------------------------------------------------------------------------------------


def decode_limit(model_dir: Path, batch: int, prompt_tokens: int = 64, new: int = 64) -> float:
    """Decode tokens/s of ``generate()`` on a batch of ``batch`` equal prompts (one thread): the 64-token
    run less the 1-token run (its prefill)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    ids = torch.randint(10, 3000, (batch, prompt_tokens), generator=torch.Generator().manual_seed(0))
    kw = {"do_sample": False, "pad_token_id": model.generation_config.pad_token_id}

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return time.perf_counter() - t0

    timed(2)  # warm-up
    return batch * (new - 1) / (timed(new) - timed(1))


def prefill_seconds(model_dir: Path, prompts: list[list[int]]) -> float:
    """Seconds of one forward over each prompt alone (batch 1, one thread, the last position's logits):
    the prefill any server must do for these prompts, with no server around it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    with torch.inference_mode():
        model(input_ids=torch.tensor([prompts[0]]), use_cache=False, logits_to_keep=1)  # warm-up
        t0 = time.perf_counter()
        for ids in prompts:
            model(input_ids=torch.tensor([ids]), use_cache=False, logits_to_keep=1)
        return time.perf_counter() - t0


def with_prefill(prefill_s: float, answer_tokens: int, decode_tok_s: float) -> dict[str, float]:
    """The plain loop's output tokens/s for a run's work -- its prompts prefilled (``prefill_s``), its
    answers decoded at the decode limit -- and the share of that loop's time spent in prefill."""
    decode_s = answer_tokens / decode_tok_s
    total = prefill_s + decode_s
    return {
        "tokens_per_s": round(answer_tokens / total, 1),
        "prefill_share": round(prefill_s / total, 3),
        "prefill_s": round(prefill_s, 3),
        "decode_s": round(decode_s, 3),
    }


# -- the run ---------------------------------------------------------------------------------------


def slices(levels: tuple[int, ...]) -> dict[str, slice]:
    """Which requests of the workload each run sends: the same for every server, and no prompt twice in
    one server's runs -- transformers' manager caches prompt prefixes (``allow_block_sharing``), so a prompt
    sent again would be prefilled from its cache, and the run would measure that cache, not the engine."""
    out, at = {"warm-up": slice(0, 4)}, 4
    for c in levels:
        n = max(8, min(2 * c, 96))
        out[f"closed {c}"], at = slice(at, at + n), at + n
    for rate in RATES:
        out[f"poisson {rate}"], at = slice(at, at + POISSON_REQUESTS), at + POISSON_REQUESTS
    return out


def run_server(server: Server, requests: list[dict[str, Any]], levels: tuple[int, ...], extra: dict[str, Any],
               count: Any, kv_url: str | None = None, all_levels: tuple[int, ...] = CONCURRENCY
               ) -> dict[str, Any]:  # fmt: skip
    """Closed-loop clients at each of ``levels``, then Poisson arrivals at each rate; the requests of each
    run are those :func:`slices` gives for ``all_levels`` (the same for every server)."""
    server.wait()
    parts = slices(all_levels)
    asyncio.run(closed_loop(server.url, requests[parts["warm-up"]], 2, extra, count))
    out: dict[str, Any] = {"closed": {}, "poisson": {}}
    for c in levels:
        (recs, makespan), kv = asyncio.run(
            kv_polled(kv_url, closed_loop(server.url, requests[parts[f"closed {c}"]], c, extra, count))
        )
        out["closed"][str(c)] = {**summary(recs, makespan), "kv_cache_usage": kv}
        log(f"{server.name} concurrency {c}: {out['closed'][str(c)]}")
    for rate in RATES:
        run = poisson(server.url, requests[parts[f"poisson {rate}"]], rate, extra, count)
        (recs, makespan), kv = asyncio.run(kv_polled(kv_url, run))
        out["poisson"][str(rate)] = {**summary(recs, makespan), "kv_cache_usage": kv}
        log(f"{server.name} Poisson {rate}/s: {out['poisson'][str(rate)]}")
    return out


def overload(server: Server, requests: list[dict[str, Any]], count: Any) -> dict[str, Any]:
    clients = 4 * (RUNNING + WAITING)
    small = [{**r, "max_tokens": 32} for r in (requests * 8)[:clients]]
    recs, makespan = asyncio.run(
        closed_loop(server.url, small, clients, {"stream_options": {"include_usage": True}}, count)
    )
    codes: dict[str, int] = {}
    for r in recs:
        codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
    refused = [r for r in recs if r["code"] in (429, 503)]
    alive = (
        server.proc.poll() is None
        and httpx.get(server.url + "/v2/health/ready", timeout=5).status_code == 200
    )
    return {
        "clients": clients,
        "codes": codes,
        "refused_with_retry_after": sum(1 for r in refused if r["retry_after"]),
        "refused": len(refused),
        "makespan_s": round(makespan, 2),
        "alive_after": alive,
    }


def run_modelserver(
    server: Server, requests: list[dict[str, Any]], levels: tuple[int, ...], count: Any
) -> dict[str, Any]:
    """One modelserver engine: the runs (KV cache use polled), then the overload, then it stops."""
    usage = {"stream_options": {"include_usage": True}}
    try:
        out = run_server(server, requests, levels, usage, count, kv_url=server.url, all_levels=levels)
        idle_rss = server.rss_peak_mb()
        out["overload"] = {
            **overload(server, requests, count),
            "rss_peak_mb_before": round(idle_rss, 1),
            "rss_peak_mb_after": round(server.rss_peak_mb(), 1),
        }
        log(f"{server.name} overload: {out['overload']}")
        return out
    finally:
        server.stop()


def decode_limits(model: Path, levels: tuple[int, ...], cpu: str) -> dict[str, float]:
    """The decode limit at each concurrency, each in a process of its own on the servers' CPU."""
    out = {}
    for c in levels:
        code = (
            "from bench.generate import decode_limit; from pathlib import Path; "
            f"print(decode_limit(Path('{model}'), {c}))"
        )
        run = subprocess.run(
            ["taskset", "-c", cpu, sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        out[str(c)] = round(float(run.stdout.strip().splitlines()[-1]), 1)
        log(f"limit batch {c}: {out[str(c)]} tok/s")
    return out


def prefill_limits(
    model: Path,
    requests: list[dict[str, Any]],
    levels: tuple[int, ...],
    cpu: str,
    tok: Any,
    limit: dict[str, float],
) -> dict[str, dict[str, float]]:
    """ "Limit with prefill" at each concurrency: the closed-loop run's prompts (the same slice the servers
    got) prefilled one by one and its answers (``max_tokens`` each) decoded at that concurrency's decode
    limit, in a process of its own on the servers' CPU: the work any server must do for that run."""
    parts, out = slices(levels), {}
    for c in levels:
        reqs = requests[parts[f"closed {c}"]]
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([tok(r["prompt"], add_special_tokens=False)["input_ids"] for r in reqs], f)
        code = (
            "import json; from bench.generate import prefill_seconds; from pathlib import Path; "
            f"print(prefill_seconds(Path('{model}'), json.load(open('{f.name}'))))"
        )
        run = subprocess.run(
            ["taskset", "-c", cpu, sys.executable, "-c", code], capture_output=True, text=True, check=True
        )
        Path(f.name).unlink()
        seconds = float(run.stdout.strip().splitlines()[-1])
        out[str(c)] = with_prefill(seconds, sum(r["max_tokens"] for r in reqs), limit[str(c)])
        log(f"limit with prefill {c}: {out[str(c)]}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.generate")
    p.add_argument("--levels", default=",".join(map(str, CONCURRENCY)))
    p.add_argument("--engines", default="own,manager", help="modelserver's --engine values to run")
    p.add_argument(
        "--skip-tserve", action="store_true", help="without transformers serve (no openai package)"
    )
    args = p.parse_args(argv)
    levels = tuple(int(x) for x in args.levels.split(","))
    from localcluster import genmodel
    from transformers import AutoTokenizer

    model = genmodel.cached(seed=0, size="bench")
    tok = AutoTokenizer.from_pretrained(model)
    requests = workload(tok, max(s.stop for s in slices(levels).values()))

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False)["input_ids"])

    cpu = str((os.cpu_count() or 1) - 1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    res: dict[str, Any] = {"commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    logs = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    for engine in args.engines.split(","):
        ours = Server(modelserver_args(model, engine), f"modelserver-{engine}", logs, cpu, "/v2/health/ready")
        res[ours.name] = run_modelserver(ours, requests, levels, count)
    if not args.skip_tserve:
        for name, cb, lv in (
            ("transformers-serve", True, levels),
            ("naive", False, tuple(c for c in levels if c <= 32)),
        ):
            srv = Server(tserve_args(model, cb), name, logs, cpu, "/health")
            try:
                # transformers serve is pinned to the model it was started with: it refuses another name
                res[name] = run_server(srv, requests, lv, {"model": str(model)}, count, all_levels=levels)
            finally:
                srv.stop()
    res["limit_decode_tokens_per_s"] = decode_limits(model, levels, cpu)
    res["limit_with_prefill"] = prefill_limits(
        model, requests, levels, cpu, tok, res["limit_decode_tokens_per_s"]
    )
    res["machine"] = {
        "cpus": os.cpu_count(),
        "cpu_model": platform.processor() or platform.machine(),
        "loadavg_before": load_before,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "server_cpu": cpu,
        "kv_cache_budget_mb": round(KV_TOKENS * kv_bytes_per_token(model) / 2**20, 1),
    }
    res["config"] = {
        "kv_cache_tokens": KV_TOKENS,
        "max_batch_tokens": BATCH_TOKENS,
        "running": RUNNING,
        "waiting": WAITING,
        "rates": list(RATES),
        "poisson_requests": POISSON_REQUESTS,
    }
    res["ratios"] = {name: ratios_of(res, name) for name in ENGINES if name in res}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "generate.json").write_text(json.dumps(res, indent=2, sort_keys=True))
    (RESULTS / "generate.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
