"""The Prometheus client answers or fails within its deadline, never retries, never reads more than its cap,
and never shows a credential -- played against real servers on 127.0.0.1 that misbehave on purpose."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from modeldeploy.promclient import PromClient, PromConfig, QueryError, redact


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]  # lower-cased names

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> str:
        return parse_qs(urlsplit(self.target).query)["query"][0]


# Each test is bounded; a client that hangs fails here rather than parking the run for the global 600 s.
pytestmark = pytest.mark.timeout(10)

LOCALHOST = ipaddress.ip_address("127.0.0.1")

Handler = Callable[[Request, asyncio.StreamWriter, asyncio.Event], Awaitable[None]]


class Server:
    """A raw HTTP server: every connection's request is recorded and handed to ``handler``."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler, self.tls = handler, tls
        self.requests: list[Request] = []
        self.stop = asyncio.Event()
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0, ssl=self.tls)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, target, _ = head[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in head[1:] if line)
            self.requests.append(Request(method, target, {k.lower(): v for k, v in headers.items()}))
            await self.handler(self.requests[-1], writer, self.stop)
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        self.stop.set()
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler, tls: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(handler, tls))
        await servers[-1].start()
        return servers[-1]

    yield start
    for server in servers:
        await server.close()


def answer(status: int = 200, body: bytes | dict = b"", headers: dict[str, str] | None = None) -> Handler:
    """A complete HTTP/1.1 answer, with Content-Length, after which the server hangs up."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body

    async def handle(req: Request, writer: asyncio.StreamWriter, stop: asyncio.Event) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(data)}\r\n{extra}Connection: close\r\n\r\n"
        writer.write(head.encode() + data)
        await writer.drain()

    return handle


async def never_answer(req: Request, writer: asyncio.StreamWriter, stop: asyncio.Event) -> None:
    await stop.wait()


async def drip(req: Request, writer: asyncio.StreamWriter, stop: asyncio.Event) -> None:
    """Headers at once, then one byte of a 100 kB body every 0.2 s, forever."""
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\nContent-Type: application/json\r\n\r\n")
    while not stop.is_set():
        writer.write(b" ")
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


async def endless_chunked(req: Request, writer: asyncio.StreamWriter, stop: asyncio.Event) -> None:
    """A chunked body without Content-Length that never ends, as fast as the client reads."""
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while not stop.is_set():
        writer.write(b"400\r\n" + b"[" * 1024 + b"\r\n")
        await writer.drain()


def success(result_type: str, result: Any) -> dict:
    return {"status": "success", "data": {"resultType": result_type, "result": result}}


def vector(*values: str) -> dict:
    return success("vector", [{"metric": {"i": str(i)}, "value": [1.7e9, v]} for i, v in enumerate(values)])


async def ask(url: str, promql: str = "up", **cfg: Any) -> float | None:
    client = PromClient(PromConfig(url, **cfg))
    try:
        return await client.instant(promql)
    finally:
        await client.close()


async def fails(url: str, promql: str = "up", **cfg: Any) -> QueryError:
    with pytest.raises(QueryError) as e:
        await ask(url, promql, **cfg)
    assert str(e.value) == f"{e.value.kind}: {e.value.message}"
    assert "\n" not in str(e.value)
    return e.value


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- answers ---------------------------------------------------------------------------------------------


async def test_one_series_is_its_value(serve):
    server = await serve(answer(body=vector("0.25")))
    assert await ask(server.url) == 0.25


async def test_the_query_goes_verbatim_to_api_v1_query_under_the_url_prefix(serve):
    server = await serve(answer(body=vector("1")))
    promql = 'sum(rate(x{job="a b",le="+Inf"}[5m])) + 1 / 2 & 3'
    await ask(server.url + "/prom/", promql)
    assert server.requests[0].method == "GET"
    assert server.requests[0].path == "/prom/api/v1/query"
    assert server.requests[0].query == promql


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
async def test_no_series_or_a_non_finite_value_is_no_data(serve, value):
    assert await ask((await serve(answer(body=vector()))).url) is None
    assert await ask((await serve(answer(body=vector(value)))).url) is None
    assert await ask((await serve(answer(body=success("scalar", [1.7e9, value])))).url) is None


async def test_a_scalar_is_its_value(serve):
    server = await serve(answer(body=success("scalar", [1.7e9, "42.5"])))
    assert await ask(server.url) == 42.5


async def test_two_series_where_one_is_expected_is_a_shape_error(serve):
    e = await fails((await serve(answer(body=vector("1", "2")))).url)
    assert e.kind == "shape"
    assert "2 series where one is expected" in e.message


@pytest.mark.parametrize("result_type", ["matrix", "string"])
async def test_a_matrix_or_a_string_is_a_shape_error(serve, result_type):
    server = await serve(answer(body=success(result_type, [])))
    assert (await fails(server.url)).kind == "shape"


@pytest.mark.parametrize(
    "body",
    [
        b"<html>\n<body>Bad gateway</body>\n</html>",
        b'{"status": "success"}',
        b'{"status": "success", "data": {"resultType": "vector"}}',
        json.dumps(success("vector", [{"metric": {}, "value": [1, "one"]}])).encode(),
        json.dumps(success("scalar", "7")).encode(),
    ],
    ids=["html", "no-data", "no-result", "value-not-a-number", "scalar-not-a-pair"],
)
async def test_a_body_that_is_not_a_prometheus_answer_is_unparseable(serve, body):
    assert (await fails((await serve(answer(body=body))).url)).kind == "unparseable"


async def test_a_200_saying_error_is_unparseable_and_shows_the_error(serve):
    # Prometheus errs with 4xx/5xx; a 2xx carrying {"status": "error"} is not one of its answers.
    body = {"status": "error", "errorType": "execution", "error": "query timed out"}
    e = await fails((await serve(answer(body=body))).url)
    assert e.kind == "unparseable"
    assert "query timed out" in e.message


# -- HTTP errors, no retries -----------------------------------------------------------------------------


async def test_a_503_with_retry_after_fails_at_once_after_one_request(serve):
    server = await serve(answer(503, b"overloaded\nplease wait", {"Retry-After": "3"}))
    started = time.monotonic()
    e = await fails(server.url)
    assert time.monotonic() - started < 1.0  # the old client slept 3 x 3 s
    assert len(server.requests) == 1
    assert e.kind == "http"
    assert e.message == f"HTTP 503 from {server.url}: overloaded please wait"


async def test_an_http_error_shows_prometheus_error_field(serve):
    body = {"status": "error", "errorType": "bad_data", "error": 'parse error at char 4: unexpected "}"'}
    e = await fails((await serve(answer(400, body))).url)
    assert e.kind == "http"
    assert e.message.endswith(': parse error at char 4: unexpected "}"')


async def test_a_long_error_body_is_shown_cut_to_200_characters(serve):
    e = await fails((await serve(answer(500, b"x" * 5000))).url, max_bytes=1000)
    assert e.kind == "http"
    assert e.message.endswith(": " + "x" * 200)


async def test_a_redirect_is_not_followed(serve):
    target = await serve(answer(body=vector("1")))
    server = await serve(answer(302, b"", {"Location": target.url + "/api/v1/query?query=up"}))
    assert (await fails(server.url)).kind == "http"
    assert target.requests == []


# -- deadlines -------------------------------------------------------------------------------------------


async def test_a_server_that_never_answers_times_out_at_the_deadline(serve):
    server = await serve(never_answer)
    started = time.monotonic()
    e = await fails(server.url, timeout=0.5)
    assert 0.4 < time.monotonic() - started < 2.0
    assert e.kind == "timeout"
    assert e.message == f"no answer within 0.5s from {server.url}"


async def test_a_body_dripping_faster_than_the_deadline_still_times_out_at_the_deadline(serve):
    server = await serve(drip)  # a byte every 0.2 s: a per-read timeout of 0.5 s would never fire
    started = time.monotonic()
    e = await fails(server.url, timeout=0.5)
    assert time.monotonic() - started < 1.5
    assert e.kind == "timeout"


async def test_a_refused_connection_is_refused():
    started = time.monotonic()
    e = await fails(f"http://127.0.0.1:{closed_port()}", timeout=5)
    assert time.monotonic() - started < 2.0
    assert e.kind == "refused"


# -- the size cap ----------------------------------------------------------------------------------------


async def test_a_body_over_the_cap_is_too_large(serve):
    body = json.dumps(vector("1") | {"padding": "x" * 10_000}).encode()
    e = await fails((await serve(answer(body=body))).url, max_bytes=1000)
    assert e.kind == "too-large"
    assert "Content-Length" in e.message  # rejected before reading


async def test_an_endless_body_without_content_length_is_cut_at_the_cap(serve):
    started = time.monotonic()
    e = await fails((await serve(endless_chunked)).url, max_bytes=100_000, timeout=5)
    assert time.monotonic() - started < 2.0
    assert e.kind == "too-large"


async def test_a_body_just_under_the_cap_is_read(serve):
    body = json.dumps(vector("3")).encode()
    assert await ask((await serve(answer(body=body))).url, max_bytes=len(body)) == 3.0


# -- credentials -----------------------------------------------------------------------------------------


async def test_credentials_in_the_url_are_sent_as_basic_auth(serve):
    server = await serve(answer(body=vector("1")))
    await ask(server.url.replace("://", "://user:s3cret@"))
    assert server.requests[0].headers["authorization"] == "Basic " + base64.b64encode(b"user:s3cret").decode()


async def test_no_failure_shows_the_password(serve):
    echo = await serve(answer(401, b"wrong password s3cret for user"))
    silent = await serve(never_answer)
    for url in (echo.url, silent.url, f"http://127.0.0.1:{closed_port()}"):
        e = await fails(url.replace("://", "://user:s3cret@") + "/prom", timeout=0.3)
        assert "s3cret" not in str(e)
        assert f"{url}/prom" in e.message


def test_redact_drops_the_userinfo_and_keeps_the_rest():
    assert redact("https://user:s3cret@prom.example:9090/prom?x=1") == "https://prom.example:9090/prom?x=1"
    assert redact("http://prom:9090") == "http://prom:9090"


async def test_a_bearer_token_is_sent_and_never_shown(serve):
    server = await serve(answer(403, b"token t0ken-abc is not allowed"))
    e = await fails(server.url, bearer_token="t0ken-abc")
    assert server.requests[0].headers["authorization"] == "Bearer t0ken-abc"
    assert e.kind == "http"
    assert "t0ken-abc" not in str(e)


# -- TLS -------------------------------------------------------------------------------------------------


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, its own CA: (cert.pem, key.pem) in ``directory``."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(LOCALHOST)]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    (directory / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return directory / f"{name}.pem", directory / f"{name}.key"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"), "prometheus")


@pytest.fixture
async def tls_server(serve, certificate) -> Server:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    return await serve(answer(body=vector("7")), context)


async def test_https_with_an_unknown_certificate_is_a_tls_error(tls_server):
    e = await fails(tls_server.url, timeout=2)
    assert e.kind == "tls"
    assert tls_server.requests == []


async def test_https_with_the_certificate_in_ca_file_is_answered(tls_server, certificate):
    assert await ask(tls_server.url, ca_file=str(certificate[0])) == 7.0


async def test_https_with_insecure_skip_verify_is_answered(tls_server):
    assert await ask(tls_server.url, insecure_skip_verify=True) == 7.0


async def test_a_ca_file_that_does_not_match_is_a_tls_error(tls_server, tmp_path):
    other, _ = self_signed(tmp_path, "other")  # also for 127.0.0.1, but another key
    assert (await fails(tls_server.url, ca_file=str(other), timeout=2)).kind == "tls"


# -- the client itself -----------------------------------------------------------------------------------


async def test_one_client_asks_many_times_and_closes(serve):
    server = await serve(answer(body=vector("2")))
    client = PromClient(PromConfig(server.url))
    try:
        assert [await client.instant("up") for _ in range(3)] == [2.0, 2.0, 2.0]
    finally:
        await client.close()
    assert len(server.requests) == 3


@pytest.mark.parametrize("url", ["prom:9090", "ftp://prom", "http://"])
def test_a_url_that_is_not_http_is_refused_at_construction(url):
    with pytest.raises(ValueError):
        PromClient(PromConfig(url))


def test_credentials_in_the_url_and_a_bearer_token_together_are_refused_at_construction():
    with pytest.raises(ValueError, match="mutually exclusive"):
        PromClient(PromConfig("http://user:s3cret@prom:9090", bearer_token="t0ken"))


# -- range queries (the statistical judge's samples) ----------------------------------------------------


def matrix(*series: list[str]) -> dict:
    return success(
        "matrix",
        [
            {"metric": {"i": str(i)}, "values": [[1.7e9 + k, v] for k, v in enumerate(s)]}
            for i, s in enumerate(series)
        ],
    )


async def ask_range(url: str, promql: str = "up") -> list[float]:
    client = PromClient(PromConfig(url))
    try:
        return await client.range(promql, 1000.0, 1030.0, 2.0)
    finally:
        await client.close()


async def test_a_range_query_is_the_values_of_its_one_series_without_nan(serve):
    server = await serve(answer(body=matrix(["1.5", "NaN", "2.5", "+Inf", "3"])))
    assert await ask_range(server.url + "/prom") == [1.5, 2.5, 3.0]
    req = server.requests[0]
    assert req.path == "/prom/api/v1/query_range"
    assert parse_qs(urlsplit(req.target).query) == {
        "query": ["up"],
        "start": ["1000.000"],
        "end": ["1030.000"],
        "step": ["2"],
    }


async def test_a_range_query_without_a_series_is_no_samples(serve):
    assert await ask_range((await serve(answer(body=matrix()))).url) == []


async def test_a_range_query_answering_two_series_or_a_vector_is_a_shape_error(serve):
    client_url = (await serve(answer(body=matrix(["1"], ["2"])))).url
    with pytest.raises(QueryError, match="2 series where one is expected"):
        await ask_range(client_url)
    with pytest.raises(QueryError) as e:
        await ask_range((await serve(answer(body=vector("1")))).url)
    assert e.value.kind == "shape"


async def test_a_range_query_with_a_malformed_value_is_unparseable(serve):
    with pytest.raises(QueryError) as e:
        await ask_range((await serve(answer(body=matrix(["one"])))).url)
    assert e.value.kind == "unparseable"
