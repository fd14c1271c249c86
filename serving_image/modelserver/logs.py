"""JSON-lines logging that never blocks the caller.

Records go through a bounded queue (``put_nowait``; when it is full the record is dropped and counted) to a
listener thread that formats and writes them. The current request ID (a context variable set by the HTTP
layer) is attached to every record made while handling that request.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import logging
import logging.handlers
import queue
import sys
from typing import Any, TextIO

import orjson

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            doc["request_id"] = rid
        for k, v in record.__dict__.items():
            if k not in _STD and not k.startswith("_"):
                doc[k] = v
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        return True


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """A QueueHandler that never blocks: a full queue drops the record."""

    dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            DroppingQueueHandler.dropped += 1

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # Merge args now (they may be mutable), leave JSON formatting to the listener thread.
        record.msg = record.getMessage()
        record.args = None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        return record


class _ExcTextJsonFormatter(JsonFormatter):
    def format(self, record: logging.LogRecord) -> str:
        s = super().format(record)
        if record.exc_text and '"exc"' not in s:
            doc = orjson.loads(s)
            doc["exc"] = record.exc_text
            s = orjson.dumps(doc).decode()
        return s


_listener: logging.handlers.QueueListener | None = None


def setup_logging(level: str = "info", stream: TextIO | None = None, capacity: int = 10000) -> None:
    global _listener
    if _listener is not None:
        _listener.stop()
    q: queue.Queue[logging.LogRecord] = queue.Queue(maxsize=capacity)
    out = logging.StreamHandler(stream or sys.stderr)
    out.setFormatter(_ExcTextJsonFormatter())
    qh = DroppingQueueHandler(q)
    qh.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(qh)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    _listener = logging.handlers.QueueListener(q, out, respect_handler_level=False)
    _listener.start()


def shutdown_logging() -> None:
    global _listener
    if _listener is not None:
        _listener.stop()
        _listener = None
