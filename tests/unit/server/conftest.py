"""Fixtures for the batching-core and server unit tests."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fetch_support import ACCESS_KEY, SECRET_KEY
from modelserver.batching import BatchingConfig, BatchQueue, CostModel, WorkItem

# The scheduler simulation lives in bench/ (repository root), which plain `pytest` does not put on the path.
ROOT = str(Path(__file__).resolve().parents[3])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class FakeClock:
    """A manual monotonic clock: tests advance it and then poke the queue."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def fixed_cost(c0: float = 1e-3, c1: float = 0.0, c2: float = 1e-5, c3: float = 0.0) -> CostModel:
    """A cost model with fixed coefficients that never refits."""
    cm = CostModel()
    cm.coef = np.array([c0, c1, c2, c3])
    cm.observe = lambda *a, **k: None  # type: ignore[method-assign]
    return cm


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_queue(clock: FakeClock) -> Callable[..., BatchQueue]:
    def make(cost: CostModel | None = None, **kw: object) -> BatchQueue:
        cfg = BatchingConfig(**{"max_queue_delay_s": 10.0, **kw})  # type: ignore[arg-type]
        return BatchQueue(cfg, clock=clock, cost_model=cost or fixed_cost())

    return make


@pytest.fixture
def make_item(clock: FakeClock) -> Callable[..., WorkItem]:
    def make(length: int = 10, timeout: float = 100.0, priority: int = 1, payload: object = None, **kw):
        return WorkItem(
            payload=payload if payload is not None else length,
            length=length,
            deadline=clock() + timeout,
            arrival=clock(),
            priority=priority,
            future=asyncio.get_running_loop().create_future(),
            **kw,  # type: ignore[arg-type]
        )

    return make


# -- text generation (test_generation.py, test_gen_schedule.py) ----------------------------------------------
@pytest.fixture(scope="module")
def gen_model_dir() -> Path:
    from localcluster import genmodel

    return genmodel.cached(seed=0, size="test")


@pytest.fixture(scope="module")
def loaded(gen_model_dir: Path) -> Any:
    """The small Llama of localcluster.genmodel and its tokenizer, on one torch thread."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(gen_model_dir, attn_implementation="sdpa")
    return model, AutoTokenizer.from_pretrained(gen_model_dir)


@pytest.fixture
async def own(loaded: Any) -> Any:
    """A started own engine of gen_support's sizes over ``loaded``'s model; stopped after the test."""
    from gen_support import BUDGET, KV_TOKENS, SLOTS
    from modelserver.gen_own_engine import build_own_engine

    engine = build_own_engine(
        loaded[0], kv_cache_tokens=KV_TOKENS, max_batch_tokens=BUDGET, max_sequences=SLOTS
    )
    yield engine
    engine.stop(block=True, timeout=10)


# ------------------------------------------------------------------------------- S3 (test_fetch*.py)


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    yield f"http://{host}:{port}"
    srv.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "S3_ENDPOINT": s3_endpoint,
        "S3_USE_HTTPS": "0",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for k in ("AWS_CA_BUNDLE", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "S3_ADDRESSING_STYLE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def s3(s3_endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="y",
        region_name="us-east-1",
    )


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"models-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    return name
