"""Text generation (issue 25): the OpenAI-compatible API over the continuous-batching engine, on a small
Llama built offline with a fixed seed (localcluster.genmodel). Greedy answers must be the ones
``model.generate`` gives; bad requests are 4xx naming the field or limit; a full queue is 429."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from localcluster.promtext import sample_sum
from modelserver.errors import InvalidInput
from modelserver.gen_app import GenerationApp
from modelserver.gen_engine import GenerationEngine, Limits, Sampling, build_manager, check
from modelserver.metrics import Metrics


@pytest.fixture
async def app(loaded: Any) -> AsyncIterator[GenerationApp]:
    model, tok = loaded
    manager = build_manager(model, kv_cache_tokens=2048, page_size=32, max_batch_tokens=128, max_sequences=8)
    engine = GenerationEngine(manager, Limits(context=512, max_tokens=64, max_waiting=8), tok.eos_token_id)
    yield GenerationApp(engine, tok, "tiny", "1", Metrics("tiny", "1"))
    manager.stop(block=True, timeout=10)


def client(app: GenerationApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gen", timeout=60)


def greedy_reference(loaded: Any, prompt_ids: list[int], n: int) -> list[int]:
    import torch

    model, tok = loaded
    out = model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id
    )
    return [int(t) for t in out[0][len(prompt_ids) :]]


def events(text: str) -> list[Any]:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# -- the API -----------------------------------------------------------------------------------------------
async def test_a_greedy_completion_is_what_generate_gives_and_counts_its_tokens(app, loaded) -> None:
    _, tok = loaded
    prompt = "The licensee may"
    async with client(app) as c:
        r = await c.post(
            "/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": 20, "temperature": 0}
        )
    assert r.status_code == 200, r.text
    doc = r.json()
    ids = tok(prompt)["input_ids"]
    want = greedy_reference(loaded, ids, 20)
    choice = doc["choices"][0]
    assert choice["text"] == tok.decode(want, skip_special_tokens=True)
    assert doc["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(want),
        "total_tokens": len(ids) + len(want),
    }
    assert choice["finish_reason"] == ("length" if len(want) == 20 else "stop")
    assert doc["object"] == "text_completion" and doc["model"] == "tiny"


async def test_a_stream_sends_the_same_text_in_pieces_then_done(app) -> None:
    body = {"model": "tiny", "prompt": "def main():", "max_tokens": 24, "temperature": 0}
    async with client(app) as c:
        whole = (await c.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        r = await c.post(
            "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-accel-buffering"] == "no" and r.headers["cache-control"] == "no-cache"
    evs = events(r.text)
    assert evs[-1] == "[DONE]"
    chunks = [e for e in evs[:-1] if e["choices"]]
    assert len(chunks) > 2  # streamed, not one piece
    assert "".join(e["choices"][0]["text"] for e in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")
    assert evs[-2]["usage"]["completion_tokens"] > 0 and evs[-2]["choices"] == []


async def test_chat_uses_the_tokenizers_chat_template(app, loaded) -> None:
    _, tok = loaded
    msgs = [{"role": "user", "content": "What is a license?"}]
    body = {"model": "tiny", "messages": msgs, "max_tokens": 12, "temperature": 0}
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", json=body)
        s = await c.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200, r.text
    doc = r.json()
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert doc["usage"]["prompt_tokens"] == len(ids)
    assert doc["choices"][0]["message"]["role"] == "assistant"
    evs = events(s.text)
    assert evs[0]["choices"][0]["delta"] == {"role": "assistant"}
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in evs[:-1])
    assert streamed == doc["choices"][0]["message"]["content"]


async def test_a_stop_string_ends_the_answer_before_it(app) -> None:
    body = {"model": "tiny", "prompt": "The licensee may", "max_tokens": 30, "temperature": 0}
    async with client(app) as c:
        full = (await c.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        assert len(full) > 6
        stop = full[3:6]
        cut = (await c.post("/v1/completions", json={**body, "stop": [stop]})).json()["choices"][0]
    assert cut["text"] == full[: full.index(stop)] and cut["finish_reason"] == "stop"


async def test_sampled_requests_are_served_and_stay_within_max_tokens(app) -> None:
    body = {
        "model": "tiny",
        "prompt": "Hello",
        "max_tokens": 10,
        "temperature": 0.9,
        "top_p": 0.9,
        "top_k": 40,
    }
    async with client(app) as c:
        rs = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(4)))
    assert [r.status_code for r in rs] == [200] * 4
    assert all(r.json()["usage"]["completion_tokens"] <= 10 for r in rs)


@pytest.mark.parametrize(
    ("body", "status", "message", "param"),
    [
        ({"model": "tiny", "prompt": "x", "logprobs": 3}, 400, "logprobs: not a supported field", "logprobs"),
        ({"model": "tiny", "prompt": "x", "n": 2}, 400, "n:", "n"),
        ({"model": "tiny", "prompt": "x", "temperature": 0.7, "seed": 1}, 400, "seed", "seed"),
        ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "stop"),
        (
            {"model": "tiny", "prompt": "x", "max_tokens": 65},
            400,
            "over this server's limit of 64",
            "max_tokens",
        ),
        (
            {"model": "tiny", "prompt": "word " * 600, "max_tokens": 8},
            400,
            "over the context of 512",
            "prompt",
        ),
        (
            {"model": "tiny", "prompt": "é" * 3000, "max_tokens": 64},
            400,
            "over the context of 512",
            "prompt",
        ),
        ({"model": "tiny", "prompt": "x", "temperature": 3}, 400, "temperature", "temperature"),
        ({"model": "tiny", "prompt": "x", "priority": 9}, 400, "priority", "priority"),
        ({"model": "other", "prompt": "x"}, 404, "not served here", "model"),
        ({"prompt": "x"}, 400, "model: Field required", "model"),
    ],
)
async def test_bad_requests_are_4xx_naming_the_field_and_the_server_keeps_serving(
    app, body, status, message, param
) -> None:
    async with client(app) as c:
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == status and message in r.json()["error"]["message"], r.text
        assert r.json()["error"]["param"] == param and param in r.json()["error"]["message"], r.text
        ok = await c.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
    assert ok.status_code == 200


async def test_ignore_eos_runs_a_greedy_answer_past_its_eos_to_max_tokens(app, loaded) -> None:
    """The manager too: the model's EOS (here its third greedy token, made the EOS) does not end it."""
    _, tok = loaded
    prompt = tok("The licensee may")["input_ids"]
    want = greedy_reference(loaded, prompt, 20)
    assert len(want) == 20 and want[2] not in want[:2], "pick a prompt whose answer runs to 20"
    engine = GenerationEngine(app.engine.manager, app.engine.limits, want[2])
    stopped = [s async for s in engine.stream(prompt, Sampling(20, greedy=True))]
    assert [t for s in stopped for t in s.tokens] == want[:3] and stopped[-1].reason == "stop"
    steps = [s async for s in engine.stream(prompt, Sampling(20, greedy=True, ignore_eos=True))]
    assert [t for s in steps for t in s.tokens] == want
    assert steps[-1].finished and steps[-1].reason == "length"


async def test_past_the_waiting_bound_a_request_gets_429_with_retry_after(app) -> None:
    app.engine.limits = Limits(context=512, max_tokens=64, max_waiting=0)
    async with client(app) as c:
        r = await c.post("/v1/completions", json={"model": "tiny", "prompt": "x"})
    assert (
        r.status_code == 429 and r.headers["retry-after"] == "1" and "waiting" in r.json()["error"]["message"]
    )
    assert r.json()["error"]["type"] == "rate_limit_exceeded"
    text = app.metrics.exposition().decode()
    assert sample_sum(text, "modelserver_requests_total", code="429") == 1


async def test_leaving_a_stream_early_cancels_the_sequence_and_frees_its_slot(app, loaded) -> None:
    _, tok = loaded
    steps = app.engine.stream(tok("Hello")["input_ids"], Sampling(60, greedy=True))
    first = await anext(steps)
    assert first.tokens and app.engine.running == 1
    await steps.aclose()  # what the app does when the client goes away
    assert app.engine.running == 0 and app.engine.waiting == 0
    # the cancelled sequence's blocks are free again: a full-size request is still admitted and served
    async with client(app) as c:
        r = await c.post(
            "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 8, "temperature": 0}
        )
    assert r.status_code == 200


async def test_the_metrics_carry_ttft_tokens_and_engine_gauges(app) -> None:
    async with client(app) as c:
        await c.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "Hello there", "max_tokens": 6, "temperature": 0},
        )
        text = (await c.get("/metrics")).text
        models = (await c.get("/v1/models")).json()
        ready = await c.get("/v2/health/ready")
    assert sample_sum(text, "modelserver_generation_time_to_first_token_seconds_count") == 1
    assert sample_sum(text, "modelserver_generation_tokens_total") >= 1
    assert sample_sum(text, "modelserver_generation_prompt_tokens_total") >= 2
    assert sample_sum(text, "modelserver_requests_total", code="200") == 1
    for gauge in ("running", "waiting"):
        assert sample_sum(text, f"modelserver_generation_requests_{gauge}") == 0
    assert "modelserver_generation_kv_cache_usage_ratio" in text
    assert models["data"][0]["id"] == "tiny" and ready.status_code == 200


async def test_answers_name_the_revision_and_the_request_id(app, monkeypatch) -> None:
    monkeypatch.setenv("MODELDEPLOY_REVISION", "abc123")
    model, tok = app.engine, app.tokenizer
    named = GenerationApp(model, tok, "tiny", "1", Metrics("tiny", "1"))
    async with client(named) as c:
        r = await c.get("/v1/models", headers={"x-request-id": "req-7"})
        bad = await c.post("/v1/completions", json={"model": "tiny"})
    assert r.headers["x-modeldeploy-revision"] == "abc123" and r.headers["x-request-id"] == "req-7"
    assert bad.status_code == 400 and bad.headers["x-modeldeploy-revision"] == "abc123"
    assert len(bad.headers["x-request-id"]) == 32  # none given: a new one


async def test_the_openapi_document_describes_the_request_bodies(app) -> None:
    async with client(app) as c:
        doc = (await c.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    for path, kind in (("/v1/completions", "CompletionRequest"), ("/v1/chat/completions", "ChatRequest")):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{kind}"}
        assert "max_tokens" in schemas[kind]["properties"] and schemas[kind]["additionalProperties"] is False
    assert schemas["ChatRequest"]["properties"]["messages"]["items"] == {
        "$ref": "#/components/schemas/ChatMessage"
    }
    assert "ChatMessage" in schemas and "StreamOptions" in schemas


# -- pure parts ------------------------------------------------------------------------------------
def test_limits_are_checked_before_admission_with_the_limit_named() -> None:
    limits = Limits(context=100, max_tokens=50, max_waiting=1)
    check(limits, 50, 50)
    with pytest.raises(InvalidInput, match="context of 100"):
        check(limits, 51, 50)
    with pytest.raises(InvalidInput, match="limit of 50"):
        check(limits, 1, 51)
    with pytest.raises(InvalidInput, match="empty"):
        check(limits, 0, 1)


def test_greedy_is_top_k_one_and_sampled_keeps_its_values() -> None:
    assert Sampling(5, greedy=True).processor_kwargs() == {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    kw = Sampling(5, temperature=1, top_p=0.5, top_k=3).processor_kwargs()
    assert kw == {"temperature": 1.0, "top_k": 3, "top_p": 0.5} and isinstance(kw["temperature"], float)
