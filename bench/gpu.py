"""The server's GPU path on a CUDA machine (``make bench-gpu``), written to bench/results/gpu.{json,md}
with the commit, the device and the machine's load. Without CUDA it says so and exits 2: CI has no GPU,
so this is a measurement run by hand where a GPU is lent, not a test.

1. **Encoders** -- MiniLM's architecture and tokenizer (its real weights when the directory holds them,
   else random weights from its config, seed 0, so the run needs no download) served by two real
   ``python -m modelserver`` processes: ``--device cuda --dtype fp16`` and ``--device cpu`` (fp32). The
   same texts' embeddings from both (cosine), then items/s and latency of each with 32 closed-loop
   clients on short texts (4-24 words) and on the long-tailed mix (8-512 tokens) of ``make bench-serving``.
2. **Generation, the bench Llama in fp32 on CUDA** (localcluster.genmodel ``size="bench"``, 25.6 M
   parameters): 8 prompts of different lengths sent at once, their greedy answers against
   ``model.generate`` one by one on the same GPU (token agreement), then 32 streams.
3. **Generation, a 0.8 B Llama in bf16** (the same tokenizer, random weights): modelserver against
   ``transformers serve --continuous-batching`` (same KV cache, page and step budget), both on the GPU,
   at 8/32/64 concurrent streams of bench/generate.py's skewed workload; the batched decode step alone
   (the limit); overload (4x running + waiting): what clients got, and the GPU memory the server held.

Everything a server answers is counted by status; a failed request is reported, never dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.generate import Server, closed_loop, commit, overload, summary, workload
from bench.serving import HOST, RESULTS, log, make_workloads, minilm_dir
from bench.serving_load import build_request
from bench.serving_load import closed_loop as raw_closed_loop

CPUS: Any = None  # no CPU pinning: the GPU does the work

BIG = {
    "hidden_size": 2048,
    "intermediate_size": 5504,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
}
GEN = {"kv": 65536, "page": 32, "step": 2048, "running": 64, "waiting": 128}
LEVELS = [8, 32, 64]
EXTRA: list[str] = []  # --server-arg: more modelserver arguments for the generation servers
DEVICE = ["cuda"]  # --dry-run-cpu: the same plumbing on the CPU, small sizes (to check the script itself)


# -- models ------------------------------------------------------------------------------------------


def with_weights(src: Path, out: Path, kind: str, overrides: dict[str, Any] | None = None) -> Path:
    """``src``'s config and tokenizer in ``out``; its weights when it has them (and no overrides), else
    random ones from the (overridden) config, seed 0."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "README*"))
    if (src / "model.safetensors").is_file() and not overrides:
        shutil.copy(src / "model.safetensors", out / "model.safetensors")
        return out
    config = AutoConfig.from_pretrained(src, **(overrides or {}))
    torch.manual_seed(0)
    cls = AutoModelForCausalLM if kind == "causal" else AutoModel
    model = cls.from_config(config)
    if overrides and DEVICE[0] == "cuda":
        model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    return out


def gen_source(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from localcluster.genmodel import cached

    return cached(0, "bench")


# -- 1. encoders -------------------------------------------------------------------------------------


def encoder_server(model: Path, device: str, logs: Path) -> Server:
    args = [
        "-m",
        "modelserver",
        "--model-uri",
        f"file://{model}",
        "--model-name",
        "minilm",
        "--host",
        HOST,
        "--port",
        "{port}",
        "--device",
        device,
        "--log-level",
        "warning",
    ]
    if device == "cuda":
        args += ["--dtype", "fp16"]
    if device == "cpu" or DEVICE[0] == "cpu":
        args += ["--num-threads", str(os.cpu_count() or 1)]
    return Server(args, f"encoder-{device}-{len(args)}", logs, CPUS, "/v2/health/ready")


def embed(url: str, texts: list[str]) -> np.ndarray:
    body = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]}
    r = httpx.post(url + "/v2/models/minilm/infer", json=body, timeout=60)
    r.raise_for_status()
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


def encoder_load(port: int, texts: list[str]) -> dict[str, Any]:
    path = "/v2/models/minilm/infer"
    reqs = [
        (
            build_request(
                HOST,
                path,
                orjson.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [t]}]}),
            ),
            1,
        )
        for t in texts
    ]
    res = asyncio.run(raw_closed_loop(HOST, port, reqs, 32, 2.0, 8.0))
    return {
        "items_per_s": round(res.items_per_s, 1),
        "p50_ms": round(res.pct(50) * 1000, 2),
        "p99_ms": round(res.pct(99) * 1000, 2),
        "errors": res.errors,
    }


def encoders(model: Path, logs: Path) -> dict[str, Any]:
    import bench.serving

    bench.serving.minilm_dir = lambda: model  # the texts from this tokenizer (no MiniLM package needed)
    work = make_workloads(0, 600)
    out: dict[str, Any] = {}
    vecs = {}
    for device in (DEVICE[0], "cpu"):
        srv = encoder_server(model, device, logs)
        try:
            srv.wait()
            vecs[device] = embed(srv.url, work["long"][:64])
            out[device] = {name: encoder_load(srv.port, texts) for name, texts in work.items()}
            log(f"encoder {device}: {out[device]}")
        finally:
            srv.stop()
    a, b = vecs[DEVICE[0]], vecs["cpu"]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    out["cosine_fp16_cuda_vs_fp32_cpu"] = {
        "min": round(float(cos.min()), 5),
        "mean": round(float(cos.mean()), 5),
    }
    out["ratios_cuda_vs_cpu"] = {
        k: round(out[DEVICE[0]][k]["items_per_s"] / out["cpu"][k]["items_per_s"], 2) for k in work
    }
    return out


# -- 2. generation, exactness ------------------------------------------------------------------------


def gen_args(model: Path, dtype: str) -> list[str]:
    return [
        "-m",
        "modelserver",
        "--model-uri",
        f"file://{model}",
        "--model-name",
        "bench-llama",
        "--task",
        "generation",
        "--host",
        HOST,
        "--port",
        "{port}",
        "--device",
        DEVICE[0],
        "--dtype",
        dtype,
        "--kv-cache-tokens",
        str(GEN["kv"]),
        "--kv-page-size",
        str(GEN["page"]),
        "--max-batch-tokens",
        str(GEN["step"]),
        "--max-running-sequences",
        str(GEN["running"]),
        "--max-waiting-sequences",
        str(GEN["waiting"]),
        "--max-new-tokens",
        "512",
        "--log-level",
        "warning",
        *EXTRA,
    ]


def reference(model: Path, prompts: list[str], max_tokens: int) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, attn_implementation="sdpa").to(DEVICE[0]).eval()
    out = []
    for p in prompts:
        ids = torch.tensor([tok(p)["input_ids"]], device=DEVICE[0])  # as the server: special tokens
        with torch.no_grad():
            seq = lm.generate(
                ids,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=lm.generation_config.pad_token_id,
            )
        out.append(seq[0, ids.shape[1] :].tolist())
    del lm
    if DEVICE[0] == "cuda":
        torch.cuda.empty_cache()
    return out


def with_codes(recs: list[dict[str, Any]], makespan: float) -> dict[str, Any]:
    """bench/generate.py's summary plus every answer's status (0: the connection failed)."""
    codes: dict[str, int] = {}
    for r in recs:
        codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
    return {**summary(recs, makespan), "codes": codes}


def agreement(a: list[int], b: list[int]) -> float:
    n = min(len(a), len(b))
    same = next((i for i in range(n) if a[i] != b[i]), n)
    return same / max(len(a), len(b), 1)


def exactness(model: Path, logs: Path, requests: list[dict[str, Any]], count: Any) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompts = [r["prompt"] for r in requests[:8]]
    srv = Server(gen_args(model, "fp32"), "gen-fp32", logs, CPUS, "/v2/health/ready")
    try:
        srv.wait()

        async def all_at_once() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(timeout=120) as c:
                rs = await asyncio.gather(
                    *(
                        c.post(
                            srv.url + "/v1/completions",
                            json={"model": "bench-llama", "prompt": p, "max_tokens": 48, "temperature": 0},
                        )
                        for p in prompts
                    )
                )
            return [r.json() for r in rs]

        answers = asyncio.run(all_at_once())
        load = asyncio.run(
            closed_loop(srv.url, requests[:64], 32, {"stream_options": {"include_usage": True}}, count)
        )
    finally:
        srv.stop()
    ref: list[str] = [str(tok.decode(ids, skip_special_tokens=True)) for ids in reference(model, prompts, 48)]
    got: list[str] = [a["choices"][0]["text"] for a in answers]

    def ids(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    shares = [agreement(ids(g), ids(r)) for g, r in zip(got, ref, strict=True)]
    return {
        "prompts": len(prompts),
        "identical_text": sum(g == r for g, r in zip(got, ref, strict=True)),
        "token_agreement": [round(s, 3) for s in shares],
        "streams_32": with_codes(*load),
    }


# -- 3. generation, a bigger model against transformers serve -------------------------------------------


def tserve_args(model: Path) -> list[str]:
    dtype = "bfloat16" if DEVICE[0] == "cuda" else "float32"
    return [
        "-m",
        "transformers.cli.transformers",
        "serve",
        str(model),
        "--device",
        DEVICE[0],
        "--dtype",
        dtype,
        "--host",
        HOST,
        "--port",
        "{port}",
        "--log-level",
        "error",
        "--continuous-batching",
        "--cb-block-size",
        str(GEN["page"]),
        "--cb-num-blocks",
        str(GEN["kv"] // GEN["page"]),
        "--cb-max-batch-tokens",
        str(GEN["step"]),
    ]


def gpu_memory_mb(pid: int) -> float | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split(",") for line in out.strip().splitlines() if "," in line]
    return next((float(m) for p, m in rows if int(p) == pid), None)


def levels(srv: Server, requests: list[dict[str, Any]], extra: dict[str, Any], count: Any) -> dict[str, Any]:
    srv.wait()
    asyncio.run(closed_loop(srv.url, requests[:4], 2, extra, count))  # warm-up
    out = {}
    for c in LEVELS:
        out[str(c)] = with_codes(*asyncio.run(closed_loop(srv.url, requests[: 3 * c], c, extra, count)))
        log(f"{srv.name} {c}: {out[str(c)]}")
    return out


def decode_limit(model: Path, batch: int, new: int = 64) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    dev = DEVICE[0]
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation="sdpa").to(dev)
    ids = torch.randint(10, 3000, (batch, 64), generator=torch.Generator().manual_seed(0)).to(dev)

    def timed(n: int) -> float:
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            lm.generate(
                ids,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=lm.generation_config.pad_token_id,
            )
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(2)
    return batch * (new - 1) / (timed(new) - timed(1))


def big_model(
    model: Path, logs: Path, requests: list[dict[str, Any]], count: Any, peers: bool
) -> dict[str, Any]:
    usage = {"stream_options": {"include_usage": True}}
    out: dict[str, Any] = {}
    ours = Server(gen_args(model, "bf16"), "gen-bf16", logs, CPUS, "/v2/health/ready")
    try:
        out["modelserver"] = levels(ours, requests, usage, count)
        out["overload"] = overload(ours, requests, count)
        out["gpu_memory_mb_after_overload"] = gpu_memory_mb(ours.proc.pid)
    finally:
        ours.stop()
    if peers:
        peer = Server(tserve_args(model), "transformers-serve", logs, CPUS, "/health")
        try:
            out["transformers-serve"] = levels(peer, requests, {"model": str(model)}, count)
        except (RuntimeError, TimeoutError) as exc:
            out["transformers-serve"] = {"error": str(exc)[-500:]}
        finally:
            peer.stop()
    out["limit_decode_tokens_per_s"] = {}
    for c in LEVELS:  # one model at a time on the GPU
        out["limit_decode_tokens_per_s"][str(c)] = round(decode_limit(model, c), 1)
        gc.collect()
    ref = out.get("transformers-serve", {})
    out["ratios"] = {
        c: {
            "vs_transformers_serve": round(s["output_tokens_per_s"] / ref[c]["output_tokens_per_s"], 2)
            if c in ref
            else None,
            "share_of_limit": round(s["output_tokens_per_s"] / out["limit_decode_tokens_per_s"][c], 2),
        }
        for c, s in out["modelserver"].items()
    }
    return out


# -- 4. where a decode step's time goes ---------------------------------------------------------------


def step_probe(model: Path, batch: int = 32) -> dict[str, Any]:
    """The device's launch cost (a 1-element add, synchronized after 2000) and one decode forward of
    ``model`` at ``batch`` (64-token prompts, DynamicCache): wall ms, and how many GPU kernels it ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    x = torch.zeros(1, device="cuda")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(2000):
        x.add_(1)
    torch.cuda.synchronize()
    launch_us = (time.perf_counter() - t0) / 2000 * 1e6
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, attn_implementation="sdpa").to(
        "cuda"
    )
    ids = torch.randint(10, 3000, (batch, 64), device="cuda")
    with torch.no_grad():
        out = lm(ids, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = lm(nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            lm(nxt, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(getattr(e, "device_time", 0) or getattr(e, "cuda_time", 0) for e in kernels) / 1000
    return {
        "launch_us": round(launch_us, 1),
        "decode_forward_ms": round(1000 * float(np.median(times[5:])), 2),
        "kernels_per_forward": len(kernels),
        "gpu_busy_ms_per_forward": round(gpu_ms, 2),
        "batch": batch,
    }


# -- the report ----------------------------------------------------------------------------------------


def markdown(res: dict[str, Any]) -> str:
    m, enc = res["machine"], res.get("encoders", {})
    lines = [
        f"# bench-gpu\n\nCommit {res['commit']}, {res['date']}. {m.get('gpu')} (torch {m['torch']}, CUDA "
        f"{m['cuda']}), {m['cpus']} CPUs; load average before/after {m['loadavg']} / "
        f"{m.get('loadavg_after')}. "
        "Written by `make bench-gpu` (bench/gpu.py).\n",
        "## Encoders (MiniLM architecture, 32 clients)\n",
        "| server | short items/s | short p50 / p99 ms | long items/s | long p50 / p99 ms | errors |",
        "|---|---|---|---|---|---|",
    ]
    for dev in ("cuda", "cpu"):
        if dev in enc:
            s, lg = enc[dev]["short"], enc[dev]["long"]
            lines.append(
                f"| {dev} | {s['items_per_s']} | {s['p50_ms']} / {s['p99_ms']} | {lg['items_per_s']} | "
                f"{lg['p50_ms']} / {lg['p99_ms']} | {s['errors'] or lg['errors'] or 0} |"
            )
    lines.append(
        f"\nEmbeddings fp16 CUDA vs fp32 CPU, cosine: {enc.get('cosine_fp16_cuda_vs_fp32_cpu')}; "
        f"CUDA/CPU throughput: {enc.get('ratios_cuda_vs_cpu')}.\n"
    )
    ex = res.get("generation_exactness_fp32", {})
    lines.append(
        f"## Generation, bench Llama fp32 on the GPU\n\nGreedy answers identical to `generate()`: "
        f"{ex.get('identical_text')}/{ex.get('prompts')} (token agreement {ex.get('token_agreement')}); "
        f"32 streams: {ex.get('streams_32')}.\n"
    )
    big = res.get("generation_big_bf16", {})
    lines += [
        "## Generation, 0.8 B Llama bf16\n",
        "| server | streams | ok/requests | output tok/s | TTFT p50 / p99 s | inter-token p99 s |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("modelserver", "transformers-serve"):
        for c, r in (big.get(name) or {}).items():
            if isinstance(r, dict) and "ok" in r:
                lines.append(
                    f"| {name} | {c} | {r['ok']}/{r['requests']} | {r['output_tokens_per_s']} | "
                    f"{r['ttft_p50_s']} / {r['ttft_p99_s']} | {r['inter_token_p99_s']} |"
                )
    lines.append(
        f"\nLimit (batched decode alone, tok/s): {big.get('limit_decode_tokens_per_s')}. Ratios: "
        f"{big.get('ratios')}. Overload: {big.get('overload')}; GPU memory after it: "
        f"{big.get('gpu_memory_mb_after_overload')} MiB.\n"
    )
    lines.append(f"Decode step probe (0.8 B, bf16): {res.get('decode_step_probe')}.\n")
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------------------------


def device_facts() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": gpu,
        "device": DEVICE[0],
        "cpus": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minilm", help="MiniLM directory (config and tokenizer; weights optional)")
    ap.add_argument("--genmodel", help="the bench Llama's directory (config and tokenizer; weights optional)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where gpu.json and gpu.md go")
    ap.add_argument("--skip-peers", action="store_true", help="no transformers serve")
    ap.add_argument(
        "--parts", default="encoders,exactness,big,probe", help="which of encoders,exactness,big,probe to run"
    )
    ap.add_argument(
        "--server-arg", action="append", default=[], help="one more modelserver argument (generation)"
    )
    ap.add_argument("--dry-run-cpu", action="store_true", help="check the script on a CPU: small sizes")
    args = ap.parse_args(argv)
    import torch

    if args.dry_run_cpu:
        DEVICE[0], LEVELS[:] = "cpu", [2]
        BIG.update(
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        GEN.update(kv=8192, step=256, running=8, waiting=32)
    elif not torch.cuda.is_available():
        print("bench-gpu: no CUDA device here; run it where a GPU is", file=sys.stderr)
        return 2
    res: dict[str, Any] = {
        "commit": os.environ.get("BENCH_COMMIT") or commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": device_facts(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root, logs = Path(tmp), Path(tmp) / "logs"
        logs.mkdir()
        try:
            EXTRA[:] = args.server_arg
            if "encoders" in args.parts:
                minilm = with_weights(
                    Path(args.minilm) if args.minilm else minilm_dir(), root / "minilm", "encoder"
                )
                res["encoders"] = encoders(minilm, logs)
                log(f"encoders: {res['encoders']}")
            small = with_weights(gen_source(args.genmodel), root / "llama-bench", "causal")
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(small)
            requests = workload(tok, 256)

            def count(text: str) -> int:
                return len(tok(text, add_special_tokens=False)["input_ids"])

            if "exactness" in args.parts:
                res["generation_exactness_fp32"] = exactness(small, logs, requests, count)
                log(f"exactness: {res['generation_exactness_fp32']}")
            if "big" in args.parts:
                big = with_weights(small, root / "llama-big", "causal", BIG)
                res["generation_big_bf16"] = big_model(big, logs, requests, count, not args.skip_peers)
            if "probe" in args.parts and DEVICE[0] == "cuda":
                big = root / "llama-big"
                if not big.is_dir():
                    big = with_weights(small, big, "causal", BIG)
                try:
                    res["decode_step_probe"] = step_probe(big)
                except Exception as exc:  # a probe that fails is reported, the run's results are kept
                    res["decode_step_probe"] = {"error": f"{type(exc).__name__}: {exc}"}
                log(f"probe: {res['decode_step_probe']}")
        finally:
            for f in logs.glob("*.log"):
                print(f"--- {f.name} (tail)\n{f.read_text(errors='replace')[-1500:]}", flush=True)
    res["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.json").write_text(json.dumps(res, indent=2, sort_keys=True))
    (args.out / "gpu.md").write_text(markdown(res))
    print(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
