"""OpenAI ``/v1/embeddings`` (modelserver.openai_embeddings): the request as OpenAI's clients send it, the
answer as they read it; a model that gives no embeddings answers 404 and the server keeps serving."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
from modelserver import openai_embeddings as oai
from modelserver.app import ModelServerApp
from modelserver.config import load_settings
from modelserver.errors import InvalidInput
from modelserver.loader import create_model
from modelserver.service import ModelService


def test_a_text_or_a_list_of_texts_is_accepted() -> None:
    assert oai.parse({"model": "m", "input": "one"}).texts() == ["one"]
    assert oai.parse({"model": "m", "input": ["a", "b"], "user": "u"}).texts() == ["a", "b"]


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (
            {"model": "m", "input": [[1, 2]]},
            "input: a string or a list of strings (token ids are not supported)",
        ),
        ({"model": "m", "input": "x", "dimensions": 3}, "dimensions: not a supported field"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x"}, "model"),
        ([1], "a JSON object"),
    ],
)
def test_what_cannot_be_served_is_refused_naming_the_field(doc, named) -> None:
    with pytest.raises(InvalidInput, match=named.replace("(", r"\(").replace(")", r"\)")):
        oai.parse(doc)


def test_empty_input_is_refused() -> None:
    for bad in ([], [""]):
        with pytest.raises(InvalidInput, match="input"):
            oai.parse({"model": "m", "input": bad}).texts()


def test_the_answer_keeps_the_order_and_base64_is_little_endian_float32() -> None:
    vectors = np.array([[1.0, -2.5], [0.25, 3.0]], dtype=np.float32)
    floats = oai.answer("m", vectors, "float", 7)
    assert [d["embedding"] for d in floats["data"]] == [[1.0, -2.5], [0.25, 3.0]]
    assert [d["index"] for d in floats["data"]] == [0, 1] and floats["usage"] == {
        "prompt_tokens": 7,
        "total_tokens": 7,
    }
    b64 = oai.answer("m", vectors, "base64", 7)["data"][1]["embedding"]
    assert np.frombuffer(base64.b64decode(b64), dtype="<f4").tolist() == [0.25, 3.0]


async def test_a_model_without_embeddings_answers_404_and_keeps_serving() -> None:
    settings = load_settings(["--model-name", "echo", "--model-uri", "noop://"], environ={})
    svc = ModelService(settings, create_model(settings))
    await svc.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=ModelServerApp(svc)), base_url="http://t")
    try:
        r = await client.post("/v1/embeddings", json={"model": "echo", "input": "hi"})
        assert r.status_code == 404 and "gives no embeddings" in r.json()["error"]["message"]
        wrong = await client.post("/v1/embeddings", json={"model": "nope", "input": "hi"})
        assert wrong.status_code == 404 and "nope" in wrong.json()["error"]["message"]
        bad = await client.post("/v1/embeddings", content=b"{")
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
        # OpenAI's shape on the OpenAI route, the field named; the OIP routes keep {"error": "..."}
        dims = (
            await client.post("/v1/embeddings", json={"model": "echo", "input": "hi", "dimensions": 8})
        ).json()
        assert dims["error"]["param"] == "dimensions" and dims["error"]["type"] == "invalid_request_error"
        oip = await client.post("/v2/models/nope/infer", json={"inputs": []})
        assert oip.status_code == 404 and isinstance(oip.json()["error"], str)
        assert (
            await client.post(
                "/v2/models/echo/infer",
                json={"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]},
            )
        ).status_code == 200
    finally:
        await client.aclose()
        await svc.drain()
