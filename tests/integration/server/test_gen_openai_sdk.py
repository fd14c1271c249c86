"""The official ``openai`` Python SDK against real servers: what users' code does, not hand-made requests.
Completions and chat, whole and streamed (usage, ``created``, vLLM's ``continuous_usage_stats`` and
``ignore_eos`` through the SDK's extra fields), ``/v1/models`` listed and retrieved, embeddings from an
encoder server in the SDK's default base64 encoding, and refusals as the SDK's typed exceptions carrying the
server's message -- the SDK puts ``error.message`` into the exception's text, and ``param`` / ``type`` on it,
only when the body has OpenAI's shape."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from conftest import GEN_MODEL, ServerProcess, gen_metric, top_field
from openai import OpenAI

PROMPT = "The licensee may"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def client(gen_server: ServerProcess) -> Iterator[OpenAI]:
    # no retries: a refusal must reach the test as the SDK raises it, not be retried away
    with OpenAI(base_url=gen_server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def recent(created: Any) -> bool:
    """Whether ``created`` is a Unix time in seconds within a minute of now (as OpenAI sends it)."""
    return isinstance(created, int) and abs(created - time.time()) < 60


def server_message(e: openai.APIStatusError) -> str:
    """The server's ``error.message``, which must be in the SDK's exception text."""
    assert isinstance(e.body, dict), f"not OpenAI's error shape: {e.body!r}"
    message = e.body.get("message")
    assert isinstance(message, str) and message, e.body
    assert message in str(e), str(e)
    return message


# -- answers ---------------------------------------------------------------------------------------------


def test_completion(client: OpenAI) -> None:
    c = client.completions.create(model=GEN_MODEL, prompt=PROMPT, max_tokens=8, temperature=0)
    assert c.object == "text_completion" and c.model == GEN_MODEL and c.id
    assert recent(c.created)
    assert c.choices[0].finish_reason in ("stop", "length") and isinstance(c.choices[0].text, str)
    assert c.usage is not None and 1 <= c.usage.completion_tokens <= 8 and c.usage.prompt_tokens > 0
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens


def test_streamed_completion_with_usage(client: OpenAI) -> None:
    whole = client.completions.create(model=GEN_MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model=GEN_MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == whole.choices[0].finish_reason
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )
    # every chunk, the usage chunk too: the SDK's Completion has `created` as a required field
    assert all(recent(getattr(ch, "created", None)) for ch in chunks), [ch.model_dump() for ch in chunks]


def test_chat(client: OpenAI) -> None:
    c = client.chat.completions.create(model=GEN_MODEL, messages=CHAT, max_tokens=8, temperature=0)
    assert c.object == "chat.completion" and c.model == GEN_MODEL and recent(c.created)
    assert c.choices[0].message.role == "assistant" and isinstance(c.choices[0].message.content, str)
    assert c.usage is not None and 1 <= c.usage.completion_tokens <= 8


def test_streamed_chat_with_usage(client: OpenAI) -> None:
    whole = client.chat.completions.create(model=GEN_MODEL, messages=CHAT, max_tokens=10, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=GEN_MODEL, messages=CHAT, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert all(recent(getattr(ch, "created", None)) for ch in chunks), [ch.model_dump() for ch in chunks]


def test_continuous_usage_stats_and_ignore_eos(client: OpenAI) -> None:
    """vLLM's extensions as load generators send them (guidellm): usage on every chunk, and an answer that
    runs to max_tokens whatever the model says."""
    chunks = list(
        client.completions.create(
            model=GEN_MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_body={"ignore_eos": True},
        )
    )  # fmt: skip
    with_text = [ch for ch in chunks if ch.choices]
    assert with_text and all(ch.usage is not None for ch in with_text), [ch.model_dump() for ch in chunks]
    counts = [ch.usage.completion_tokens for ch in with_text if ch.usage is not None]
    assert counts == sorted(counts) and counts[-1] == 40
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 40
    assert with_text[-1].choices[0].finish_reason == "length"


# -- models ----------------------------------------------------------------------------------------------


def test_models_list_and_retrieve(client: OpenAI) -> None:
    listed = list(client.models.list())
    assert [m.id for m in listed] == [GEN_MODEL]
    assert listed[0].object == "model" and isinstance(listed[0].owned_by, str)
    created = getattr(listed[0], "created", None)  # required by the SDK's Model: when the model was made
    assert isinstance(created, int) and 0 < created <= time.time(), listed[0].model_dump()
    one = client.models.retrieve(GEN_MODEL)
    assert one.id == GEN_MODEL and one.object == "model" and getattr(one, "created", None) == created


# -- refusals --------------------------------------------------------------------------------------------


def test_unknown_model_is_not_found(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="no-such-model", prompt=PROMPT, max_tokens=4)
    assert "no-such-model" in server_message(info.value)
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert "no-such-model" in server_message(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": 5.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"logprobs": 2}, "logprobs"),
        ({"n": 3}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ],
)
def test_bad_request_names_the_field(client: OpenAI, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=GEN_MODEL, prompt=PROMPT, **{"max_tokens": 4, **kwargs})
    message = server_message(info.value)
    assert top_field(info.value.param) == field, (info.value.param, message)
    assert field in message and info.value.type


def test_bad_chat_role_names_messages(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=GEN_MODEL,
            messages=[{"role": "robot", "content": "hi"}],  # type: ignore[list-item,misc]
            max_tokens=4,
        )
    server_message(info.value)
    assert top_field(info.value.param) == "messages", info.value.param


def held(srv: ServerProcess) -> float:
    running = gen_metric(srv, "modelserver_generation_requests_running")
    return running + gen_metric(srv, "modelserver_generation_requests_waiting")


def fill(srv: ServerProcess, n: int, stop: threading.Event) -> list[threading.Thread]:
    """``n`` long streams, each held open until ``stop`` (then cut), started one at a time: a sequence
    counts as waiting until its first token, so ones sent at once would find the waiting places taken."""
    # 2000 tokens past EOS: seconds of generation, so the held places stay held while the test asks
    body = {"model": GEN_MODEL, "prompt": PROMPT, "max_tokens": 2000, "temperature": 0, "stream": True}
    body["ignore_eos"] = True

    def hold() -> None:
        try:
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return
                    time.sleep(0.05)  # a slow reader: the answer outlasts the test's checks
        except httpx.HTTPError:
            pass

    threads = []
    for i in range(n):
        threads.append(threading.Thread(target=hold, daemon=True))
        threads[-1].start()
        deadline = time.monotonic() + 30
        while held(srv) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    return threads


def test_overload_is_a_rate_limit_error(client: OpenAI, gen_server: ServerProcess) -> None:
    """Two running and two waiting sequences fill the server (conftest's gen_server): the next request is a
    429, which the SDK raises as RateLimitError, with Retry-After. A fill that never held four places (its
    set-up, not the server's answer) is tried again, at most three times, and each try is recorded; once
    four are held, the request must be refused."""
    tries: list[float] = []
    refused: openai.RateLimitError | None = None
    while refused is None and len(tries) < 3:
        stop = threading.Event()
        threads = fill(gen_server, 4, stop)
        try:
            tries.append(held(gen_server))
            if tries[-1] >= 4:
                with pytest.raises(openai.RateLimitError) as info:
                    client.completions.create(model=GEN_MODEL, prompt=PROMPT, max_tokens=4)
                refused = info.value
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            wait_idle(gen_server)
    assert refused is not None, f"the fill never held four places (held per try: {tries})"
    assert int(refused.response.headers["retry-after"]) >= 1
    server_message(refused)


def wait_idle(srv: ServerProcess, timeout: float = 60.0) -> None:
    """Until no sequence runs or waits (the cut streams freed theirs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = gen_metric(srv, "modelserver_generation_requests_running")
        busy += gen_metric(srv, "modelserver_generation_requests_waiting")
        if busy == 0:
            return
        time.sleep(0.1)
    pytest.fail("sequences still held after their clients left")


# -- embeddings (an encoder server) ----------------------------------------------------------------------


def test_embeddings_in_the_sdks_default_base64(minilm_server: ServerProcess, reference_model: Any) -> None:
    texts = ["the cat sat on the mat", "a licence to copy", "é漢字🙂"]
    want = reference_model.encode(texts, batch_size=len(texts), convert_to_numpy=True)
    with OpenAI(base_url=minilm_server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        got = c.embeddings.create(model="minilm", input=texts)  # the SDK asks for base64 and decodes it
        floats = c.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert [d.index for d in got.data] == [0, 1, 2] and got.model == "minilm"
    np.testing.assert_allclose(np.array([d.embedding for d in got.data]), want, atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(
        np.array([d.embedding for d in floats.data]), np.array([d.embedding for d in got.data]), atol=1e-6
    )
    assert got.usage.prompt_tokens > len(texts)


def test_embeddings_refusals_as_typed_exceptions(minilm_server: ServerProcess) -> None:
    """The encoder server's OpenAI route refuses in OpenAI's shape too: the SDK's exception carries the
    message and names the field."""
    with OpenAI(base_url=minilm_server.url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        with pytest.raises(openai.BadRequestError) as info:
            c.embeddings.create(model="minilm", input="x", dimensions=8)
        with pytest.raises(openai.NotFoundError) as missing:
            c.embeddings.create(model="no-such-model", input="x")
    assert "dimensions" in server_message(info.value) and top_field(info.value.param) == "dimensions"
    assert "no-such-model" in server_message(missing.value)
