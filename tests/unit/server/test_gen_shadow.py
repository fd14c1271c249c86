"""The shadow mirror of a generation server (modelserver.gen_shadow): answered greedy requests are copied
to the shadow revision and the two answers compared by tokens. In-process: two generation apps on small
Llamas (seed 0 is the stable; the same seed is a faithful shadow, seed 1 a "wrong" one); the mirror's
``post`` carries copies to the shadow app over ASGI (the real aiohttp client is the encoder mirror's,
exercised against real processes in tests/integration/server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from localcluster import genmodel
from localcluster.promtext import sample_sum
from modelserver.compare import CompareSpec
from modelserver.gen_app import GenerationApp
from modelserver.gen_engine import GenerationEngine, Limits, build_manager
from modelserver.gen_shadow import GenerationMirror, answer_text, copy_request, token_agreement
from modelserver.metrics import Metrics
from modelserver.shadow import SHADOW_HEADER, MirrorConfig


def test_token_agreement_is_the_matching_share_of_the_shorter_answer() -> None:
    assert token_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75
    assert token_agreement([1, 2], [1, 2, 3, 4, 5]) == 1.0  # up to the shorter answer
    assert token_agreement([], []) == 1.0 and token_agreement([], [1]) == 0.0


def test_a_copy_is_the_same_request_greedy_whole_and_with_the_stables_max_tokens() -> None:
    doc = {
        "model": "m", "prompt": "p", "temperature": 0.0, "stream": True, "stop": ["\n"], "max_tokens": None,
        "stream_options": {"include_usage": True}, "priority": 1, "timeout_ms": 50.0, "seed": 3,
    }  # fmt: skip
    assert copy_request(doc, 16) == {
        "model": "m", "prompt": "p", "temperature": 0.0, "stream": False, "stop": ["\n"], "max_tokens": 16,
    }  # fmt: skip
    assert answer_text({"choices": [{"message": {"role": "assistant", "content": "hi"}}]}) == "hi"
    with pytest.raises(ValueError, match="no answer text"):
        answer_text({"choices": []})


def load(seed: int) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    path = genmodel.cached(seed=seed, size="test")
    return AutoModelForCausalLM.from_pretrained(
        path, attn_implementation="sdpa"
    ), AutoTokenizer.from_pretrained(path)


class ToShadow:
    """The mirror's ``post``: copies to the shadow app in-process; remembers each copy."""

    def __init__(self, app: GenerationApp) -> None:
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shadow")
        self.sent: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    async def __call__(
        self, url: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        path = httpx.URL(url).path
        self.sent.append((path, orjson.loads(body), headers))
        r = await self.client.post(path, content=body, headers=headers)
        return r.status_code, dict(r.headers), r.content


def app_of(model: Any, tok: Any, version: str, mirror: GenerationMirror | None = None) -> GenerationApp:
    manager = build_manager(model, kv_cache_tokens=2048, page_size=32, max_batch_tokens=128, max_sequences=8)
    engine = GenerationEngine(manager, Limits(context=512, max_tokens=64, max_waiting=16), tok.eos_token_id)
    return GenerationApp(engine, tok, "tiny", version, Metrics("tiny", version), mirror=mirror)


@pytest.fixture(scope="module")
def stable_model() -> tuple[Any, Any]:
    return load(0)


@pytest.fixture
async def stable_and_shadow(
    request: Any, stable_model: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Any, ToShadow]]:
    """(a client of the stable app, its mirror, the copies' carrier) with a shadow of weights ``param``."""
    model, tok = stable_model
    shadow = app_of(*(stable_model if request.param == 0 else load(request.param)), "2")
    post = ToShadow(shadow)
    metrics = Metrics("tiny", "1")

    def tokenize(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    mirror = GenerationMirror("tiny", metrics, tokenize, post=post, service="http://tiny-{revision}:8080")
    stable = app_of(model, tok, "1", mirror)
    stable.metrics = metrics
    compare = CompareSpec(method="tokenAgreement", min_token_agreement=0.9)
    mirror.configure(MirrorConfig(url="http://tiny-r2:8080", revision="r2", sample_rate=1.0, compare=compare))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=stable), base_url="http://stable", timeout=60
    )
    yield client, mirror, post
    await client.aclose()
    await mirror.close()
    for app in (stable, shadow):
        app.engine.manager.stop(block=True, timeout=10)


PROMPTS = ["The licensee may", "Permission is hereby granted", "THE SOFTWARE IS PROVIDED", "Redistribution"]


async def ask_all(client: httpx.AsyncClient) -> None:
    for i, p in enumerate(PROMPTS):
        body = {"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0, "stream": i % 2 == 1}
        r = await client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
    # sampled answers are not copied: two runs of the same weights differ
    r = await client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 8, "temperature": 1}
    )
    assert r.status_code == 200


def results(mirror: GenerationMirror) -> dict[str, float]:
    text = mirror.metrics.exposition().decode()
    return {
        res: sample_sum(text, "modelserver_shadow_requests_total", result=res)
        for res in ("agree", "disagree", "error", "timeout", "dropped")
    }


@pytest.mark.parametrize("stable_and_shadow", [0], indirect=True)
async def test_a_shadow_with_the_same_weights_agrees_on_every_greedy_answer(stable_and_shadow) -> None:
    client, mirror, post = stable_and_shadow
    await ask_all(client)
    await mirror.drain()
    assert results(mirror) == {"agree": 4, "disagree": 0, "error": 0, "timeout": 0, "dropped": 0}
    # the copies: greedy, whole, with the stable's max_tokens, marked as copies
    assert [p for p, _, _ in post.sent] == ["/v1/completions"] * 4
    assert all(
        doc["stream"] is False and doc["temperature"] == 0.0 and doc["max_tokens"] == 24
        for _, doc, _ in post.sent
    )
    assert all(h[SHADOW_HEADER] == "1" and h["x-request-id"] for _, _, h in post.sent)


@pytest.mark.parametrize("stable_and_shadow", [1], indirect=True)
async def test_a_shadow_with_other_weights_disagrees_on_every_greedy_answer(stable_and_shadow) -> None:
    client, mirror, _ = stable_and_shadow
    await ask_all(client)
    await mirror.drain()
    got = results(mirror)
    assert got["disagree"] == 4 and got["agree"] == 0, got
    text = mirror.metrics.exposition().decode()
    # the similarity is the token agreement: far below the threshold for other random weights
    total = sample_sum(text, "modelserver_shadow_similarity_sum", shadow_revision="r2")
    assert total / 4 < 0.5, total
