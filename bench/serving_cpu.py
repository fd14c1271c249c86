"""Server CPU per request with the no-op model, next to a plain-ASGI floor (part of ``make bench-serving``).

Writes bench/results/serving_cpu.json and serving_cpu.md. Two servers in the same run, under the very same
uvicorn configuration (``modelserver.server.uvicorn_server``: httptools, uvloop, no access log):

* ``modelserver`` -- ``python -m modelserver --model-format noop``: the whole serving path of an infer
  request (FastAPI routing, request id, decoding, admission, the batching queue and worker, encoding,
  metrics) around a model that does nothing;
* ``floor`` -- a trivial plain-ASGI app that reads the body and sends it back: what uvicorn and the HTTP
  parsing cost alone, the floor no Python server on this stack can go under.

The load generator is ``wrk -t1 -c32`` (keep-alive, the same one-text request bench/serving.py's overhead
section sends; a Python raw-socket generator when wrk is missing). With 2 or more CPUs the server is pinned
to the last CPU and the generator to the others, so the server's CPU time is its own. The two servers are
measured in interleaved rounds (rotating order) after a warm-up; the figure is the median over the rounds of
the server's CPU seconds (utime + stime from /proc) divided by the requests answered. Target: modelserver
<= 200 us per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.provenance import provenance
from bench.serving import HOST, NOOP_SERVER, RESULTS, WRK_LUA, Proc, ensure_wrk, log, median
from bench.serving_load import build_request, closed_loop

TARGET_US = 200.0
#: the hand-rolled ASGI server FastAPI replaced (issue #10), measured with this script on the development
#: machine just before the switch (same run as its floor); the issue quoted 133 us from bench/serving.py
HAND_ROLLED = {"date": "2026-12-01", "cpu_us_per_request": 116.5, "floor_us": 34.0, "ratio_vs_floor": 3.43}
INFER_PATH = "/v2/models/noop/infer"
BODY = WRK_LUA.split("'")[1].encode()


# -- the floor ----------------------------------------------------------------------------------------------


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Plain ASGI: answer every request with its own body (health checks get an empty 200)."""
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    more = True
    while more:
        msg = await receive()
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve_echo(port: int) -> int:
    """The floor server: the echo app under modelserver's own uvicorn configuration."""
    import uvloop
    from modelserver.config import Settings
    from modelserver.server import uvicorn_server

    settings = Settings(model_name="echo", model_format="noop", host=HOST, port=port, log_level="warning")
    server = uvicorn_server(echo_app, settings)
    uvloop.run(server.serve())  # type: ignore[attr-defined]
    return 0


# -- measurement --------------------------------------------------------------------------------------------


def cpu_split() -> tuple[str | None, str | None]:
    """(server CPUs, load-generator CPUs) as taskset lists; (None, None) on a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return str(cpus[-1]), ",".join(str(c) for c in cpus[:-1])


def parse_wrk(text: str) -> tuple[int, int, str, str]:
    requests = int(text.split(" requests in ")[0].rsplit("\n", 1)[1].strip())
    non2xx = 0
    for line in text.splitlines():
        if "Non-2xx" in line:
            non2xx = int(line.rsplit(":", 1)[1])
    p50 = next((ln.split()[1] for ln in text.splitlines() if ln.strip().startswith("50%")), "")
    p99 = next((ln.split()[1] for ln in text.splitlines() if ln.strip().startswith("99%")), "")
    return requests, non2xx, p50, p99


def drive(proc: Proc, seconds: float, wrk: str | None, script: Path, gen_cpus: str | None) -> dict[str, Any]:
    """One measured phase against ``proc``: requests, non-2xx, latency, server CPU us per request."""
    pin = ["taskset", "-c", gen_cpus] if gen_cpus else []
    url = f"http://{HOST}:{proc.port}{INFER_PATH}"
    cpu0 = proc.cpu_seconds()
    if wrk:
        res = subprocess.run(
            [*pin, wrk, "-t1", "-c32", f"-d{round(seconds)}s", "--latency", "-s", str(script), url],
            capture_output=True,
            text=True,
            check=False,
        )
        cpu1 = proc.cpu_seconds()
        requests, non2xx, p50, p99 = parse_wrk(res.stdout)
    else:
        reqs = [(build_request(HOST, INFER_PATH, BODY), 1)]
        r = asyncio.run(closed_loop(HOST, proc.port, reqs, 32, 0.0, seconds))
        cpu1 = proc.cpu_seconds()
        requests, non2xx = r.completed, sum(r.errors.values())
        p50, p99 = f"{r.pct(50) * 1000:.2f}ms", f"{r.pct(99) * 1000:.2f}ms"
    cpu = cpu1 - cpu0
    return {
        "requests": requests,
        "non_2xx": non2xx,
        "requests_per_s": round(requests / seconds, 1),
        "server_cpu_s": round(cpu, 3),
        "cpu_us_per_request": round(cpu / max(1, requests) * 1e6, 1),
        "latency_p50": p50,
        "latency_p99": p99,
    }


def markdown(doc: dict[str, Any]) -> str:
    ms, fl = doc["servers"]["modelserver"], doc["servers"]["floor"]
    hr = doc["hand_rolled"]
    lines = [
        "# Server CPU per request (no-op model) vs a plain-ASGI floor",
        "",
        f"{doc['date']}, commit {doc.get('commit', 'not recorded')}; {doc['machine']['cpus']} CPUs"
        f" ({doc['machine']['cpu_model']}), Python"
        f" {doc['machine']['python']}; load average before {doc['machine']['loadavg_before']}."
        f" Generator: {doc['generator']}; server pinned to CPU {doc['pinning']['server'] or '-'},"
        f" generator to {doc['pinning']['generator'] or '-'}. {doc['rounds']} interleaved rounds of"
        f" {doc['seconds']} s per server after a {doc['warmup_s']} s warm-up; medians.",
        "",
        "| server | CPU us / request | rounds (us) | requests/s | p50 | p99 | non-2xx |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in (("modelserver (FastAPI, noop model)", ms), ("floor (plain ASGI echo)", fl)):
        last = s["last_round"]
        lines.append(
            f"| {name} | **{s['cpu_us_per_request']}** | {', '.join(str(x) for x in s['rounds_us'])} |"
            f" {s['requests_per_s']} | {last['latency_p50']} | {last['latency_p99']} | {s['non_2xx']} |"
        )
    met = "met" if doc["target_met"] else "**not met**"
    lines += [
        "",
        f"modelserver / floor: **{doc['ratio_vs_floor']}x**; modelserver - floor:"
        f" {doc['above_floor_us']} us per request.",
        f"Target: modelserver <= {doc['target_us']} us per request: {met}.",
        "",
        f"Before FastAPI (issue #10), the hand-rolled ASGI router measured {hr['cpu_us_per_request']} us with"
        f" this script ({hr['date']}, floor {hr['floor_us']} us in the same run: {hr['ratio_vs_floor']}x).",
        "",
    ]
    return "\n".join(lines)


def measure(
    server_cpus: str | None,
    gen_cpus: str | None,
    wrk: str | None,
    log_dir: Path,
    rounds: int,
    seconds: float,
    warmup: float,
) -> dict[str, Any]:
    """Both servers driven in rotating rounds: per server the median CPU us per request and req/s."""
    script = log_dir / "post.lua"
    script.write_text(WRK_LUA)
    modelserver = list(NOOP_SERVER)
    servers = {
        "modelserver": Proc(modelserver, "modelserver", log_dir, cpus=server_cpus),
        "floor": Proc(
            ["-m", "bench.serving_cpu", "--serve-echo", "{port}"], "floor", log_dir, cpus=server_cpus
        ),
    }
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    try:
        for proc in servers.values():
            proc.wait_ready()
        for proc in servers.values():
            drive(proc, warmup, wrk, script, gen_cpus)
        names = list(servers)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                res = drive(servers[name], seconds, wrk, script, gen_cpus)
                samples[name].append(res)
                log(
                    f"round {r + 1} {name}: {res['cpu_us_per_request']} us CPU/request,"
                    f" {res['requests_per_s']} req/s, non-2xx {res['non_2xx']}"
                )
    finally:
        for proc in servers.values():
            proc.stop()
    summary: dict[str, Any] = {}
    for name, runs in samples.items():
        summary[name] = {
            "cpu_us_per_request": round(median([x["cpu_us_per_request"] for x in runs]), 1),
            "rounds_us": [x["cpu_us_per_request"] for x in runs],
            "requests_per_s": round(median([x["requests_per_s"] for x in runs]), 1),
            "non_2xx": sum(x["non_2xx"] for x in runs),
            "last_round": runs[-1],
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 round of 2 s (smoke run; numbers are noisy)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--serve-echo", type=int, metavar="PORT", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve_echo is not None:
        return serve_echo(a.serve_echo)
    rounds, seconds, warmup = (1, 2.0, 1.0) if a.quick else (a.rounds, a.seconds, 2.0)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serving-cpu-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the servers are stopped
    load_before = [round(x, 2) for x in os.getloadavg()]
    server_cpus, gen_cpus = cpu_split()
    wrk = ensure_wrk()
    summary = measure(server_cpus, gen_cpus, wrk, log_dir, rounds, seconds, warmup)
    ms, fl = summary["modelserver"]["cpu_us_per_request"], summary["floor"]["cpu_us_per_request"]
    cpu_model = ""
    for ln in Path("/proc/cpuinfo").read_text().splitlines():
        if ln.startswith("model name"):
            cpu_model = ln.split(":", 1)[1].strip()
            break
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **provenance(),
        "quick": a.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "cpu_model": cpu_model,
            "python": platform.python_version(),
            "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "generator": "wrk -t1 -c32 (keep-alive, one text per request)"
        if wrk
        else "python asyncio raw-socket generator, 32 connections (wrk not available)",
        "pinning": {"server": server_cpus, "generator": gen_cpus},
        "rounds": rounds,
        "seconds": seconds,
        "warmup_s": warmup,
        "servers": summary,
        "ratio_vs_floor": round(ms / fl, 2) if fl else None,
        "above_floor_us": round(ms - fl, 1),
        "target_us": TARGET_US,
        "target_met": ms <= TARGET_US,
        "hand_rolled": HAND_ROLLED,
    }
    (out_dir / "serving_cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "serving_cpu.md").write_text(markdown(doc))
    log(f"modelserver {ms} us, floor {fl} us CPU/request ({doc['ratio_vs_floor']}x); wrote {out_dir}")
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
