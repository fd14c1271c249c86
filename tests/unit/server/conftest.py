"""Fixtures for the batching-core and server unit tests."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
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
