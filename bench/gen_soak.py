"""A soak of one generation server (own engine, the tiny Llama): honest and hostile traffic at once, for a set
duration, then the server's state afterwards.

Honest clients (closed loop, greedy, streamed and not, with ``ignore_eos`` where the server takes it so that
each answer's length is exact) and every few seconds a burst of 4x more clients than the server has places
(running + waiting). Beside them, hostile clients: streams cut after two events, non-streamed requests whose
client goes away before the answer, stalled readers (a stream not read for seconds, then cut), 80 MiB bodies,
four stops of 20,000 characters, priority 1 (the highest) from clients, ``top_p`` 1e-46 (0 in float32).

Every request is classified: honest ones must be answered whole (200, full token count, no error event) or
refused with a status (429/503 with ``Retry-After``) -- anything else (another status, a cut or short answer,
an error event, no answer within the timeout) is counted as lost. Afterwards the running and waiting
sequences and the KV cache use (``/metrics``) must return to 0, the server's RSS stay within 10 % of its
value after warm-up, no 5xx be counted, and no sequence be preempted: only the hostile clients' bodies ask
for priority 1, and a body may not raise its request over the others.

    python -m bench.gen_soak [--duration-s 600]     # make bench-chaos: bench/results/gen_soak.json

tests/integration/server/test_gen_soak.py runs it shortened (about a minute) in ``make test``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from localcluster.promtext import sample_sum

from bench.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODEL = "tiny"
PROMPTS = ["The licensee may", "def main():", "Copyright (C) 2007 Free Software", "import os\nimport sys\n"]
#: an honest answer's outcomes; everything else is lost
ANSWERED, REFUSED = "ok", "refused"
GAUGES = {
    "running": "modelserver_generation_requests_running",
    "waiting": "modelserver_generation_requests_waiting",
    "kv_cache": "modelserver_generation_kv_cache_usage_ratio",
}


@dataclass
class SoakConfig:
    duration_s: float = 600.0
    honest_clients: int = 6
    #: the server's places: the overload bursts are 4x running + waiting
    running: int = 8
    waiting: int = 8
    burst_every_s: float = 20.0
    huge_every_s: float = 15.0
    huge_mib: int = 80
    request_timeout_s: float = 60.0
    max_new_tokens: int = 256
    seed: int = 0

    def server_args(self) -> list[str]:
        return ["--kv-cache-tokens", str(self.running * 512), "--max-context-tokens", "512",
                "--max-new-tokens", str(self.max_new_tokens), "--max-running-sequences", str(self.running),
                "--max-waiting-sequences", str(self.waiting), "--drain-timeout-s", "10"]  # fmt: skip


@dataclass
class Tally:
    """Outcomes by kind of client, a few examples of each problem, and honest latencies."""

    honest: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    hostile: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    latency_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, honest: bool, kind: str, outcome: str, detail: str = "") -> None:
        (self.honest if honest else self.hostile)[kind][outcome] += 1
        key = f"{'honest' if honest else 'hostile'} {kind}: {outcome}"
        if detail and len(self.examples[key]) < 3:
            self.examples[key].append(detail[:300])


# -- one request -----------------------------------------------------------------------------------------


def refusal(r: httpx.Response) -> str:
    """A status's outcome: ``refused`` when the server asks to come back (429/503 with Retry-After)."""
    if r.status_code in (429, 503):
        return REFUSED if r.headers.get("retry-after") else f"{r.status_code} without Retry-After"
    return str(r.status_code)


def read_events(lines: list[str]) -> tuple[list[dict[str, Any]], bool]:
    events = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ") and ln != "data: [DONE]"]
    return events, bool(lines) and lines[-1] == "data: [DONE]"


def whole(doc_or_events: Any, want: int | None) -> str:
    """``ok``, or what is wrong with an answer: an error event, no [DONE], a short answer."""
    if isinstance(doc_or_events, tuple):
        events, done = doc_or_events
        if any("error" in e for e in events):
            return "error event"
        if not done:
            return "no [DONE]"
        usage = [e["usage"] for e in events if e.get("usage")]
        reasons = [
            c.get("finish_reason") for e in events for c in e.get("choices") or [] if c.get("finish_reason")
        ]
        tokens, reason = (usage[-1]["completion_tokens"] if usage else None), (reasons or [None])[-1]
    else:
        tokens, reason = (
            doc_or_events["usage"]["completion_tokens"],
            doc_or_events["choices"][0]["finish_reason"],
        )
    if reason not in ("stop", "length"):
        return f"finish_reason {reason}"
    if want is not None and tokens != want:
        return f"short: {tokens} tokens of {want}"
    return ANSWERED


async def honest_one(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], tally: Tally, kind: str, cfg: SoakConfig
) -> None:
    """One honest request, classified; ``max_tokens`` is the exact length when ``ignore_eos`` is set."""
    want = body["max_tokens"] if body.get("ignore_eos") else None
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            if body.get("stream"):
                async with client.stream("POST", url + "/v1/completions", json=body) as r:
                    if r.status_code != 200:
                        await r.aread()
                        tally.add(True, kind, refusal(r), r.text)
                        return
                    lines = [ln async for ln in r.aiter_lines() if ln]
                outcome = whole(read_events(lines), want)
            else:
                r = await client.post(url + "/v1/completions", json=body)
                if r.status_code != 200:
                    tally.add(True, kind, refusal(r), r.text)
                    return
                outcome = whole(r.json(), want)
    except TimeoutError:
        tally.add(True, kind, "hung", f"no whole answer in {cfg.request_timeout_s} s")
        return
    except httpx.HTTPError as e:
        tally.add(True, kind, "cut", f"{type(e).__name__}: {e}")
        return
    tally.add(True, kind, outcome, str(body)[:200])
    if outcome == ANSWERED:
        tally.latency_s[kind].append(time.monotonic() - t0)


def honest_body(
    rnd: random.Random, ignore_eos: bool, stream: bool, max_tokens: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL, "prompt": rnd.choice(PROMPTS), "max_tokens": max_tokens or rnd.randint(8, 48),
        "temperature": 0, "stream": stream,
    }  # fmt: skip
    if stream:
        body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
    return body


# -- hostile requests --------------------------------------------------------------------------------------


async def hostile_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], read: int, stall_s: float
) -> tuple[str, str]:
    """A stream read for ``read`` events (after ``stall_s`` seconds of not reading), then cut."""
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return str(r.status_code), r.text
        await asyncio.sleep(stall_s)
        seen = 0
        async for line in r.aiter_lines():
            seen += line.startswith("data: ")
            if seen >= read:
                return "cut", ""
    return "ended before the cut", ""


async def hostile_once(
    client: httpx.AsyncClient, url: str, kind: str, cfg: SoakConfig, huge: bytes
) -> tuple[str, str]:
    """One hostile request of ``kind``: what came of it (a status, ``cut``, ``ok``) and the answer's text."""
    long = {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": cfg.max_new_tokens, "temperature": 0}
    path = url + "/v1/completions"
    if kind == "cut_stream":
        return await hostile_stream(client, url, {**long, "stream": True}, read=2, stall_s=0.0)
    if kind == "stalled_reader":
        return await hostile_stream(client, url, {**long, "stream": True}, read=1, stall_s=5.0)
    if kind == "cut_request":  # the client gives up before the whole answer and closes its connection
        try:
            r = await asyncio.wait_for(client.post(path, json=long), 0.3)
        except TimeoutError:
            return "cut", ""
        return ("answered before the cut" if r.status_code == 200 else str(r.status_code)), r.text
    if kind == "long_stops":
        body = {**long, "max_tokens": 64, "stop": [c * 20_000 for c in "qxzé"], "stream": True}
        async with client.stream("POST", path, json=body) as r:
            lines = [ln async for ln in r.aiter_lines() if ln]
        text = "\n".join(lines)[-300:]
        return (whole(read_events(lines), None) if r.status_code == 200 else str(r.status_code)), text
    if kind == "huge_body":
        r = await client.post(path, content=huge, headers={"content-type": "application/json"})
    elif kind == "priority_abuse":
        r = await client.post(path, json={**long, "max_tokens": 128, "priority": 1})
    elif kind == "tiny_top_p":
        r = await client.post(
            path, json={**long, "max_tokens": 16, "temperature": 1.0, "top_p": 1e-46, "seed": 7}
        )
    else:
        raise ValueError(kind)
    if r.status_code != 200:
        # under the bursts a place may be refused with Retry-After, like any client's
        return (refusal(r) if kind in ("priority_abuse", "tiny_top_p") else str(r.status_code)), r.text
    return whole(r.json(), None), r.text


#: hostile kinds and the pause between two of one client's requests (seconds)
HOSTILE = {
    "cut_stream": 0.5,
    "cut_request": 0.5,
    "stalled_reader": 2.0,
    "long_stops": 1.0,
    "priority_abuse": 0.2,
    "tiny_top_p": 1.0,
}


async def hostile_classified(
    client: httpx.AsyncClient, url: str, kind: str, cfg: SoakConfig, huge: bytes, tally: Tally
) -> None:
    try:
        async with asyncio.timeout(cfg.request_timeout_s):
            outcome, detail = await hostile_once(client, url, kind, cfg, huge)
    except TimeoutError:
        outcome, detail = "hung", f"no answer in {cfg.request_timeout_s} s"
    except httpx.HTTPError as e:  # a server may close the connection on an oversized body before reading it
        outcome, detail = f"connection closed ({type(e).__name__})", str(e)
    tally.add(False, kind, outcome, detail)


# -- the run -----------------------------------------------------------------------------------------------


async def gauges(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await client.get(url + "/metrics", timeout=10)).text
    return {name: sample_sum(text, series) for name, series in GAUGES.items()}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def settle(
    client: httpx.AsyncClient, url: str, timeout_s: float = 60.0
) -> tuple[dict[str, float], float]:
    """Poll the gauges until running, waiting and KV cache use are all 0 (or ``timeout_s``): the last
    values and how long it took."""
    t0 = time.monotonic()
    now: dict[str, float] = {}
    while time.monotonic() - t0 < timeout_s:
        with contextlib.suppress(httpx.HTTPError):
            now = await gauges(client, url)
            if not any(now.values()):
                break
        await asyncio.sleep(0.25)
    return now, round(time.monotonic() - t0, 2)


async def takes_ignore_eos(client: httpx.AsyncClient, url: str) -> bool:
    body = {"model": MODEL, "prompt": "a", "max_tokens": 1, "ignore_eos": True}
    return (await client.post(url + "/v1/completions", json=body)).status_code == 200


async def traffic(
    url: str, cfg: SoakConfig, tally: Tally, seconds: float, huge: bytes, ignore_eos: bool
) -> None:
    """Honest closed-loop clients, overload bursts and every hostile kind, for ``seconds``."""
    end = time.monotonic() + seconds
    rnd = random.Random(cfg.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(cfg.request_timeout_s, connect=10), limits=limits
    ) as c:

        async def honest(i: int) -> None:
            while time.monotonic() < end:
                await honest_one(
                    c, url, honest_body(rnd, ignore_eos, stream=i % 2 == 0), tally, "honest", cfg
                )

        async def bursts() -> None:
            clients = 4 * (cfg.running + cfg.waiting)
            while time.monotonic() + 5 < end:
                bodies = [honest_body(rnd, ignore_eos, stream=True, max_tokens=16) for _ in range(clients)]
                await asyncio.gather(*(honest_one(c, url, b, tally, "burst", cfg) for b in bodies))
                await asyncio.sleep(min(cfg.burst_every_s, max(0.0, end - time.monotonic())))

        async def hostile(kind: str, pause: float) -> None:
            while time.monotonic() < end:
                await hostile_classified(c, url, kind, cfg, huge, tally)
                await asyncio.sleep(pause)

        async def huge_bodies() -> None:  # one at a time: each is 80 MiB on the wire and in the server
            await asyncio.sleep(min(5.0, seconds / 4))
            while time.monotonic() < end:
                await hostile_classified(c, url, "huge_body", cfg, huge, tally)
                await asyncio.sleep(min(cfg.huge_every_s, max(0.0, end - time.monotonic())))

        jobs = [honest(i) for i in range(cfg.honest_clients)]
        jobs += [bursts(), huge_bodies(), *(hostile(k, p) for k, p in HOSTILE.items())]
        await asyncio.gather(*jobs)


def huge_body(mib: int) -> bytes:
    """A valid request of ``mib`` MiB. The bulk is in ``user`` (a field the server parses but does not
    tokenize): the body's size is what is tested, not the tokenizer's time on 20 M tokens."""
    head = json.dumps({"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 4})[:-1] + ', "user": "'
    return head.encode() + b"a" * (mib * 2**20 - len(head) - 2) + b'"}'


async def soak_async(url: str, pid: int, cfg: SoakConfig) -> dict[str, Any]:
    tally = Tally()
    huge = huge_body(cfg.huge_mib)
    async with httpx.AsyncClient(timeout=30) as c:
        ignore_eos = await takes_ignore_eos(c, url)
    # warm-up: a short round of the same mix, so that RSS after it counts what the allocator keeps anyway
    warm = Tally()
    await traffic(
        url,
        SoakConfig(**{**asdict(cfg), "burst_every_s": 1e9}),
        warm,
        min(10.0, cfg.duration_s / 6),
        huge,
        ignore_eos,
    )
    async with httpx.AsyncClient(timeout=30) as c:
        await settle(c, url)
        rss_warm = rss_mb(pid)
        peak = [rss_warm]

        async def sample_rss() -> None:
            while True:
                peak[0] = max(peak[0], rss_mb(pid))
                await asyncio.sleep(1.0)

        sampler = asyncio.create_task(sample_rss())
        t0 = time.monotonic()
        try:
            await traffic(url, cfg, tally, cfg.duration_s, huge, ignore_eos)
        finally:
            sampler.cancel()
        wall = time.monotonic() - t0
        after, settle_s = await settle(c, url)
        rss_end = rss_mb(pid)
        text = (await c.get(url + "/metrics")).text
    return report(cfg, tally, warm, ignore_eos, wall, after, settle_s, (rss_warm, peak[0], rss_end), text)


def by_label(text: str, sample: str, label: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and label in s.labels:
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q / 100 * len(xs)))], 3)


def problems_of(doc: dict[str, Any]) -> list[str]:
    """What the soak found wrong: each a line. Empty: the server held."""
    out = [f"honest requests lost ({k}): {n}" for k, n in doc["honest_lost"].items()]
    if any(doc["gauges_after"].get(g, 1.0) != 0 for g in GAUGES):
        out.append(f"gauges not back to 0 after {doc['settle_s']} s: {doc['gauges_after']}")
    if doc["rss_mb"]["end"] > 1.10 * doc["rss_mb"]["after_warm_up"]:
        out.append(f"RSS grew over 10 %: {doc['rss_mb']}")
    five = {c: n for c, n in doc["server_codes"].items() if c.startswith("5") and c != "503" and n}
    if five:
        out.append(f"server errors counted by the server: {five}")
    for kind, outcomes in doc["hostile"].items():
        for outcome, n in outcomes.items():
            if outcome == "hung" or outcome.startswith("5"):
                out.append(f"hostile {kind}: {outcome} x{n}")
    huge = {o: n for o, n in doc["hostile"].get("huge_body", {}).items() if o != "413" and "closed" not in o}
    if huge:
        out.append(f"80 MiB bodies not refused with 413: {huge}")
    odd = {o: n for o, n in doc["hostile"].get("tiny_top_p", {}).items() if o not in (ANSWERED, REFUSED)}
    if odd:
        out.append(f"top_p 1e-46 not answered: {odd}")
    if doc["preemptions"]:  # only the hostile clients ask for priority 1; nobody else's may be pushed aside
        out.append(f"a client's body priority 1 preempted others: {doc['preemptions']:g} preemptions")
    if not sum(doc["honest"].get("honest", {}).values()) or not doc["honest"].get("honest", {}).get(ANSWERED):
        out.append("no honest request was answered")
    return out


def report(
    cfg: SoakConfig, tally: Tally, warm: Tally, ignore_eos: bool, wall: float, after: dict[str, float],
    settle_s: float, rss: tuple[float, float, float], metrics: str,
) -> dict[str, Any]:  # fmt: skip
    lost: Counter[str] = Counter()
    for t in (warm, tally):
        for kind, outcomes in t.honest.items():
            for outcome, n in outcomes.items():
                if outcome not in (ANSWERED, REFUSED):
                    lost[f"{kind}: {outcome}"] += n
    doc: dict[str, Any] = {
        "config": asdict(cfg),
        "ignore_eos_taken": ignore_eos,
        "wall_s": round(wall, 1),
        "honest": {k: dict(v) for k, v in tally.honest.items()},
        "hostile": {k: dict(v) for k, v in tally.hostile.items()},
        "warm_up": {"honest": {k: dict(v) for k, v in warm.honest.items()},
                    "hostile": {k: dict(v) for k, v in warm.hostile.items()}},
        "honest_lost": dict(lost),
        "honest_latency_s": {k: {"p50": pct(v, 50), "p99": pct(v, 99), "n": len(v)}
                             for k, v in tally.latency_s.items()},
        "gauges_after": after,
        "settle_s": settle_s,
        "rss_mb": {"after_warm_up": round(rss[0], 1), "peak": round(rss[1], 1), "end": round(rss[2], 1),
                   "growth_pct": round(100 * (rss[2] / rss[0] - 1), 1)},
        "server_codes": by_label(metrics, "modelserver_requests_total", "code"),
        "finished": by_label(metrics, "modelserver_generation_finished_total", "finish_reason"),
        "preemptions": sample_sum(metrics, "modelserver_generation_preemptions_total"),
        "examples": dict(tally.examples) | {f"warm-up {k}": v for k, v in warm.examples.items()},
    }  # fmt: skip
    doc["problems"] = problems_of(doc)
    return doc


def logged_errors(log_text: str) -> dict[str, int]:
    """A server log's error and warning records, by message and the exception's last line."""
    out: Counter[str] = Counter()
    for line in log_text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("level") in ("error", "warning"):
                exc = str(rec.get("exc") or "").strip().splitlines()
                out[f"{str(rec.get('msg', ''))[:100]} | {exc[-1][:200] if exc else ''}"] += 1
    return dict(out.most_common(12))


def soak(url: str, pid: int, cfg: SoakConfig) -> dict[str, Any]:
    """The soak against the server at ``url`` (process ``pid``, for its RSS): the report."""
    return asyncio.run(soak_async(url, pid, cfg))


# -- make bench-chaos --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from localcluster import genmodel

    from bench.serving import Proc, log

    p = argparse.ArgumentParser(prog="bench.gen_soak")
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--out", default=str(RESULTS / "gen_soak.json"))
    args = p.parse_args(argv)
    cfg = SoakConfig(duration_s=args.duration_s)
    model = genmodel.cached(seed=0, size="test")
    load_before = [round(x, 2) for x in os.getloadavg()]
    args_ = ["-m", "modelserver", "--model-uri", f"file://{model}", "--model-name", MODEL, "--engine", "own",
             "--host", "127.0.0.1", "--port", "{port}", "--num-threads", "1", "--log-level", "warning",
             *cfg.server_args()]  # fmt: skip
    srv = Proc(args_, "gen-soak", Path(tempfile.mkdtemp(prefix="bench-gen-soak-")))
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        srv.wait_ready()
        log(f"soak for {cfg.duration_s} s against {srv.name} (log {srv.log_path})")
        doc = soak(f"http://127.0.0.1:{srv.port}", srv.proc.pid, cfg)
        doc["server_alive_after"] = srv.proc.poll() is None
    finally:
        srv.stop()
    doc["server_log_errors"] = logged_errors(srv.log_path.read_text(errors="replace"))
    doc = {
        "generated": started,
        **provenance(),
        "machine": {"cpus": os.cpu_count(), "load_before": load_before,
                    "load_after": [round(x, 2) for x in os.getloadavg()]},
        **doc,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    log(f"wrote {args.out}: {len(doc['problems'])} problems")
    for line in doc["problems"]:
        log(f"  {line}")
    return 1 if doc["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
