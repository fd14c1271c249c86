"""A real server process with all-MiniLM-L6-v2, driven by tritonclient and plain HTTP."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "model",
    "servers",
    "batch",
    "requests",
    "by",
    "length",
    "so",
    "short",
    "inputs",
    "are",
    "never",
    "padded",
    "to",
    "long",
    "ones",
    "and",
    "deadlines",
    "are",
    "kept",
]


def text(n_words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=n_words))


def reference(model, texts: list[str]) -> np.ndarray:
    # sentence-transformers truncates at 256 tokens; all test texts are shorter.
    return model.encode(texts, batch_size=len(texts), convert_to_numpy=True)


@pytest.fixture
def client(minilm_server):
    c = triton.InferenceServerClient(
        minilm_server.url.removeprefix("http://"), connection_timeout=120, network_timeout=120
    )
    yield c
    c.close()


def test_health_and_metadata_with_tritonclient(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("minilm") and client.is_model_ready("minilm", "1")
    meta = client.get_model_metadata("minilm")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 384]}]
    assert client.get_server_metadata()["name"] == "modelserver"
    assert client.get_model_config("minilm")["max_batch_size"] == 64


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_embeddings_equal_direct_computation(client, reference_model, binary):
    texts = [text(n, seed=n) for n in (1, 3, 8, 20, 45, 110)]
    inp = triton.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    out = triton.InferRequestedOutput("embedding", binary_data=binary)
    res = client.infer("minilm", [inp], outputs=[out], request_id="emb-1", model_version="1")
    got = res.as_numpy("embedding")
    want = reference(reference_model, texts)
    assert got.shape == (6, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_openai_embeddings_equal_direct_computation_in_floats_and_base64(minilm_server, reference_model):
    import base64

    texts = [text(n, seed=100 + n) for n in (2, 7, 30)]
    want = reference(reference_model, texts)
    url = minilm_server.url + "/v1/embeddings"
    r = httpx.post(url, json={"model": "minilm", "input": texts}, timeout=60)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (
        doc["object"] == "list"
        and doc["model"] == "minilm"
        and [d["index"] for d in doc["data"]] == [0, 1, 2]
    )
    np.testing.assert_allclose(np.array([d["embedding"] for d in doc["data"]]), want, atol=2e-5, rtol=1e-4)
    # the tokens MiniLM saw, [CLS] and [SEP] included
    tok = reference_model.tokenizer
    assert doc["usage"]["prompt_tokens"] == sum(len(tok(t)["input_ids"]) for t in texts)
    one = httpx.post(
        url, json={"model": "minilm", "input": texts[0], "encoding_format": "base64"}, timeout=60
    )
    got = np.frombuffer(base64.b64decode(one.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(got, want[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("doc", "status", "named"),
    [
        ({"model": "minilm", "input": [1, 2, 3]}, 400, "input"),
        ({"model": "minilm", "input": "x", "dimensions": 8}, 400, "dimensions"),
        ({"model": "minilm", "input": []}, 400, "input"),
        ({"model": "minilm", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"model": "other", "input": "x"}, 404, "other"),
        ({"input": "x"}, 400, "model"),
    ],
)
def test_openai_embeddings_refuse_what_they_cannot_serve_naming_the_field(minilm_server, doc, status, named):
    r = httpx.post(minilm_server.url + "/v1/embeddings", json=doc, timeout=30)
    assert r.status_code == status, r.text
    assert named in r.json()["error"]["message"]  # OpenAI's shape on an OpenAI route
    assert (
        httpx.post(minilm_server.url + "/v1/embeddings", json={"model": "minilm", "input": "ok"}).status_code
        == 200
    )


async def test_concurrent_mixed_lengths_are_batched_correctly(minilm_server, reference_model):
    rng = np.random.default_rng(7)
    lengths = [int(x) for x in rng.choice([2, 5, 9, 16, 30, 60, 120], size=40)]
    texts = [text(n, seed=i) for i, n in enumerate(lengths)]
    want = reference(reference_model, texts)

    async with httpx.AsyncClient(base_url=minilm_server.url, timeout=120) as c:

        async def one(t: str, prio: int) -> np.ndarray:
            body = {
                "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [t]}],
                "parameters": {"priority": prio, "timeout_ms": 60000},
            }
            r = await c.post("/v2/models/minilm/infer", json=body)
            assert r.status_code == 200, r.text
            return np.array(r.json()["outputs"][0]["data"], dtype=np.float32)

        got = await asyncio.gather(*(one(t, 1 + i % 3) for i, t in enumerate(texts)))
    np.testing.assert_allclose(np.stack(got), want, atol=2e-5, rtol=1e-4)


def _infer_raw(
    url: str, payload: bytes, path: str = "/v2/models/minilm/infer", **headers: str
) -> httpx.Response:
    return httpx.post(url + path, content=payload, headers=headers, timeout=60)


BAD = {
    "wrong datatype": (b'{"inputs":[{"name":"text","shape":[1],"datatype":"INT64","data":[1]}]}', 400),
    "shape mismatch": (b'{"inputs":[{"name":"text","shape":[2],"datatype":"BYTES","data":["a"]}]}', 400),
    "wrong rank": (b'{"inputs":[{"name":"text","shape":[1,2],"datatype":"BYTES","data":["a","b"]}]}', 400),
    "empty inputs": (b'{"inputs":[]}', 400),
    "empty batch": (b'{"inputs":[{"name":"text","shape":[0],"datatype":"BYTES","data":[]}]}', 400),
    "malformed json": (b'{"inputs": [', 400),
    "unknown input": (b'{"inputs":[{"name":"txt","shape":[1],"datatype":"BYTES","data":["a"]}]}', 400),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_inputs_give_4xx_with_error(minilm_server, case):
    payload, status = BAD[case]
    r = _infer_raw(minilm_server.url, payload)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str) and r.json()["error"]


def test_too_long_input_names_the_limit(minilm_server):
    def infer(text: str) -> httpx.Response:
        body = (
            b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["' + text.encode() + b'"]}]}'
        )
        return _infer_raw(minilm_server.url, body)

    # 300 words, 600 tokens: refused by the tokenizer's count
    r = infer(" ".join(["word,"] * 300))
    assert r.status_code == 413
    assert "602 tokens" in r.json()["error"] and "512" in r.json()["error"]
    # 600 words: refused before tokenizing (more words than tokens allowed)
    r = infer(" ".join(["word"] * 600))
    assert r.status_code == 413
    assert r.json()["error"] == (
        "input 0 has more than 512 words, more than the maximum sequence length 512 tokens"
    )


def test_unknown_model_and_version_404(minilm_server, client):
    body = b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["a"]}]}'
    for path in ("/v2/models/other/infer", "/v2/models/minilm/versions/2/infer"):
        r = _infer_raw(minilm_server.url, body, path)
        assert r.status_code == 404 and "error" in r.json()
    inp = triton.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array(["a"], dtype=object))
    with pytest.raises(InferenceServerException) as e:
        client.infer("other", [inp])
    assert e.value.status() == "404"


def test_request_id_is_returned_and_logged(minilm_server):
    r = _infer_raw(minilm_server.url, b"{broken", **{"X-Request-ID": "itest-rid-42"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "itest-rid-42"
    deadline = time.monotonic() + 10
    pattern = re.compile(r'"request_id":"itest-rid-42"')
    while time.monotonic() < deadline and not pattern.search(minilm_server.logs()):
        time.sleep(0.1)
    assert pattern.search(minilm_server.logs())


def test_metrics_after_traffic(minilm_server):
    text_ = httpx.get(minilm_server.url + "/metrics", timeout=30).text
    labels = 'model="minilm",version="1"'
    assert f'modelserver_requests_total{{code="200",{labels}}}' in text_
    assert f"modelserver_padding_ratio_count{{{labels}}}" in text_
    assert f'modelserver_batch_size_bucket{{le="1.0",{labels}}}' in text_
    assert "process_resident_memory_bytes" in text_
