"""What iteration-level scheduling can reach on ``make bench-generate``'s closed loop at best: the loop
replayed on the model's own measured step costs, with no server, no HTTP and no scheduling overhead
(``python -m bench.generate_bound``, written to bench/results/generate_bound.{json,md}).

The decode limit (bench.generate) keeps every row busy on short contexts and prefills nothing; the closed
loop does neither: ``concurrency`` clients take the next request of one list, so its prompts (16-512 tokens)
must be prefilled, its contexts grow to 768, and when the list runs dry the rows empty one by one until
the longest answers run alone. This replays that loop step by step -- each step one decode forward for
the running rows, then prefill of newcomers within the step's token budget, as modelserver's own engine
does -- and charges each forward what it measured on this CPU with one thread:

* a decode forward of ``D`` rows whose longest context is ``L``: the own engine's forward
  (modelserver.gen_own_engine, slot cache), timed on a grid of ``D`` x ``L`` and interpolated;
* a prefill chunk of ``n`` tokens: the same engine's prefill forward, timed on a grid of ``n``;
* a step that does both in one forward (as the engine does): the two less what one such forward was
  measured to save (one pass over the weights, ~10 ms at one thread).

Each decode is charged at the running rows' *mean* context: the own engine attends row by row, each
over its own context (modelserver.gen_slots), as a paged-attention kernel does, so its step costs what the
grid's step of that many rows at that mean context costs. Nothing a server adds (HTTP, tokenizing,
streaming, the event loop, waiting for a client's next request) costs anything here: the replay's output
tokens/s is what no first-come-first-served continuous-batching server running this model's forward can
beat on this workload, so a target above it is out of reach here, whatever the server does; a server's
share of it is what its own overhead costs.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.generate import BATCH_TOKENS, KV_TOKENS, RUNNING, commit, slices, workload
from bench.serving import RESULTS

ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64)
CONTEXTS = (32, 128, 256, 512, 768)
CHUNKS = (16, 32, 64, 128, 256, 384, 512)
#: (rows, chunk tokens) of the fused forwards measured (rows at context 256)
FUSED = ((1, 16), (8, 128), (32, 16), (32, 128), (32, 448))


def _interp(xs: tuple[int, ...], ys: list[float], x: float) -> float:
    """Piecewise-linear in ``x`` over the grid (extrapolated from the end segments)."""
    i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class StepCosts:
    """Seconds per forward, measured: ``decode[r][c]`` for ``ROWS[r]`` rows at context ``CONTEXTS[c]``,
    ``prefill[k]`` for a chunk of ``CHUNKS[k]`` tokens; ``shared``: what one forward that decodes the rows
    and prefills a chunk saves against the two apart (the median over :data:`FUSED`, measured)."""

    decode: list[list[float]]
    prefill: list[float]
    shared: float = 0.0

    def step_s(self, rows: int, context: float, chunk_tokens: int) -> float:
        """A step: the rows' decode and the chunks' prefill in one forward (either may be absent)."""
        if not chunk_tokens:
            return self.decode_s(rows, context) if rows else 0.0
        if not rows:
            return self.prefill_s(chunk_tokens)
        return self.decode_s(rows, context) + self.prefill_s(chunk_tokens) - self.shared

    def decode_s(self, rows: int, context: float) -> float:
        by_rows = [_interp(CONTEXTS, self.decode[r], context) for r in range(len(ROWS))]
        return _interp(ROWS, by_rows, rows)

    def prefill_s(self, tokens: int) -> float:
        return _interp(CHUNKS, self.prefill, tokens)


def measure(model_dir: Path, repeats: int = 5) -> StepCosts:
    """The own engine's forwards on ``model_dir``, one thread: the median of ``repeats`` per grid point."""
    import torch
    from modelserver.gen_own_engine import OwnEngine, Sequence
    from modelserver.gen_sampling import RowSampling
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = OwnEngine(model, kv_cache_tokens=max(ROWS) * max(CONTEXTS), max_batch_tokens=BATCH_TOKENS,
                       max_sequences=max(ROWS), max_context=max(CONTEXTS))  # fmt: skip
    greedy = RowSampling.of(True, 0.0, 1, 1.0, None)

    def timed(fn: Any) -> float:
        fn()  # warm-up
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)

    decode: list[list[float]] = []
    with torch.inference_mode():
        for rows in ROWS:
            line = []
            for ctx in CONTEXTS:
                seqs = [Sequence(str(i), [5] * ctx, ctx - 1, 10**6, frozenset(), greedy) for i in range(rows)]

                def one(seqs: list[Sequence] = seqs, ctx: int = ctx) -> None:
                    for s in seqs:
                        s.cached, s.tokens = ctx - 1, s.tokens[:ctx]
                    engine.decoding = seqs
                    engine._decode()

                line.append(timed(one))
            decode.append(line)
        engine.decoding = []
        prefill = []
        for n in CHUNKS:

            def chunk(n: int = n) -> None:
                seq = Sequence("p", [7] * n, n, 1, frozenset(), greedy)
                engine.prefilling = seq
                engine._prefill([(seq, n)])
                engine.decoding = []

            prefill.append(timed(chunk))
        saved = []
        for rows, n in FUSED:
            seqs = [Sequence(str(i), [5] * 256, 255, 10**6, frozenset(), greedy) for i in range(rows)]

            def fused(seqs: list[Sequence] = seqs, n: int = n) -> None:
                for s in seqs:
                    s.cached, s.tokens = 255, s.tokens[:256]
                engine.decoding = list(seqs)
                engine._prefill([(Sequence("p", [7] * n, n, 1, frozenset(), greedy), n)])

            both = timed(fused)
            apart = _interp(CONTEXTS, decode[ROWS.index(rows)], 256) + _interp(CHUNKS, prefill, n)
            saved.append(apart - both)
        engine.decoding = []
    return StepCosts(decode, prefill, statistics.median(saved))


@dataclass
class _Running:
    prompt: int
    answer: int  # tokens to generate
    cached: int = 0
    made: int = 0


def replay(
    costs: StepCosts,
    requests: list[tuple[int, int]],
    concurrency: int,
    *,
    budget: int = BATCH_TOKENS,
) -> dict[str, float]:
    """The closed loop on ``requests`` (prompt tokens, answer tokens) at ``concurrency``, step by step as
    the own engine schedules it (newcomers' prompts in chunks within ``budget`` less the decode rows, the
    rows' decode and all of a step's chunks one forward; at most ``RUNNING`` rows), each step charged by
    :meth:`StepCosts.step_s` at the rows' mean context and its chunks' total tokens."""
    todo = list(reversed(requests))
    waiting: list[_Running] = []
    rows: list[_Running] = []
    prefilling: _Running | None = None
    clock = prefill_s = 0.0
    made = held = steps = 0
    while todo or waiting or rows or prefilling:
        while todo and len(waiting) + len(rows) + (prefilling is not None) < concurrency:
            p, a = todo.pop()
            waiting.append(_Running(p, a))
        left = budget
        decoded = list(rows)
        context = statistics.fmean([r.prompt + r.made for r in rows]) if rows else 0.0
        for r in rows:
            r.made += 1
        made += len(rows)
        left -= len(rows)
        chunks: list[int] = []  # the step's prefill chunks: one forward (the engine lays them end to end)
        held_before = len(rows)
        while left > 0:
            if prefilling is None:
                if not waiting or held_before + len(chunks) >= RUNNING:
                    break
                prefilling = waiting.pop(0)
            n = min(left, prefilling.prompt - prefilling.cached)
            chunks.append(n)
            left -= n
            prefilling.cached += n
            if prefilling.cached == prefilling.prompt:
                prefilling.made, made = 1, made + 1  # the first token comes with the prompt's last chunk
                rows.append(prefilling)
                prefilling = None
        t = costs.step_s(len(decoded), context, sum(chunks))
        clock += t
        if chunks:  # the step's time less what its decode alone would have cost
            prefill_s += t - (costs.decode_s(len(decoded), context) if decoded else 0.0)
        held += len(rows)
        steps += 1
        rows = [r for r in rows if r.made < r.answer]
    return {
        "tokens_per_s": round(made / clock, 1),
        "makespan_s": round(clock, 2),
        "prefill_share": round(prefill_s / clock, 3),
        "mean_rows": round(held / max(steps, 1), 1),
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.generate_bound")
    p.add_argument("--levels", default="1,8,32,64")
    args = p.parse_args(argv)
    levels = tuple(int(x) for x in args.levels.split(","))
    from localcluster import genmodel
    from transformers import AutoTokenizer

    model = genmodel.cached(seed=0, size="bench")
    tok = AutoTokenizer.from_pretrained(model)
    requests = workload(tok, max(s.stop for s in slices(levels).values()))
    load_before = [round(x, 2) for x in os.getloadavg()]
    costs = measure(model)
    parts = slices(levels)
    res: dict[str, Any] = {
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg_before": load_before,
        "costs": {
            "shared_s": costs.shared,
            "rows": ROWS,
            "contexts": CONTEXTS,
            "chunks": CHUNKS,
            "decode_s": costs.decode,
            "prefill_s": costs.prefill,
        },
        "kv_cache_tokens": KV_TOKENS,
    }
    for c in levels:
        reqs = [
            (len(tok(r["prompt"], add_special_tokens=False)["input_ids"]), r["max_tokens"])
            for r in requests[parts[f"closed {c}"]]
        ]
        res[str(c)] = {
            "requests": len(reqs),
            "prompt_tokens": sum(p for p, _ in reqs),
            "answer_tokens": sum(a for _, a in reqs),
            "replay": replay(costs, reqs, c),
        }
    res["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "generate_bound.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "costs"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
