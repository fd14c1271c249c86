"""The demo's generative act: a small Llama built offline (:mod:`localcluster.genmodel`) served as
``task: generation``, one answer streamed token by token through the model Service (kube-proxy), with
its time to first token and its pace; the model from the cluster's S3 store, like the others. Kept
apart from :mod:`localcluster.demo` so ``demo.run`` stays a list of acts."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import httpx

from .demo_node import DemoStore, NodeChoice, writer_resources

NAME = "writer"
MODEL = "tiny-llama"


class DemoLike(Protocol):
    def kubectl(self, *args: str, show: bool = True, input: str | None = None) -> str: ...
    def wait(self, what: str, check: Any, timeout: float = 300) -> Any: ...
    def md_ready(self, ns: str, name: str) -> bool: ...
    def service_url(self, ns: str, service: str) -> str: ...


def manifest(uri: str, storage: dict[str, Any], resources: dict[str, str]) -> dict[str, Any]:
    """The writer: the model at ``uri`` (the cluster's S3 store, ``storage``), served as generation."""
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": NAME},
        "spec": {
            "model": {
                "name": MODEL,
                "version": "1",
                "uri": uri,
                "format": "hf",
                "task": "generation",
                "storage": storage,
            },
            "resources": resources,
            "generation": {"kvCacheTokens": 4096, "maxRunningSequences": 16},
        },
    }


def stream(url: str, prompt: str, max_tokens: int = 48) -> tuple[str, float, float, int]:
    """(text, seconds to the first piece, seconds in all, pieces) of one streamed completion."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.monotonic()
    first, pieces, text = 0.0, 0, ""
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece = json.loads(line[6:])["choices"][0]["text"]
            if piece:
                first = first or time.monotonic() - t0
                pieces += 1
                text += piece
                print(piece, end="", flush=True)
    print()
    return text, first, time.monotonic() - t0, pieces


def act(demo: DemoLike, ns: str, store: DemoStore, choice: NodeChoice) -> None:
    """Deploy the generative ModelDeployment (its model uploaded to the store), stream one answer, delete
    it."""
    started = time.monotonic()
    doc = manifest(store.writer(), store.storage(node_cache=False), writer_resources(choice))
    demo.kubectl("apply", "-f", "-", input=json.dumps(doc))
    demo.wait("the writer to be Ready", lambda: demo.md_ready(ns, NAME), timeout=180)
    url = demo.wait("a ready endpoint", lambda: demo.service_url(ns, NAME), timeout=60)
    print(f"POST {url}/v1/completions  (stream: true; random weights: the words are noise)")

    def answered() -> tuple[str, float, float, int] | None:
        try:
            return stream(url, "A canary is judged by")
        except httpx.HTTPError:
            return None

    _, first, total, pieces = demo.wait("the Service to stream", answered, timeout=30)
    print(f"  first token after {first * 1000:.0f} ms; {pieces} pieces in {total:.2f}s (continuous batching)")
    demo.kubectl("delete", "md", NAME, "--wait=false")
    print(f"  (this act took {time.monotonic() - started:.1f}s)")
