"""Process entry of a generation server (``task: generation``, or ``auto`` with a ``*ForCausalLM``
config): load the causal LM and its tokenizer, start the continuous-batching engine, serve
:class:`modelserver.gen_app.GenerationApp`. SIGTERM: readiness goes false and nothing new is admitted;
running streams finish (up to ``drain_timeout_s``, else the max timeout + 5 s), then the engine stops."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path

from .config import Settings
from .errors import ModelLoadError
from .gen_engine import GenerationEngine, Limits, build_manager

log = logging.getLogger("modelserver.generation")


def is_causal_lm(path: Path) -> bool:
    """Whether ``path`` holds a Hugging Face model whose config names a ``*ForCausalLM`` architecture."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or [])


def local_model_dir(settings: Settings) -> Path | None:
    """The model directory when the URI is local (``file://`` or a path), else None (not fetched here)."""
    uri = settings.model_uri
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    if "://" not in uri and uri:
        return Path(uri)
    return None


def wants_generation(settings: Settings) -> bool:
    if settings.task == "generation":
        return True
    if settings.task != "auto" or settings.model_format not in ("auto", "hf"):
        return False
    path = local_model_dir(settings)
    return path is not None and is_causal_lm(path)


def load(settings: Settings) -> tuple[GenerationEngine, object]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .loader import fetch, resolve_device

    path = fetch(settings)
    if not is_causal_lm(path):
        raise ModelLoadError(
            f"{path}: task generation needs a *ForCausalLM model (config.json architectures)"
        )
    device = resolve_device(settings.device)
    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    t0 = time.monotonic()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(settings.dtype, torch.float32)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype if device == "cuda" else torch.float32, attn_implementation="sdpa"
    )
    model = model.to(device)  # type: ignore[arg-type]
    tokenizer = AutoTokenizer.from_pretrained(path)
    manager, context, running = start_engine(model, settings, engine_for(settings.engine, device))
    limits = Limits(
        context=context,
        max_tokens=min(settings.max_new_tokens, context - 1),
        max_waiting=settings.max_waiting_sequences,
        max_running=running,
        priority_levels=settings.priority_levels,
        default_priority=settings.default_priority,
        max_timeout_s=settings.max_timeout_ms / 1000.0,
    )
    log.info(
        "generation model loaded", extra={"path": str(path), "device": device, "s": time.monotonic() - t0}
    )
    engine = GenerationEngine(
        manager, limits, model.generation_config.eos_token_id, settings.aging_ms / 1000.0
    )
    return engine, tokenizer


def engine_for(engine: str, device: str) -> str:
    """``--engine``, with ``auto`` resolved: the own engine on the CPU, where it is measured (make
    bench-generate: 2.03x transformers serve at 32 streams), the manager on CUDA, where it is measured
    (make bench-gpu on an H200: greedy answers exact, 0.95-1.15x transformers serve) and the own engine
    is not yet."""
    if engine != "auto":
        return engine
    return "manager" if device == "cuda" else "own"


def start_engine(model: object, settings: Settings, engine: str = "own") -> tuple[object, int, int]:
    """The loop that runs the model (``--engine``), the context it allows and the sequences it runs at once:
    the own engine's slot length (``--max-context-tokens``, else the KV cache's tokens /
    ``--max-running-sequences``) and slots, the manager's whole cache; at most the model's positions."""
    if engine == "own":
        from .gen_own_engine import build_own_engine

        own = build_own_engine(
            model,
            kv_cache_tokens=settings.kv_cache_tokens,
            max_batch_tokens=settings.max_batch_tokens,
            max_sequences=settings.max_running_sequences,
            max_context=settings.max_context_tokens,
        )
        return own, own.max_len, own.slots
    positions = int(getattr(getattr(model, "config", None), "max_position_embeddings", 2048))
    manager = build_manager(
        model,
        kv_cache_tokens=settings.kv_cache_tokens,
        page_size=settings.kv_page_size,
        max_batch_tokens=settings.max_batch_tokens,
        max_sequences=settings.max_running_sequences,
    )
    return manager, min(positions, settings.kv_cache_tokens), settings.max_running_sequences


async def serve_generation(settings: Settings) -> int:
    from .gen_app import GenerationApp
    from .metrics import Metrics
    from .server import uvicorn_server

    engine, tokenizer = await asyncio.to_thread(load, settings)
    metrics = Metrics(settings.model_name, settings.model_version)
    mirror = None
    if settings.shadow_file:
        from .gen_shadow import GenerationMirror

        def tokenize(text: str) -> list[int]:
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]

        mirror = GenerationMirror(settings.model_name, metrics, tokenize, service=settings.shadow_service)
    app = GenerationApp(
        engine,
        tokenizer,
        settings.model_name,
        settings.model_version,
        metrics,
        mirror=mirror,
        shadow_file=settings.shadow_file,
        max_concurrent_requests=settings.max_concurrent_requests,
        special_tokens_in_chat=settings.special_tokens_in_chat,
    )
    server = uvicorn_server(app, settings)
    loop = asyncio.get_running_loop()
    drain_limit = settings.drain_timeout_s or settings.max_timeout_ms / 1000.0 + 5.0

    async def drain_then_exit() -> None:
        deadline = loop.time() + drain_limit
        while (engine.running or engine.waiting) and loop.time() < deadline:
            await asyncio.sleep(0.1)
        log.info("drained", extra={"running": engine.running, "waiting": engine.waiting})
        server.should_exit = True  # type: ignore[attr-defined]

    tasks: list[asyncio.Task[None]] = []

    def on_signal() -> None:
        if not app.draining:
            app.draining = True
            tasks.append(loop.create_task(drain_then_exit()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await server.serve()  # type: ignore[attr-defined]
    finally:
        engine.manager.stop(block=True, timeout=10)
    return 0
