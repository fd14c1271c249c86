"""An async Prometheus query client (instant and range queries) that can never hang.

It replaces prometheus-api-client's instant queries, for these measured reasons:

* its timeout is **per socket read**: a Prometheus that accepts and drips one byte every few seconds keeps
  a query alive indefinitely;
* urllib3's retries honour any ``Retry-After`` **uncapped**: a 503 with ``Retry-After: 3`` cost 9 s of
  sleeping before the error surfaced;
* the response body is read **unbounded** into memory;
* it blocks the reconcile **threads** that run it, so a sick Prometheus parks every worker.

Here one query is one request, no retries (the caller decides when to ask again), under one *total*
deadline that covers connect, send and the whole body, with the body read incrementally up to a cap. Every
failure is a :class:`QueryError` whose message is one line, safe to show in a status: it names the URL
without credentials and never carries the password or the bearer token.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import ssl
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp

ErrorKind = Literal["timeout", "refused", "http", "unparseable", "shape", "too-large", "tls"]

CHUNK = 64 * 1024
EXCERPT = 200


@dataclass(frozen=True)
class PromConfig:
    url: str  # http:// or https://, may carry a path prefix and user:pass@ (sent as basic auth)
    timeout: float = 10.0  # total deadline per query: connect + send + the whole body, seconds
    max_bytes: int = 4 * 1024 * 1024  # cap on the response body
    ca_file: str | None = None  # PEM bundle to verify https against (default: the system trust store)
    insecure_skip_verify: bool = False  # TLS is always verified unless this is set
    bearer_token: str | None = None  # sent as ``Authorization: Bearer ...``


class QueryError(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        self.kind: ErrorKind = kind
        self.message = " ".join(message.split())
        super().__init__(f"{kind}: {self.message}")


def redact(url: str) -> str:
    """``url`` without its ``user:password@``; everything else kept."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class PromClient:
    """Instant queries against one Prometheus; one :class:`aiohttp.ClientSession`, made on first use."""

    def __init__(self, cfg: PromConfig) -> None:
        parts = urlsplit(cfg.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Prometheus URL must be http(s)://host[:port][/prefix]: {redact(cfg.url)!r}")
        if cfg.bearer_token and parts.username is not None:
            raise ValueError("Prometheus URL credentials and a bearer token are mutually exclusive")
        self.cfg = cfg
        self.shown = redact(cfg.url)
        path = parts.path.rstrip("/") + "/api/v1/query"
        self.query_url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], path=path))
        self.range_url = self.query_url + "_range"
        self.headers: dict[str, str] = {}
        self.secrets = [s for s in (cfg.bearer_token,) if s]
        if cfg.bearer_token:
            self.headers["Authorization"] = f"Bearer {cfg.bearer_token}"
        if parts.username is not None:
            password = unquote(parts.password or "")
            creds = f"{unquote(parts.username)}:{password}".encode()
            self.headers["Authorization"] = "Basic " + base64.b64encode(creds).decode()
            self.secrets += [s for s in (password, parts.password) if s]
        self.ssl: ssl.SSLContext | bool = (
            False if cfg.insecure_skip_verify else ssl.create_default_context(cafile=cfg.ca_file)
        )
        self.session: aiohttp.ClientSession | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        # A session belongs to the loop it was made in: a client used from another loop gets a new one.
        if self.session is None or self.session.closed or self.loop is not loop:
            self.loop = loop
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ssl),
                timeout=aiohttp.ClientTimeout(total=self.cfg.timeout),
                headers=self.headers,
            )
        return self.session

    def _error(self, kind: ErrorKind, message: str) -> QueryError:
        for secret in self.secrets:
            message = message.replace(secret, "***")
        return QueryError(kind, message)

    async def instant(self, promql: str) -> float | None:
        """The value of ``promql`` now; ``None`` when there is no data (no series, NaN or infinite)."""
        body = await self._ask(self.query_url, {"query": promql})
        value = self._answer(body)
        return None if value is None or math.isnan(value) or math.isinf(value) else value

    async def range(self, promql: str, start: float, end: float, step: float) -> list[float]:
        """The values of ``promql`` from ``start`` to ``end`` (Unix seconds) every ``step`` seconds, NaN
        and infinite values left out; ``[]`` when there is no series (no data)."""
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        body = await self._ask(self.range_url, params)
        values = self._series(body)
        return [v for v in values if math.isfinite(v)]

    async def _ask(self, url: str, params: dict[str, str]) -> bytes:
        """One query's answer body (2xx), or a :class:`QueryError`, within the total deadline."""
        try:
            async with asyncio.timeout(self.cfg.timeout):
                status, body = await self._fetch(url, params)
        except QueryError:
            raise
        except TimeoutError:
            message = f"no answer within {self.cfg.timeout:g}s from {self.shown}"
            raise self._error("timeout", message) from None
        except (aiohttp.ClientSSLError, ssl.SSLError) as e:
            raise self._error("tls", f"TLS with {self.shown} failed: {_why(e)}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise self._error("refused", f"cannot reach {self.shown}: {_why(e)}") from None
        if not 200 <= status < 300:
            raise self._error("http", f"HTTP {status} from {self.shown}: {_excerpt(body)}")
        return body

    async def _fetch(self, url: str, params: dict[str, str]) -> tuple[int, bytes]:
        """One GET, no redirects followed; the body read up to the cap (a non-2xx one is cut there)."""
        resp = await self._session().get(url, params=params, allow_redirects=False)
        try:
            ok = 200 <= resp.status < 300
            if ok and resp.content_length is not None and resp.content_length > self.cfg.max_bytes:
                raise self._too_large(f"Content-Length {resp.content_length}")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(CHUNK):
                body += chunk
                if len(body) > self.cfg.max_bytes:
                    if ok:
                        raise self._too_large(f"more than {self.cfg.max_bytes} bytes")
                    break
            else:
                resp.release()
            return resp.status, bytes(body)
        finally:
            resp.close()  # a no-op after release(); otherwise drops the connection, half-read bodies too

    def _too_large(self, what: str) -> QueryError:
        return self._error("too-large", f"answer from {self.shown}: {what} (cap {self.cfg.max_bytes})")

    def _data(self, body: bytes) -> tuple[str, Any]:
        """(resultType, result) of a successful answer."""
        try:
            doc = json.loads(body)
        except ValueError:
            raise self._error("unparseable", f"not JSON from {self.shown}: {_excerpt(body)}") from None
        if isinstance(doc, dict) and doc.get("status") == "error":
            # A 200 saying error is not a Prometheus answer (it errs with 4xx/5xx): unparseable.
            message = f"status 'error' with HTTP 2xx from {self.shown}: {_excerpt(body)}"
            raise self._error("unparseable", message)
        data = doc.get("data") if isinstance(doc, dict) and doc.get("status") == "success" else None
        if not isinstance(data, dict) or not isinstance(data.get("resultType"), str) or "result" not in data:
            raise self._error("unparseable", f"not a Prometheus answer from {self.shown}: {_excerpt(body)}")
        return data["resultType"], data["result"]

    def _answer(self, body: bytes) -> float | None:
        """The one value of a successful answer; ``None`` for an empty vector."""
        kind, result = self._data(body)
        if kind == "vector":
            if not isinstance(result, list):
                raise self._error("unparseable", f"vector result is not a list from {self.shown}")
            if len(result) > 1:
                raise self._error("shape", f"{len(result)} series where one is expected from {self.shown}")
            if result:
                sample = result[0].get("value") if isinstance(result[0], dict) else None
                return self._sample(sample)
            return None
        if kind == "scalar":
            return self._sample(result)
        raise self._error("shape", f"resultType {kind!r} where a vector or a scalar is expected")

    def _series(self, body: bytes) -> list[float]:
        """The values of the one series of a range answer (a matrix); ``[]`` for none."""
        kind, result = self._data(body)
        if kind != "matrix":
            raise self._error("shape", f"resultType {kind!r} where a matrix is expected from {self.shown}")
        if not isinstance(result, list):
            raise self._error("unparseable", f"matrix result is not a list from {self.shown}")
        if len(result) > 1:
            raise self._error("shape", f"{len(result)} series where one is expected from {self.shown}")
        if not result:
            return []
        values = result[0].get("values") if isinstance(result[0], dict) else None
        if not isinstance(values, list):
            raise self._error("unparseable", f"a series without values from {self.shown}")
        return [self._sample(v) for v in values]

    def _sample(self, sample: Any) -> float:
        """The float of a ``[timestamp, "value"]`` pair."""
        value = sample[1] if isinstance(sample, list) and len(sample) == 2 else None
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except ValueError:
                pass
        raise self._error("unparseable", f"malformed sample {str(sample)[:EXCERPT]!r} from {self.shown}")

    async def close(self) -> None:
        if self.session is not None:
            session, self.session = self.session, None
            await session.close()


def _excerpt(body: bytes) -> str:
    """Prometheus' ``error`` field when the body has one, else the body's first characters."""
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            text = doc["error"]
    except ValueError:
        pass
    return " ".join(text[:EXCERPT].split()) or "(empty body)"


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:EXCERPT]  # QueryError makes it one line
