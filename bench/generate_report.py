"""bench/results/generate.md from the results of ``make bench-generate`` (bench/generate.py): the table of
every server and client, the ratios of each modelserver engine to the others and to the decode limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: modelserver's engines (``--engine``), as the results name them
ENGINES = ("modelserver-own", "modelserver-manager")
OTHERS = ("transformers-serve", "naive")


def kv_bytes_per_token(model: Path) -> int:
    c = json.loads((model / "config.json").read_text())
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return int(c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * head * 4)


def ratios_of(res: dict[str, Any], name: str) -> dict[str, Any]:
    """Closed-loop ratios of server ``name`` to the others at each concurrency (same run)."""
    out: dict[str, Any] = {}
    for c, s in res.get(name, {}).get("closed", {}).items():
        r: dict[str, Any] = {}
        for other in (*OTHERS, *(e for e in ENGINES if e != name)):
            o = res.get(other, {}).get("closed", {}).get(c)
            if o and o["output_tokens_per_s"]:
                r[f"tokens_per_s_vs_{other}"] = round(s["output_tokens_per_s"] / o["output_tokens_per_s"], 2)
                if o["ttft_p99_s"] and s["ttft_p99_s"]:
                    r[f"ttft_p99_vs_{other}"] = round(s["ttft_p99_s"] / o["ttft_p99_s"], 2)
        lim = res.get("limit_decode_tokens_per_s", {}).get(c)
        if lim:
            r["share_of_limit"] = round(s["output_tokens_per_s"] / lim, 2)
        pre = res.get("limit_with_prefill", {}).get(c)
        if pre and pre["tokens_per_s"]:
            r["share_of_limit_with_prefill"] = round(s["output_tokens_per_s"] / pre["tokens_per_s"], 2)
        out[c] = r
    return out


def _kv(s: dict[str, Any]) -> str:
    kv = s.get("kv_cache_usage")
    return f"{kv['mean']} / {kv['max']}" if kv else "-"


def _rows(res: dict[str, Any], kind: str) -> list[str]:
    lines = []
    for name in (*ENGINES, *OTHERS):
        for level, s in res.get(name, {}).get(kind, {}).items():
            lines.append(
                f"| {name} | {level} | {s['ok']}/{s['requests']} | {s['output_tokens_per_s']} | "
                f"{s['ttft_p50_s']} / {s['ttft_p99_s']} | {s['inter_token_p99_s']} | {_kv(s)} |"
            )
    return lines


def markdown(res: dict[str, Any]) -> str:
    m, cfg = res["machine"], res["config"]
    head = (
        "| server | {} | requests | output tok/s | TTFT p50 / p99 s | inter-token p99 s "
        "| KV cache use mean / max |"
    )
    lines = [
        "# bench-generate",
        "",
        f"Commit {res['commit']}, {res['date']}. {m['cpus']} CPUs ({m['cpu_model']}); every server on CPU "
        f"{m['server_cpu']} with one torch thread; load average before/after {m['loadavg_before']} / "
        f"{m['loadavg_after']}. Model: localcluster.genmodel size bench (25.6 M parameters), greedy; "
        f"KV cache {cfg['kv_cache_tokens']} tokens ({m['kv_cache_budget_mb']} MiB) for every server, "
        f"{cfg['max_batch_tokens']} tokens per step, {cfg['running']} running sequences. KV cache use: "
        "modelserver's `kv_cache_usage_ratio` polled every 0.25 s (own engine: share of slots held; manager: "
        "share of blocks). Written by `make bench-generate` (bench/generate.py).",
        "",
        "Closed loop (`concurrency` clients, each sends its next request when its answer ends):",
        "",
        head.format("concurrency"),
        "|---|---|---|---|---|---|---|",
        *_rows(res, "closed"),
        "",
        "Poisson arrivals (`rate` requests/s, exponential gaps, whatever is still running):",
        "",
        head.format("rate /s"),
        "|---|---|---|---|---|---|---|",
        *_rows(res, "poisson"),
        "",
        "Limit (batched decode alone, tok/s): " + json.dumps(res.get("limit_decode_tokens_per_s")),
        "",
        "Limit with prefill (the closed-loop run's prompts prefilled one forward each, its answers decoded "
        "at the limit; no server): " + json.dumps(res.get("limit_with_prefill")),
        "",
    ]
    for name in ENGINES:
        if name in res:
            lines += [f"Ratios of {name} (closed loop, same run):", "", "```"]
            lines += [json.dumps(res["ratios"].get(name), indent=1), "```", ""]
            lines += [
                f"Overload ({name}):",
                "",
                "```",
                json.dumps(res[name].get("overload"), indent=1),
                "```",
                "",
            ]
    return "\n".join(lines)
