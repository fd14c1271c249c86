"""guidellm (PyPI, 0.8.1) as the load generator against the OpenAI-compatible servers bench.generate compares
(``make bench-generate``): modelserver with its own engine, with transformers' manager, and ``transformers
serve --continuous-batching``, each on one CPU with one torch thread as there.

guidellm is run with its stock request options -- streamed ``/v1/completions`` with
``stream_options: {include_usage, continuous_usage_stats}`` and, for fixed output lengths, ``ignore_eos``
(vLLM's extensions, which every OpenAI-compatible server that load tools are pointed at meets) -- at a
constant rate (or synchronous: one request at a time) for a bounded duration, on its synthetic text of
fixed prompt and output token counts. What it measured (requests successful / errored / incomplete, output
tokens/s, TTFT, inter-token latency, request latency, the errors it saw) goes to
bench/results/gen_guidellm.json with the commit and the machine's load; guidellm's whole report of each run
(every request, some 200 KB) stays in the run's temporary folder, named there.

    python -m bench.gen_guidellm [--servers own,manager,transformers-serve] [--model bench|test]
                                 [--profile constant|synchronous] [--rate 2] [--duration-s 60]

guidellm installs beside the project's pins (``make bench-generate`` installs it, as it does openai and
accelerate for transformers serve).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.generate import Server, modelserver_args, tserve_args
from bench.provenance import provenance
from bench.serving import RESULTS, log

GUIDELLM = "guidellm==0.8.1"
SERVERS = ("own", "manager", "transformers-serve")


def guidellm_args(
    target: str, model: str, tokenizer: Path, out: Path, profile: str, rate: float, seconds: float,
    prompt_tokens: int, output_tokens: int,
) -> list[str]:  # fmt: skip
    """guidellm's command line: its OpenAI HTTP backend on /v1/completions (streamed, its defaults), no
    health probe (it asks for /health, which these servers name differently), a bounded duration."""
    backend = f"kind=openai_http,target={target},model={model},request_format=/v1/completions"
    backend += ",validate_backend=false"
    prof = f"kind={profile}" + (f",rate={rate}" if profile != "synchronous" else "")
    return [
        sys.executable, "-m", "guidellm", "run", "--backend", backend, "--profile", prof,
        "--constraint", f"kind=max_duration,seconds={seconds:g}",
        "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--output", f"kind=json,path={out}", "--disable-console-interactive",
    ]  # fmt: skip


def stat(metric: dict[str, Any], *keys: str) -> float | None:
    """``successful``'s mean / median / a percentile of one of guidellm's metrics, rounded."""
    node: Any = metric.get("successful") or {}
    for k in keys:
        node = (node or {}).get(k)
    return None if node is None else round(float(node), 2)


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of guidellm's JSON report (its one benchmark) that the results file keeps."""
    bench = report["benchmarks"][0]
    m = bench["metrics"]
    errored = bench["requests"].get("errored") or []
    return {
        "requests": m["request_totals"],
        "duration_s": round(float(bench["duration"]), 1),
        "requests_per_s": stat(m["requests_per_second"], "mean"),
        "output_tokens_per_s": stat(m["output_tokens_per_second"], "mean"),
        "output_tokens_per_request_median": stat(m["output_token_count"], "median"),
        "ttft_ms": {q: stat(m["time_to_first_token_ms"], "percentiles", q) for q in ("p50", "p99")},
        "inter_token_ms": {q: stat(m["inter_token_latency_ms"], "percentiles", q) for q in ("p50", "p99")},
        "request_latency_s": {q: stat(m["request_latency"], "percentiles", q) for q in ("p50", "p99")},
        # why requests failed, as guidellm saw it (a refused option shows here as the server's 400)
        "errors": sorted({str((r.get("info") or {}).get("error"))[:300] for r in errored})[:5],
        "warnings": [w.get("code") for w in bench.get("warnings") or []],
    }


def run_one(name: str, model: Path, args: argparse.Namespace, logs: Path, cpu: str) -> dict[str, Any]:
    """One server started, guidellm run against it, the server stopped: the figures."""
    if name == "transformers-serve":
        srv = Server(tserve_args(model, True), name, logs, cpu, "/health")
        served = str(model)  # transformers serve is pinned to the model it was started with, by path
    else:
        srv = Server(modelserver_args(model, name), f"modelserver-{name}", logs, cpu, "/v2/health/ready")
        served = "bench-llama"
    out = logs / f"{name}.json"
    cmd = guidellm_args(
        srv.url, served, model, out, args.profile, args.rate, args.duration_s, args.prompt_tokens,
        args.output_tokens,
    )  # fmt: skip
    try:
        srv.wait()
        t0 = time.monotonic()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration_s + 900, check=False)
        log(f"guidellm against {name}: exit {run.returncode} in {time.monotonic() - t0:.0f} s")
    finally:
        srv.stop()
    if run.returncode != 0 or not out.exists():
        return {"guidellm_exit": run.returncode, "stderr_tail": (run.stderr or run.stdout)[-2000:]}
    return {"guidellm_exit": 0, "report": str(out), **figures(json.loads(out.read_text()))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.gen_guidellm")
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--model", default="bench", choices=("bench", "test"), help="localcluster.genmodel size")
    p.add_argument("--profile", default="constant", choices=("constant", "poisson", "synchronous"))
    p.add_argument("--rate", type=float, default=2.0, help="requests/s (constant, poisson)")
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--out", default=str(RESULTS / "gen_guidellm.json"))
    args = p.parse_args(argv)
    from localcluster import genmodel

    model = genmodel.cached(seed=0, size=args.model)
    cpu = str((os.cpu_count() or 1) - 1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    logs = Path(tempfile.mkdtemp(prefix="bench-guidellm-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    runs = {name: run_one(name, model, args, logs, cpu) for name in args.servers.split(",")}
    doc = {
        "generated": started,
        **provenance(),
        "guidellm": GUIDELLM,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": platform.processor() or platform.machine(),
            "server_cpu": cpu,
            "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "workload": {
            k: getattr(args, k)
            for k in ("model", "profile", "rate", "duration_s", "prompt_tokens", "output_tokens")
        },
        "servers": runs,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    log(f"wrote {args.out}")
    for name, r in runs.items():
        log(f"  {name}: {json.dumps({k: r.get(k) for k in ('requests', 'output_tokens_per_s', 'ttft_ms')})}")
    return (
        0 if all(r.get("guidellm_exit") == 0 and not r["requests"]["errored"] for r in runs.values()) else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
