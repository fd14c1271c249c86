"""Process entry: settings -> logging -> model -> uvicorn, with SIGTERM drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Generator, Sequence

from .config import ConfigError, Settings, load_settings
from .errors import ModelLoadError
from .logs import setup_logging, shutdown_logging

log = logging.getLogger("modelserver")


def uvicorn_server(app: object, settings: Settings) -> object:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handling: SIGTERM first drains the model service."""

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            yield

    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=settings.host,
        port=settings.port,
        loop=loop,
        http="httptools",
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=False,
        timeout_keep_alive=75,
        timeout_graceful_shutdown=30,
    )
    return Server(config)


async def serve(settings: Settings) -> int:
    from .gen_server import serve_generation, wants_generation

    if wants_generation(settings):
        return await serve_generation(settings)
    return await serve_encoder(settings)


async def serve_encoder(settings: Settings) -> int:
    from .app import ModelServerApp
    from .loader import create_model
    from .service import ModelService
    from .shadow import ShadowMirror

    model = create_model(settings)
    service = ModelService(settings, model)
    mirror = None
    if settings.shadow_file:
        mirror = ShadowMirror(settings.model_name, service.metrics, service=settings.shadow_service)
    app = ModelServerApp(service, mirror)
    server = uvicorn_server(app, settings)
    exit_code = 0
    loop = asyncio.get_running_loop()
    draining: asyncio.Task[None] | None = None

    def on_load_failure(exc: BaseException) -> None:
        nonlocal exit_code
        exit_code = 2
        server.should_exit = True  # type: ignore[attr-defined]

    app.on_load_failure = on_load_failure
    drain_limit = settings.drain_timeout_s or settings.max_timeout_ms / 1000.0 + 5.0

    async def drain_then_exit() -> None:
        log.info(
            "signal received: draining", extra={"queue_depth": service.queue.depth if service.queue else 0}
        )
        try:
            await asyncio.wait_for(service.drain(), drain_limit)
        except TimeoutError:
            log.error("drain did not finish within %.1fs; exiting anyway", drain_limit)
        log.info("drained; shutting down")
        server.should_exit = True  # type: ignore[attr-defined]

    def on_signal(sig: int) -> None:
        nonlocal draining
        if draining is None:
            service.begin_drain()  # at once: nothing is admitted after the signal is handled
            draining = loop.create_task(drain_then_exit())
        elif sig == signal.SIGINT:
            server.force_exit = True  # type: ignore[attr-defined]
            server.should_exit = True  # type: ignore[attr-defined]

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    log.info(
        "starting",
        extra={
            "model": settings.model_name,
            "version": settings.model_version,
            "uri": settings.model_uri,
            "host": settings.host,
            "port": settings.port,
        },
    )
    await server.serve()  # type: ignore[attr-defined]
    if service.state == "failed":
        exit_code = 2
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "digest":
        from pathlib import Path

        from .loader import digest

        if len(argv) != 2:
            print("usage: python -m modelserver digest PATH", file=sys.stderr)
            return 2
        print(digest(Path(argv[1])))
        return 0
    try:
        settings = load_settings(argv)
    except ConfigError as e:
        print(f"modelserver: configuration error: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(serve(settings))
        return uvloop.run(serve(settings))
    except ModelLoadError as e:
        log.error("cannot load the model: %s", e)
        return 2
    finally:
        shutdown_logging()
