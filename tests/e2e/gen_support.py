"""Streaming clients for the generation e2e tests: OpenAI ``/v1/completions`` with ``stream: true`` over
real HTTP (httpx), each stream recorded whole -- when it was sent, when its first and last events came,
how many events, who answered, and how it ended -- so a test can assert what every client saw."""

from __future__ import annotations

import json
import random
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from .canary_support import REVISION_HEADER, LoadGeneratorError

WORDS = [
    "the",
    "operator",
    "rolls",
    "a",
    "new",
    "revision",
    "out",
    "as",
    "canary",
    "and",
    "judges",
    "it",
    "by",
    "what",
    "its",
    "clients",
    "saw",
]


def prompt(rnd: random.Random, words: int) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(words))


@dataclass
class Stream:
    sent: float  # time.monotonic() when the request was sent
    code: int  # HTTP status; 0: connection error
    revision: str | None = None
    first: float | None = None  # when the first token's event came
    last: float | None = None  # when the last event came
    arrivals: list[float] = field(default_factory=list)  # when each event with text came
    done: bool = False  # "data: [DONE]" came
    finish_reason: str | None = None
    text: str = ""
    error: str | None = None
    prompt: str = ""

    @property
    def kind(self) -> str:
        """ok (200 and [DONE]) | cut (200, then the stream ended without [DONE] or with an error event) |
        http_4xx | http_5xx | connection_error"""
        if self.code == 200:
            return "ok" if self.done and self.error is None else "cut"
        if self.code == 0:
            return "connection_error"
        return "http_4xx" if 400 <= self.code < 500 else "http_5xx"

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent


def stream_once(client: httpx.Client, url: str, body: dict[str, Any]) -> Stream:
    """One streamed completion; every outcome is a :class:`Stream` (a connection error too)."""
    rec = Stream(sent=time.monotonic(), code=0, prompt=str(body.get("prompt", "")))
    try:
        with client.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}) as resp:
            rec.code = resp.status_code
            rec.revision = resp.headers.get(REVISION_HEADER)
            if resp.status_code != 200:
                resp.read()
                rec.error = resp.text[:200]
                return rec
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                now = time.monotonic()
                rec.last = now
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    rec.done = True
                    break
                doc = json.loads(data)
                if "error" in doc:
                    rec.error = str(doc["error"])[:200]
                    break
                choice = doc["choices"][0]
                if choice.get("text"):
                    rec.first = rec.first or now
                    rec.arrivals.append(now)
                    rec.text += choice["text"]
                rec.finish_reason = choice.get("finish_reason") or rec.finish_reason
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
        rec.last = time.monotonic()
    return rec


class StreamLoad:
    """``workers`` clients, each streaming one completion after another (greedy, ``max_tokens``, a prompt
    of ``prompt_words`` random words, or one of ``prompts``) until stopped; a new connection per stream
    (kube-proxy balances connections)."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        workers: int = 3,
        max_tokens: int = 32,
        prompt_words: int = 40,
        host: str | None = None,
        max_seconds: float = 300.0,
        prompts: list[str] | None = None,
    ) -> None:
        self.url, self.model, self.workers = url, model, workers
        self.max_tokens, self.prompt_words, self.max_seconds = max_tokens, prompt_words, max_seconds
        self.headers = {"Connection": "close", **({"Host": host} if host else {})}
        self.prompts = prompts  # None: random words
        self.streams: list[Stream] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def body(self, rnd: random.Random) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": rnd.choice(self.prompts) if self.prompts else prompt(rnd, self.prompt_words),
            "max_tokens": self.max_tokens,
            "temperature": 0,
        }

    def wait_serving(self, timeout: float = 60.0) -> StreamLoad:
        """Before the load (unrecorded): until one stream through the routing ends with [DONE]."""
        deadline, last = time.monotonic() + timeout, None
        with httpx.Client(timeout=30, headers=self.headers) as client:
            while time.monotonic() < deadline:
                last = stream_once(client, self.url, self.body(random.Random(0)))
                if last.kind == "ok":
                    return self
                time.sleep(0.2)
        raise LoadGeneratorError(f"{self.url}: no stream finished in {timeout:.0f}s (last: {last})")

    def _worker(self, seed: int) -> None:
        rnd = random.Random(seed)
        started = time.monotonic()
        with httpx.Client(timeout=60, headers=self.headers) as client:
            while not self._stop.is_set() and time.monotonic() - started < self.max_seconds:
                rec = stream_once(client, self.url, self.body(rnd))
                with self._lock:
                    self.streams.append(rec)
                if rec.code == 0:
                    time.sleep(0.05)

    def _guarded(self, seed: int) -> None:
        try:
            self._worker(seed)
        except BaseException:
            with self._lock:
                self.errors.append(f"worker {seed} died:\n{traceback.format_exc()}")

    def start(self) -> StreamLoad:
        self._threads = [
            threading.Thread(target=self._guarded, args=(i,), daemon=True) for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)
        if any(t.is_alive() for t in self._threads):
            self.errors.append("stream workers still running 70 s after stop")
        if self.errors:
            raise LoadGeneratorError("stream load failed:\n" + "\n".join(self.errors))

    def snapshot(self, since: float = 0.0) -> list[Stream]:
        with self._lock:
            return [s for s in self.streams if s.sent >= since]

    def by_kind(self, since: float = 0.0) -> Counter[str]:
        return Counter(s.kind for s in self.snapshot(since))

    def by_revision(self, since: float = 0.0) -> Counter[str]:
        return Counter(s.revision or "(none)" for s in self.snapshot(since))
