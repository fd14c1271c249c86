"""What the own engine's unit tests share: its sizes, the reference answer, a stream collected, prompts cut
from one text (the engine itself: conftest's ``own``)."""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from modelserver.gen_engine import GenerationEngine, Sampling

#: the own engine of these tests: slots of 160 tokens; 24 tokens per step, so long prompts are chunked
SLOTS, KV_TOKENS, BUDGET = 3, 3 * 160, 24


def reference(loaded: Any, prompt: list[int], n: int) -> list[int]:
    model, tok = loaded
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id
        )
    return [int(t) for t in out[0][len(prompt) :]]


async def collect(
    engine: GenerationEngine, prompt: list[int], sampling: Sampling, delay: float = 0.0
) -> list[int]:
    await asyncio.sleep(delay)
    tokens: list[int] = []
    async for step in engine.stream(prompt, sampling):
        tokens += step.tokens
    return tokens


def prompts_of(tok: Any, lengths: list[int]) -> list[list[int]]:
    text = (
        "Permission is hereby granted, free of charge, to any person obtaining a copy of this software " * 20
    )
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return [ids[i : i + n] for i, n in enumerate(lengths)]
