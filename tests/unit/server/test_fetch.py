"""``python -m modelserver.fetch`` against an in-process S3 server (moto) and small stub servers.

moto serves the real protocol (HEAD, LIST, ranged GETs, multipart ETags); the stubs answer what moto does
not do: a 403 for any credentials, 500s for ever, a socket that accepts and never answers. The node cache
is tested in test_fetch_cache.py.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fetch_support import (
    ACCESS_KEY,
    MODEL,
    SECRET_KEY,
    MiB,
    json_lines,
    no_staging_left,
    opts,
    put_tree,
    read_tree,
    run_cli,
    write_tree,
)
from modelserver import fetch as fetch_mod
from modelserver import s3_stream, s3_transfer, s3_verify
from modelserver.fetch import fetch_model, main, parse_size
from modelserver.fetch_errors import (
    AccessDenied,
    ChecksumMismatch,
    DownloadTimeout,
    FetchError,
    InvalidURI,
    NotFound,
    TooLarge,
    redact,
)
from modelserver.loader import dir_digest
from modelserver.storage_s3 import ClientOptions, S3Settings, TransferOptions, parse_s3_uri

# ---------------------------------------------------------------------------------------------- basics


def test_prefix_directory(s3_env, s3, bucket, tmp_path: Path):
    put_tree(s3, bucket, "minilm/v1", MODEL)
    s3.put_object(Bucket=bucket, Key="minilm/v1/empty/", Body=b"")  # a "directory marker"
    s3.put_object(Bucket=bucket, Key="minilm/v10/other.bin", Body=b"not part of v1")
    dest = tmp_path / "models"
    res = fetch_model(f"s3://{bucket}/minilm/v1", dest, opts())
    assert read_tree(dest) == MODEL
    assert res.files == 4 and res.bytes == sum(len(v) for v in MODEL.values()) and res.source == "download"
    no_staging_left(dest)
    # a trailing slash is the same prefix
    dest2 = tmp_path / "models2"
    fetch_model(f"s3://{bucket}/minilm/v1/", dest2, opts())
    assert read_tree(dest2) == MODEL


def test_single_object_keeps_its_basename(s3_env, s3, bucket, tmp_path: Path):
    data = os.urandom(MiB)
    s3.put_object(Bucket=bucket, Key="tensors/v2/model.pt", Body=data)
    dest = tmp_path / "mnt"
    dest.mkdir()  # an existing directory, as a volume mount point
    (dest / "stale.txt").write_text("from an earlier fetch")
    res = fetch_model(
        f"s3://{bucket}/tensors/v2/model.pt", dest, opts(sha256=hashlib.sha256(data).hexdigest())
    )
    assert read_tree(dest) == {"model.pt": data}  # replaced, not merged
    assert res.sha256 == hashlib.sha256(data).hexdigest()
    no_staging_left(dest)


def test_large_objects_ranged_and_multipart_etag(s3_env, s3, bucket, tmp_path: Path, monkeypatch, caplog):
    """An object over the threshold comes in ranged parts; a multipart upload's ETag is checked too."""
    from boto3.s3.transfer import TransferConfig

    big = os.urandom(13 * MiB + 5)
    src = tmp_path / "big.bin"
    src.write_bytes(big)
    s3.upload_file(
        str(src),
        bucket,
        "big/weights.bin",
        Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
    )
    assert s3.head_object(Bucket=bucket, Key="big/weights.bin")["ETag"].strip('"').endswith("-3")
    s3.put_object(Bucket=bucket, Key="big/small.bin", Body=os.urandom(7 * MiB))
    dest = tmp_path / "out"

    def no_reread(*a: Any, **kw: Any) -> Any:
        raise AssertionError("the ETag check read the file again")

    for where in (s3_transfer, s3_verify):  # the two places a file is read again
        monkeypatch.setattr(where, "hash_file", no_reread)
    small_chunks = TransferOptions(threshold=5 * MiB, chunk_size=6 * MiB, concurrency=4)
    with caplog.at_level("INFO", logger="modelserver.fetch"):
        fetch_model(f"s3://{bucket}/big", dest, opts(transfer=small_chunks))
    assert (dest / "weights.bin").read_bytes() == big
    assert (dest / "small.bin").stat().st_size == 7 * MiB
    # both checked as they streamed: the multipart one part by part (5 MiB ranges, not 6), the other whole
    checked = [r for r in caplog.records if getattr(r, "event", "") == "store_checksums"]
    assert checked and checked[-1].verified == 2
    assert sum(checked[-1].checks.values()) == 2 and "unchecked" not in checked[-1].checks  # how, by kind


def hashers_used_and_no_reread(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The algorithms the download's stream hashers are made for, in order; reading a file again (the
    check's fallback) fails the test."""
    used: list[str] = []
    real = s3_stream.new_hasher

    def recording(algorithm: str) -> Any:
        used.append(algorithm)
        return real(algorithm)

    def no_reread(*a: Any, **kw: Any) -> Any:
        raise AssertionError("the check read the file again")

    monkeypatch.setattr(s3_stream, "new_hasher", recording)
    for where in (s3_transfer, s3_verify):  # the two places a file is read again
        monkeypatch.setattr(where, "hash_file", no_reread)
    return used


def test_flexible_crc32_checked_from_the_ranges_with_no_md5(s3_env, s3, bucket, tmp_path: Path, monkeypatch):
    """Objects with a CRC32 flexible checksum (what current SDKs upload) are checked with it: a single-part
    object fetched in ranges of any size (the ranges' CRCs combined), a multipart one part by part, a small
    one in one GET; no MD5 is computed and no file is read again."""
    import modelserver.storage_s3 as s3mod
    from boto3.s3.transfer import TransferConfig

    big, multi, small = os.urandom(9 * MiB + 3), os.urandom(11 * MiB), b"tiny" * 100
    s3.put_object(Bucket=bucket, Key="m/big.bin", Body=big)
    (tmp_path / "mp").write_bytes(multi)
    s3.upload_file(
        str(tmp_path / "mp"),
        bucket,
        "m/multi.bin",
        Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
    )
    s3.put_object(Bucket=bucket, Key="m/small.bin", Body=small)
    used = hashers_used_and_no_reread(monkeypatch)
    client = s3mod.make_client(S3Settings.from_env(), ClientOptions())
    listing = s3mod.resolve(client, parse_s3_uri(f"s3://{bucket}/m/"))
    assert all(o.checksum_algorithms == ("CRC32",) for o in listing.objects)
    into = tmp_path / "out"
    into.mkdir()
    digests = s3mod.download(
        client,
        listing,
        into,
        opts=TransferOptions(threshold=2 * MiB, chunk_size=2 * MiB, concurrency=4),
        progress=s3mod.Progress(listing.total_bytes),
        want_sha256=False,
        deadline=time.monotonic() + 60,
    )
    assert {rel: d.verified for rel, d in digests.items()} == {
        "big.bin": "crc32",
        "multi.bin": "crc32-composite",
        "small.bin": "crc32",
    }
    assert read_tree(into) == {"big.bin": big, "multi.bin": multi, "small.bin": small}
    assert "MD5" not in used and used.count("CRC32") == 5 + 3 + 1  # big in 2 MiB ranges, 3 parts, 1 GET


@pytest.mark.parametrize("algorithm", ["CRC64NVME", "CRC32C"])
def test_crc64nvme_and_crc32c_objects_are_checked_from_the_ranges(
    s3_env, s3, bucket, tmp_path: Path, monkeypatch, algorithm: str
):
    """The other CRCs a store lists (CRC64NVME is S3's default for new objects) are checked the same way,
    from the ranges' CRCs combined by awscrt, not by falling back to the ETag (no MD5, no second read)."""
    import modelserver.storage_s3 as s3mod

    big, small = os.urandom(7 * MiB + 11), b"tiny" * 100
    s3.put_object(Bucket=bucket, Key="m/big.bin", Body=big, ChecksumAlgorithm=algorithm)
    s3.put_object(Bucket=bucket, Key="m/small.bin", Body=small, ChecksumAlgorithm=algorithm)
    used = hashers_used_and_no_reread(monkeypatch)
    client = s3mod.make_client(S3Settings.from_env(), ClientOptions())
    listing = s3mod.resolve(client, parse_s3_uri(f"s3://{bucket}/m/"))
    assert all(algorithm in o.checksum_algorithms for o in listing.objects)
    into = tmp_path / "out"
    into.mkdir()
    digests = s3mod.download(
        client,
        listing,
        into,
        opts=TransferOptions(threshold=2 * MiB, chunk_size=2 * MiB, concurrency=4),
        progress=s3mod.Progress(listing.total_bytes),
        want_sha256=False,
        deadline=time.monotonic() + 60,
    )
    label = algorithm.lower()
    assert {rel: d.verified for rel, d in digests.items()} == {"big.bin": label, "small.bin": label}
    assert read_tree(into) == {"big.bin": big, "small.bin": small}
    assert "MD5" not in used and used.count(algorithm) == 4 + 1  # big in 2 MiB ranges, small in 1 GET


def test_a_flexible_checksum_mismatch_is_settled_by_the_etag(s3_env, s3, bucket, tmp_path: Path, caplog):
    """A store whose flexible checksum we read wrongly does not fail a good download: the ETag (the file
    read again) decides. Bytes that match neither are a ChecksumMismatch."""
    import modelserver.storage_s3 as s3mod
    from modelserver.store_checksums import StoreChecksum

    data = os.urandom(1000)
    s3.put_object(Bucket=bucket, Key="one.bin", Body=data)
    client = s3mod.make_client(S3Settings.from_env(), ClientOptions())
    obj = s3mod.resolve(client, parse_s3_uri(f"s3://{bucket}/one.bin")).objects[0]
    wrong = StoreChecksum("CRC32", "FULL_OBJECT", "AAAAAA==")
    plan = s3mod.Plan(obj, None, "flex", None, "CRC32", wrong)
    hashes = s3mod.StreamHashes()
    hashes._parts[(bucket, obj.key)] = {0: (zlib.crc32(data).to_bytes(4, "big"), len(data))}
    good = tmp_path / "good.bin"
    good.write_bytes(data)
    with caplog.at_level("WARNING", logger="modelserver.fetch"):
        assert (
            s3_transfer._verify(client, bucket, plan, good, hashes, want_sha256=False).verified == "etag-md5"
        )
    assert any("not understood; the ETag matched" in r.getMessage() for r in caplog.records)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(ChecksumMismatch, match="does not match the store's ETag"):
        s3_transfer._verify(client, bucket, plan, bad, hashes, want_sha256=False)


def test_prefix_sha256_is_the_directory_digest(s3_env, s3, bucket, tmp_path: Path):
    put_tree(s3, bucket, "m", MODEL)
    local = tmp_path / "local"
    write_tree(local, MODEL)
    expected = dir_digest(local)  # what `python -m modelserver digest DIR` prints
    dest = tmp_path / "dest"
    res = fetch_model(f"s3://{bucket}/m", dest, opts(sha256=expected))
    assert res.sha256 == expected == dir_digest(dest)


@pytest.mark.parametrize("kind", ["object", "prefix"])
def test_sha256_mismatch_leaves_nothing(s3_env, s3, bucket, tmp_path: Path, kind: str):
    put_tree(s3, bucket, "m", MODEL)
    uri = f"s3://{bucket}/m/model.safetensors" if kind == "object" else f"s3://{bucket}/m"
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "previous.bin").write_bytes(b"the model before")
    with pytest.raises(ChecksumMismatch, match="does not match the expected " + "0" * 64):
        fetch_model(uri, dest, opts(sha256="0" * 64))
    assert read_tree(dest) == {"previous.bin": b"the model before"}  # untouched
    no_staging_left(dest)
    fresh = tmp_path / "fresh"
    with pytest.raises(ChecksumMismatch):
        fetch_model(uri, fresh, opts(sha256="0" * 64))
    assert not fresh.exists()
    no_staging_left(fresh)


def test_verify_file_rereads_against_the_etag(s3_env, s3, bucket, tmp_path: Path):
    """The fallback check (the file read again): a single-part MD5 and a multipart ETag (part sizes from
    HEAD ?partNumber)."""
    import modelserver.storage_s3 as s3mod
    from boto3.s3.transfer import TransferConfig

    data = os.urandom(11 * MiB)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    s3.upload_file(
        str(src),
        bucket,
        "mp.bin",
        Config=TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB),
    )
    s3.put_object(Bucket=bucket, Key="sp.bin", Body=data)
    client = s3mod.make_client(S3Settings.from_env(), ClientOptions())
    listing = s3mod.resolve(client, parse_s3_uri(f"s3://{bucket}/"))
    objs = {o.key: o for o in listing.objects}
    for key, how in (("mp.bin", "etag-multipart"), ("sp.bin", "etag-md5")):
        d = s3mod.verify_file(client, bucket, objs[key], src, want_sha256=True)
        assert d.verified == how and d.sha256 == hashlib.sha256(data).hexdigest()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    for key in ("mp.bin", "sp.bin"):
        with pytest.raises(ChecksumMismatch, match="does not match the store's ETag"):
            s3mod.verify_file(client, bucket, objs[key], bad, want_sha256=False)


def test_not_found(s3_env, s3, bucket, tmp_path: Path):
    put_tree(s3, bucket, "present", {"a.bin": b"a"})
    with pytest.raises(NotFound, match=r"no object .* and no objects under"):
        fetch_model(f"s3://{bucket}/absent", tmp_path / "d", opts())
    with pytest.raises(NotFound, match="no objects under"):
        fetch_model(f"s3://{bucket}/absent/", tmp_path / "d", opts())
    with pytest.raises(NotFound, match="bucket does not exist"):
        fetch_model(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/m", tmp_path / "d", opts())
    assert not (tmp_path / "d").exists()


def test_too_large_fails_before_downloading(s3_env, s3, bucket, tmp_path: Path, monkeypatch):
    put_tree(s3, bucket, "m", MODEL)

    def no_download(*a: Any, **kw: Any) -> Any:
        raise AssertionError("downloaded although the listing is over the limit")

    monkeypatch.setattr(fetch_mod, "download", no_download)
    with pytest.raises(TooLarge, match="over the limit of 1048576 bytes"):
        fetch_model(f"s3://{bucket}/m", tmp_path / "d", opts(max_bytes=MiB))
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "uri",
    [
        "gs://bucket/m",
        "s3://",
        "s3:///key",
        "s3://b/../etc",
        "s3://bucket/m?versionId=1",
        "file:///mnt/models",
    ],
)
def test_invalid_uri(uri: str):
    with pytest.raises(InvalidURI):
        parse_s3_uri(uri)


def test_settings_from_env(tmp_path: Path):
    s = S3Settings.from_env({"S3_ENDPOINT": "minio.local:9000", "S3_USE_HTTPS": "0"})
    assert s.endpoint_url == "http://minio.local:9000" and s.addressing_style == "path" and s.verify is True
    s = S3Settings.from_env(
        {"S3_ENDPOINT": "https://s3.example", "S3_VERIFY_SSL": "0", "AWS_DEFAULT_REGION": "eu"}
    )
    assert s.endpoint_url == "https://s3.example" and s.verify is False and s.region == "eu"
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    s = S3Settings.from_env({"AWS_CA_BUNDLE": str(ca), "S3_ADDRESSING_STYLE": "virtual"})
    assert s.verify == str(ca) and s.addressing_style == "virtual" and s.endpoint_url is None
    assert S3Settings.from_env({}).addressing_style == "auto"  # AWS: botocore decides
    with pytest.raises(FetchError, match="AWS_CA_BUNDLE"):
        S3Settings.from_env({"AWS_CA_BUNDLE": str(tmp_path / "missing.pem")})
    with pytest.raises(InvalidURI, match="S3_VERIFY_SSL"):
        S3Settings.from_env({"S3_VERIFY_SSL": "maybe"})
    with pytest.raises(InvalidURI, match="S3_ADDRESSING_STYLE"):
        S3Settings.from_env({"S3_ADDRESSING_STYLE": "dns"})


def test_parse_size():
    assert parse_size("1234") == 1234
    assert parse_size("10Gi") == 10 << 30
    assert parse_size("500M") == 500_000_000
    assert parse_size("1.5Ki") == 1536


def test_redact():
    env = {"AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_ACCESS_KEY_ID": ACCESS_KEY}
    text = f"key {ACCESS_KEY} secret {SECRET_KEY} url http://user:pw@host/x?X-Amz-Signature=abc123&y=1"
    out = redact(text, env)
    assert ACCESS_KEY not in out and SECRET_KEY not in out and "pw@" not in out and "abc123" not in out


# ---------------------------------------------------------------------------------------------- stub servers


class _Stub(http.server.BaseHTTPRequestHandler):
    mode = "deny"
    requests: list[str]
    hang: threading.Event

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        type(self).requests.append(f"{self.command} {self.path}")
        if self.mode == "deny":
            # S3's answer to an unknown access key (the message names it: the fetch must not repeat it)
            body = (
                "<?xml version='1.0' encoding='UTF-8'?><Error><Code>InvalidAccessKeyId</Code>"
                f"<Message>The AWS Access Key Id {ACCESS_KEY} you provided does not exist in our records."
                "</Message>"
                f"<AWSAccessKeyId>{ACCESS_KEY}</AWSAccessKeyId></Error>"
            ).encode()
            self._send(403, body, {"Content-Type": "application/xml"})
        elif self.mode == "error":
            body = b"<Error><Code>InternalError</Code><Message>internal error</Message></Error>"
            self._send(500, body, {"Content-Type": "application/xml"})
        elif self.mode == "tamper":
            # the store's ETag is the MD5 of b"A" * 1000, the bytes it sends are not
            etag = '"' + hashlib.md5(b"A" * 1000).hexdigest() + '"'
            self._send(200, b"B" * 1000, {"ETag": etag, "Content-Type": "application/octet-stream"})
        elif self.mode == "tamper-crc":
            # ETag and CRC32 of b"A" * 1000 (the store's records), the bytes it sends are not
            good = b"A" * 1000
            crc = base64.b64encode(zlib.crc32(good).to_bytes(4, "big")).decode()
            headers = {
                "ETag": '"' + hashlib.md5(good).hexdigest() + '"',
                "x-amz-checksum-crc32": crc,
                "x-amz-checksum-type": "FULL_OBJECT",
                "Content-Type": "application/octet-stream",
            }
            self._send(200, b"B" * 1000, headers)
        elif self.mode == "hang-get":
            if self.command == "HEAD":
                self._send(200, b"", {"Content-Length": "10", "ETag": '"' + "1" * 32 + '"'})
            else:
                type(self).hang.wait(30)

    do_GET = do_HEAD = _handle


@pytest.fixture
def stub() -> Iterator[Callable[[str], tuple[str, type[_Stub]]]]:
    servers: list[http.server.ThreadingHTTPServer] = []
    hang = threading.Event()

    def start(mode: str) -> tuple[str, type[_Stub]]:
        handler = type("Handler", (_Stub,), {"mode": mode, "requests": [], "hang": hang})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", handler

    yield start
    hang.set()
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_access_denied(s3_env, stub, tmp_path: Path, monkeypatch):
    url, _ = stub("deny")
    monkeypatch.setenv("S3_ENDPOINT", url)
    with pytest.raises(AccessDenied) as e:
        fetch_model("s3://models/m/v1", tmp_path / "d", opts())
    line = e.value.line()
    assert line.startswith("AccessDenied: s3://models/m/v1/: access denied by http://127.0.0.1:")
    assert "InvalidAccessKeyId (HTTP 403)" in line and ACCESS_KEY not in line


def test_transient_errors_are_retried_then_reported(s3_env, stub, tmp_path: Path, monkeypatch):
    url, handler = stub("error")
    monkeypatch.setenv("S3_ENDPOINT", url)
    o = opts(client=ClientOptions(connect_timeout=2, read_timeout=5, max_attempts=3))
    with pytest.raises(FetchError) as e:
        fetch_model("s3://models/m.bin", tmp_path / "d", o)
    assert e.value.reason == "FetchFailed" and "(HTTP 500)" in str(e.value)
    heads = [r for r in handler.requests if r.startswith("HEAD")]
    assert len(heads) == 3  # botocore's standard retries: 3 attempts, with backoff


@pytest.mark.parametrize(
    "mode,reason",
    [
        ("tamper", "does not match the store's ETag"),  # its ETag (MD5): ChecksumMismatch without --sha256
        ("tamper-crc", "store's checksum"),  # its CRC32 (a flexible checksum) too
    ],
)
def test_tampered_object_is_a_checksum_mismatch(s3_env, stub, tmp_path: Path, monkeypatch, mode, reason):
    """Bytes that do not match the store's record of them: ChecksumMismatch, nothing left behind."""
    url, _ = stub(mode)
    monkeypatch.setenv("S3_ENDPOINT", url)
    dest = tmp_path / "d"
    with pytest.raises(ChecksumMismatch, match=reason):
        fetch_model("s3://models/m/model.bin", dest, opts())
    assert not dest.exists()
    no_staging_left(dest)


def test_etag_check_off(s3_env, stub, tmp_path: Path, monkeypatch):
    """--etag-check off: no MD5 work (the tampered bytes pass; --sha256 is what guards then)."""
    url, _ = stub("tamper")
    monkeypatch.setenv("S3_ENDPOINT", url)
    fetch_model("s3://models/m/model.bin", tmp_path / "d", opts(transfer=TransferOptions(etag_check=False)))
    assert (tmp_path / "d" / "model.bin").read_bytes() == b"B" * 1000


@pytest.mark.timeout(60)
def test_download_stall_is_bounded(s3_env, stub, tmp_path: Path, monkeypatch):
    """A store that lists the object and then never sends its bytes: DownloadTimeout, nothing left."""
    url, _ = stub("hang-get")
    monkeypatch.setenv("S3_ENDPOINT", url)
    o = opts(timeout=3.0, client=ClientOptions(connect_timeout=1, read_timeout=1, max_attempts=2))
    with pytest.raises(DownloadTimeout):
        fetch_model("s3://models/m.bin", tmp_path / "d", o)
    assert not (tmp_path / "d").exists()
    no_staging_left(tmp_path / "d")


# ---------------------------------------------------------------------------------------------- the CLI


def test_cli_timeout_against_a_silent_endpoint(tmp_path: Path):
    """A socket that accepts connections and never answers: the fetch ends at --timeout, DownloadTimeout."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # never accepted: the kernel completes the handshake, nobody ever reads
    try:
        env = {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "S3_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        term = tmp_path / "termination-log"
        r = run_cli(
            [
                "--uri",
                "s3://models/m/v1",
                "--dest",
                str(tmp_path / "d"),
                "--timeout",
                "3",
                "--read-timeout",
                "30",
                "--termination-log",
                str(term),
            ],
            env,
            timeout=30,
        )
    finally:
        silent.close()
    assert r.returncode == 6, r.stdout + r.stderr
    assert term.read_text().startswith("DownloadTimeout: s3://models/m/v1: not fetched within --timeout 3s")
    assert "\n" not in term.read_text().strip()
    assert not (tmp_path / "d").exists()


def test_cli_unreachable_endpoint(tmp_path: Path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens: connection refused
    env = {"S3_ENDPOINT": f"127.0.0.1:{port}", "S3_USE_HTTPS": "0", "AWS_EC2_METADATA_DISABLED": "true"}
    term = tmp_path / "t"
    r = run_cli(
        [
            "--uri",
            "s3://bkt/k",
            "--dest",
            str(tmp_path / "d"),
            "--max-attempts",
            "2",
            "--termination-log",
            str(term),
        ],
        env,
    )
    assert r.returncode == 6, r.stdout + r.stderr
    assert term.read_text().startswith(f"DownloadTimeout: s3://bkt/k: cannot reach http://127.0.0.1:{port}")


def test_cli_invalid_arguments(tmp_path: Path):
    term = tmp_path / "t"
    r = run_cli(["--uri", "gs://b/k", "--dest", str(tmp_path / "d"), "--termination-log", str(term)], {})
    assert r.returncode == 2 and term.read_text().startswith("InvalidURI: 'gs://b/k' is not an s3:// URI")
    r = run_cli(
        [
            "--uri",
            "s3://bkt/k",
            "--dest",
            str(tmp_path / "d"),
            "--timeout",
            "soon",
            "--termination-log",
            str(term),
        ],
        {},
    )
    assert r.returncode == 2 and term.read_text().startswith(
        "InvalidURI: invalid arguments: argument --timeout"
    )


def test_cli_success_progress_and_no_credentials_in_output(s3_env, s3, bucket, tmp_path: Path, stub):
    put_tree(s3, bucket, "m", {**MODEL, "extra.bin": os.urandom(6 * MiB)})
    dest = tmp_path / "models"
    r = run_cli(
        [
            "--uri",
            f"s3://{bucket}/m",
            "--dest",
            str(dest),
            "--progress-interval",
            "0.01",
            "--chunk-size",
            "5Mi",
        ],
        s3_env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    events = json_lines(r.stdout)
    progress = [e for e in events if e.get("event") == "progress"]
    assert progress and progress[-1]["bytes"] == progress[-1]["total_bytes"]
    assert {"rate_bytes_per_s", "eta_s", "percent"} <= set(progress[-1])
    assert events[-1]["event"] == "done" and events[-1]["files"] == 5
    outputs = [r.stdout + r.stderr]
    # and a failure that the store words with the access key in it
    url, _ = stub("deny")
    term = tmp_path / "term"
    r = run_cli(
        ["--uri", f"s3://{bucket}/m", "--dest", str(tmp_path / "x"), "--termination-log", str(term)],
        {**s3_env, "S3_ENDPOINT": url},
    )
    assert r.returncode == 3
    assert term.read_text().startswith("AccessDenied: ")
    outputs += [r.stdout + r.stderr, term.read_text()]
    for text in outputs:
        assert SECRET_KEY not in text and ACCESS_KEY not in text


@pytest.fixture
def root_logging() -> Iterator[None]:

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_main_in_process(s3_env, s3, bucket, tmp_path: Path, root_logging):
    s3.put_object(Bucket=bucket, Key="one/model.pt", Body=b"torchscript bytes")
    assert main(["--uri", f"s3://{bucket}/one/model.pt", "--dest", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "model.pt").read_bytes() == b"torchscript bytes"
    term = tmp_path / "t"
    code = main(
        ["--uri", f"s3://{bucket}/none", "--dest", str(tmp_path / "e"), "--termination-log", str(term)]
    )
    assert code == 4 and term.read_text().startswith(f"NotFound: no object s3://{bucket}/none")
