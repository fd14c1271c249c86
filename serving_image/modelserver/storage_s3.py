"""S3 (and S3-compatible stores) for the model fetch: settings, listing, parallel download, checksums.

Settings come from the environment, with KServe's names:

* ``S3_ENDPOINT``: ``host[:port]`` or a URL (``http(s)://host[:port]``); unset: AWS S3 (or boto3's own
  ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``).
* ``S3_USE_HTTPS``: ``1``/``0`` (default ``1``); the scheme of an ``S3_ENDPOINT`` without one.
* ``S3_VERIFY_SSL``: ``0`` turns TLS certificate verification off (default ``1``).
* ``AWS_CA_BUNDLE``: a PEM file of CAs to trust for the endpoint.
* ``AWS_DEFAULT_REGION`` (or ``AWS_REGION``): default ``us-east-1``.
* ``S3_ADDRESSING_STYLE``: ``path``, ``virtual`` or ``auto`` (default): with ``S3_ENDPOINT`` set, ``auto``
  means ``path`` (what S3-compatible stores serve); against AWS, botocore's own choice.
* credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``) or anything else of
  boto3's chain; none at all: unsigned (anonymous) requests. The EC2 instance metadata service is not asked
  unless ``AWS_EC2_METADATA_DISABLED=false`` is set.

``s3://bucket/key`` is one object when ``key`` names an object, else the prefix ``key/`` (a directory);
``s3://bucket/key/`` and ``s3://bucket`` are always prefixes. A prefix's objects keep their paths below the
prefix; "directory marker" objects (keys ending in ``/``) are skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .fetch_errors import (
    AccessDenied,
    ChecksumMismatch,
    DownloadTimeout,
    FetchError,
    InvalidURI,
    NotFound,
)
from .store_checksums import (
    COMBINABLE,
    SUPPORTED,
    StoreChecksum,
    combined,
    from_response,
    new_hasher,
    part_digests,
    pick_algorithm,
)

log = logging.getLogger("modelserver.fetch")

MiB = 1 << 20
#: a listing larger than this is refused (a bucket root by mistake)
MAX_OBJECTS = 100_000
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$", re.IGNORECASE)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

_ACCESS_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "AccountProblem",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidSecurity",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "TokenRefreshRequired",
    "Forbidden",
    "403",
    "401",
}
_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "NotFound", "404"}


# ------------------------------------------------------------------------------------------ URI, settings


@dataclass(frozen=True)
class S3Location:
    bucket: str
    key: str  # "" for the bucket root

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_s3_uri(uri: str) -> S3Location:
    parts = urlsplit(uri)
    if parts.scheme != "s3":
        raise InvalidURI(f"{uri!r} is not an s3:// URI (s3://bucket/prefix or s3://bucket/key)")
    if parts.query or parts.fragment:
        raise InvalidURI(f"{uri!r}: an s3:// URI has no query or fragment")
    bucket = parts.netloc
    if not _BUCKET.match(bucket or ""):
        raise InvalidURI(f"{uri!r}: {bucket!r} is not a bucket name")
    key = parts.path.lstrip("/")
    if any(seg in (".", "..") for seg in key.split("/")):
        raise InvalidURI(f"{uri!r}: the key has a '.' or '..' segment")
    return S3Location(bucket, key)


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise InvalidURI(f"{name}={raw!r} is neither 1/true nor 0/false")


@dataclass(frozen=True)
class S3Settings:
    endpoint_url: str | None = None
    region: str = "us-east-1"
    verify: bool | str = True
    addressing_style: str = "auto"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        endpoint = env.get("S3_ENDPOINT", "").strip() or None
        if endpoint is not None:
            if "://" not in endpoint:
                endpoint = ("https://" if _flag(env, "S3_USE_HTTPS", True) else "http://") + endpoint
            sp = urlsplit(endpoint)
            if sp.scheme not in ("http", "https") or not sp.hostname:
                raise InvalidURI(f"S3_ENDPOINT {endpoint!r} is not an http(s) URL or host[:port]")
        verify: bool | str = _flag(env, "S3_VERIFY_SSL", True)
        ca = env.get("AWS_CA_BUNDLE", "").strip()
        if verify and ca:
            if not Path(ca).is_file():
                raise FetchError(f"AWS_CA_BUNDLE {ca} is not a file")
            verify = ca
        region = (env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1").strip()
        style = (env.get("S3_ADDRESSING_STYLE") or "auto").strip().lower()
        if style not in ("auto", "path", "virtual"):
            raise InvalidURI(f"S3_ADDRESSING_STYLE {style!r} is not auto, path or virtual")
        if style == "auto" and endpoint is not None:
            style = "path"
        return cls(endpoint, region, verify, style)

    def describe(self) -> str:
        return self.endpoint_url or f"AWS S3 ({self.region})"


@dataclass(frozen=True)
class ClientOptions:
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    #: botocore's standard retry mode: attempts per request, exponential backoff with jitter
    max_attempts: int = 5
    concurrency: int = 10


def make_client(settings: S3Settings, opts: ClientOptions) -> Any:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    session = boto3.session.Session(region_name=settings.region)
    signed = session.get_credentials() is not None
    if not signed:
        log.info("no credentials in the environment: unsigned (anonymous) requests")
    cfg = Config(
        region_name=settings.region,
        signature_version=None if signed else UNSIGNED,
        s3={"addressing_style": settings.addressing_style},
        retries={"total_max_attempts": opts.max_attempts, "mode": "standard"},
        connect_timeout=opts.connect_timeout,
        read_timeout=opts.read_timeout,
        max_pool_connections=opts.concurrency + 4,
        user_agent_extra="modeldeploy-fetch",
        request_checksum_calculation="when_required",
        response_checksum_validation="when_supported",
        tcp_keepalive=True,
    )
    if settings.verify is False:
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return session.client("s3", endpoint_url=settings.endpoint_url, verify=settings.verify, config=cfg)


# ---------------------------------------------------------------------------------------------- errors


def map_error(exc: BaseException, what: str, endpoint: str = "") -> FetchError:
    """A typed :class:`FetchError` for an exception raised while talking to the store about ``what``."""
    if isinstance(exc, FetchError):
        return exc
    from botocore import exceptions as bx
    from s3transfer.exceptions import RetriesExceededError

    if isinstance(exc, RetriesExceededError) and getattr(exc, "last_exception", None) is not None:
        return map_error(exc.last_exception, what, endpoint)
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code", "") or "")
        status = int((exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode", 0) or 0)
        msg = str(err.get("Message", "") or "").strip()
        detail = f"{code or 'error'} (HTTP {status})" + (f": {msg}" if msg else "")
        if code in _ACCESS_CODES or status in (401, 403):
            return AccessDenied(f"{what}: access denied by {endpoint or 'the store'}: {detail}")
        if code in _NOT_FOUND_CODES or status == 404:
            if code == "NoSuchBucket":
                return NotFound(f"{what}: the bucket does not exist ({detail})")
            return NotFound(f"{what}: not found ({detail})")
        if code in ("PreconditionFailed", "412") or status == 412:
            return FetchError(f"{what}: the object changed during the download ({detail})")
        return FetchError(f"{what}: {detail}")
    if isinstance(exc, bx.FlexibleChecksumError):
        # botocore's own check of a whole-object GET against the store's flexible checksum
        return ChecksumMismatch(f"{what}: the bytes do not match the store's checksum ({exc})")
    if isinstance(exc, bx.SSLError):
        return FetchError(f"{what}: TLS failure talking to {endpoint or 'the store'}: {exc}")
    if isinstance(exc, bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return DownloadTimeout(f"{what}: {endpoint or 'the store'} did not answer in time ({exc})")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectionClosedError | bx.HTTPClientError):
        return DownloadTimeout(f"{what}: cannot reach {endpoint or 'the store'} ({exc})")
    if isinstance(exc, bx.PartialCredentialsError):
        return AccessDenied(f"{what}: incomplete credentials ({exc})")
    if isinstance(exc, bx.NoCredentialsError):
        return AccessDenied(f"{what}: no credentials")
    if isinstance(exc, bx.BotoCoreError):
        return FetchError(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError):
        return DownloadTimeout(f"{what}: {exc or 'timed out'}")
    if isinstance(exc, OSError):
        return FetchError(f"{what}: {exc.strerror or exc} ({getattr(exc, 'filename', '') or ''})")
    return FetchError(f"{what}: {type(exc).__name__}: {exc}")


# ------------------------------------------------------------------------------------------------ listing


@dataclass(frozen=True)
class RemoteObject:
    key: str
    rel: str  # the path below the destination directory
    size: int
    etag: str  # without quotes
    version_id: str | None = None
    last_modified: str = ""
    #: the flexible checksum algorithms the store lists for it (``ChecksumAlgorithm``) and their type
    checksum_algorithms: tuple[str, ...] = ()
    checksum_type: str = ""
    #: the flexible checksum's value, when a HEAD already gave it
    checksum: StoreChecksum | None = None


@dataclass
class Listing:
    location: S3Location
    kind: str  # "object" or "prefix"
    objects: list[RemoteObject] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(o.size for o in self.objects)

    def identity(self, endpoint: str) -> dict[str, Any]:
        """What names these exact bytes: the store, the location and each object's size, ETag, version."""
        return {
            "endpoint": endpoint,
            "bucket": self.location.bucket,
            "key": self.location.key,
            "kind": self.kind,
            "objects": [[o.rel, o.size, o.etag, o.version_id or ""] for o in self.objects],
        }


def _safe_rel(rel: str, key: str) -> str:
    segs = rel.split("/")
    if not rel or rel.startswith("/") or any(s in ("", ".", "..") for s in segs):
        raise FetchError(f"object key {key!r} does not map to a safe relative path ({rel!r})")
    return rel


def _etag(raw: Any) -> str:
    return str(raw or "").strip().strip('"')


def resolve(client: Any, loc: S3Location, endpoint: str = "") -> Listing:
    """One object (HEAD) or a prefix (LIST): names, sizes and ETags; no object data is read."""
    head_denied: FetchError | None = None
    if loc.key and not loc.key.endswith("/"):
        try:
            h = client.head_object(Bucket=loc.bucket, Key=loc.key, ChecksumMode="ENABLED")
        except Exception as e:
            err = map_error(e, loc.uri, endpoint)
            if isinstance(err, AccessDenied):
                head_denied = err  # S3 answers 403 for a missing key without s3:ListBucket
            elif not isinstance(err, NotFound):
                raise err from e
        else:
            rel = _safe_rel(posixpath.basename(loc.key), loc.key)
            algos = tuple(a for a in SUPPORTED if h.get(f"Checksum{a}"))
            algo = pick_algorithm(algos)
            obj = RemoteObject(
                loc.key,
                rel,
                int(h.get("ContentLength", 0)),
                _etag(h.get("ETag")),
                h.get("VersionId"),
                str(h.get("LastModified", "")),
                algos,
                str(h.get("ChecksumType") or ""),
                from_response(h, algo) if algo else None,
            )
            return Listing(loc, "object", [obj])
    prefix = loc.key if (not loc.key or loc.key.endswith("/")) else loc.key + "/"
    objects: list[RemoteObject] = []
    try:
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=loc.bucket, Prefix=prefix):
            for c in page.get("Contents", []) or []:
                key = c["Key"]
                if key.endswith("/"):
                    continue  # a "directory marker"
                rel = _safe_rel(key[len(prefix) :], key)
                objects.append(
                    RemoteObject(
                        key,
                        rel,
                        int(c.get("Size", 0)),
                        _etag(c.get("ETag")),
                        None,
                        str(c.get("LastModified", "")),
                        tuple(str(a).upper() for a in c.get("ChecksumAlgorithm") or ()),
                        str(c.get("ChecksumType") or ""),
                    )
                )
                if len(objects) > MAX_OBJECTS:
                    raise FetchError(f"more than {MAX_OBJECTS} objects under s3://{loc.bucket}/{prefix}")
    except FetchError:
        raise
    except Exception as e:
        raise map_error(e, f"s3://{loc.bucket}/{prefix}", endpoint) from e
    if not objects:
        if head_denied is not None:
            raise head_denied
        if loc.key and not loc.key.endswith("/"):
            raise NotFound(f"no object {loc.uri} and no objects under {loc.uri}/")
        raise NotFound(f"no objects under s3://{loc.bucket}/{prefix}")
    objects.sort(key=lambda o: o.rel)
    seen: set[str] = set()
    for o in objects:
        # "a" and "a/b" cannot both be files
        parts = o.rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise FetchError(f"object {o.key!r} lies below another object ({'/'.join(parts[:i])!r})")
        seen.add(o.rel)
    return Listing(loc, "prefix", objects)


# ------------------------------------------------------------------------------------------------ progress


class Progress:
    """Bytes done of a total, logged every ``interval`` seconds: bytes, rate, ETA."""

    def __init__(self, total: int, interval: float = 5.0, what: str = "") -> None:
        self.total = total
        self.interval = interval
        self.what = what
        self.done = 0
        self.start = time.monotonic()
        self._last = self.start
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def snapshot(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        done = max(self.done, 0)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else None
        return {
            "bytes": done,
            "total_bytes": self.total,
            "percent": round(100.0 * done / self.total, 1) if self.total else 100.0,
            "rate_bytes_per_s": round(rate),
            "eta_s": round(eta, 1) if eta is not None else None,
            "elapsed_s": round(elapsed, 2),
        }

    def maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        s = self.snapshot()
        eta = f"{s['eta_s']:.0f}s" if s["eta_s"] is not None else "?"
        log.info(
            f"progress {human(s['bytes'])} / {human(s['total_bytes'])} ({s['percent']}%), "
            f"{human(s['rate_bytes_per_s'])}/s, ETA {eta}",
            extra={"event": "progress", **s},
        )


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


# ------------------------------------------------------------------------------------------------ checksums


@dataclass
class FileDigest:
    sha256: str | None = None
    #: what the store's checksum check did: "crc32", "crc32-composite", "sha256", ... (a flexible
    #: checksum), "etag-md5", "etag-multipart", "" (none)
    verified: str = ""


def _is_md5(etag: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-fA-F]{32}", etag))


def _multipart_count(etag: str) -> int:
    m = re.fullmatch(r"[0-9a-fA-F]{32}-([0-9]+)", etag)
    return int(m.group(1)) if m else 0


def hash_file(path: Path, part_sizes: list[int] | None, want_sha256: bool, want_md5: bool):
    """One pass: sha256 of the whole, MD5 of the whole, and the MD5 of each part (multipart ETag)."""
    sha = hashlib.sha256() if want_sha256 else None
    md5 = hashlib.md5(usedforsecurity=False) if want_md5 else None
    part_md5s: list[bytes] = []
    sizes = list(part_sizes or [])
    cur = hashlib.md5(usedforsecurity=False) if sizes else None
    left = sizes.pop(0) if sizes else 0
    with path.open("rb") as f:
        while True:
            buf = f.read(4 * MiB)
            if not buf:
                break
            if sha is not None:
                sha.update(buf)
            if md5 is not None:
                md5.update(buf)
            if cur is not None:
                view = memoryview(buf)
                while len(view):
                    take = min(left, len(view)) if left > 0 else len(view)
                    cur.update(view[:take])
                    view = view[take:]
                    left -= take
                    if left == 0 and sizes:
                        part_md5s.append(cur.digest())
                        cur = hashlib.md5(usedforsecurity=False)
                        left = sizes.pop(0)
    if cur is not None:
        part_md5s.append(cur.digest())
    multipart = None
    if part_sizes:
        multipart = hashlib.md5(b"".join(part_md5s), usedforsecurity=False).hexdigest() + f"-{len(part_md5s)}"
    return (
        sha.hexdigest() if sha is not None else None,
        md5.hexdigest() if md5 is not None else None,
        multipart,
    )


def _part_sizes(client: Any, bucket: str, obj: RemoteObject, count: int, uniform: bool) -> list[int] | None:
    """The part sizes of a multipart object (HEAD with PartNumber); None when the store does not tell."""
    extra = {"VersionId": obj.version_id} if obj.version_id else {}
    try:
        h = client.head_object(Bucket=bucket, Key=obj.key, PartNumber=1, **extra)
    except Exception:
        return None
    first = int(h.get("ContentLength", 0) or 0)
    if int(h.get("PartsCount", 0) or 0) != count or first <= 0:
        return None
    if uniform:
        sizes = [first] * (obj.size // first)
        if obj.size % first:
            sizes.append(obj.size % first)
        return sizes if len(sizes) == count else None
    if count > 1000:
        return None
    sizes = [first]
    for n in range(2, count + 1):
        try:
            sizes.append(
                int(client.head_object(Bucket=bucket, Key=obj.key, PartNumber=n, **extra)["ContentLength"])
            )
        except Exception:
            return None
    return sizes if sum(sizes) == obj.size else None


def _kms_encrypted(client: Any, bucket: str, obj: RemoteObject) -> bool:
    try:
        h = client.head_object(Bucket=bucket, Key=obj.key)
    except Exception:
        return False
    return str(h.get("ServerSideEncryption", "")).startswith("aws:kms") or bool(h.get("SSECustomerAlgorithm"))


def verify_file(client: Any, bucket: str, obj: RemoteObject, path: Path, want_sha256: bool) -> FileDigest:
    """The file's sha256 (when wanted), after checking it against the store's ETag where that is a checksum:
    the MD5 of a single-part object, or the MD5 of the parts' MD5s of a multipart one (part sizes from the
    store). SSE-KMS / SSE-C objects, whose ETag is no MD5, and stores that do not give part sizes are not
    checked (logged)."""
    where = f"s3://{bucket}/{obj.key}"
    if path.stat().st_size != obj.size:
        raise ChecksumMismatch(f"{where}: {path.stat().st_size} bytes on disk, the store listed {obj.size}")
    count = _multipart_count(obj.etag)
    if _is_md5(obj.etag):
        sha, md5, _ = hash_file(path, None, want_sha256, True)
        if md5 != obj.etag.lower():
            if _kms_encrypted(client, bucket, obj):
                log.warning(
                    "ETag is not an MD5 (SSE-KMS or SSE-C): store checksum not checked",
                    extra={"object": where},
                )
                return FileDigest(sha, "")
            raise ChecksumMismatch(
                f"{where}: MD5 {md5} of the bytes does not match the store's ETag {obj.etag}"
            )
        return FileDigest(sha, "etag-md5")
    if count:
        for uniform in (True, False):
            sizes = _part_sizes(client, bucket, obj, count, uniform)
            if sizes is None:
                continue
            sha, _, multi = hash_file(path, sizes, want_sha256, False)
            if multi == obj.etag.lower():
                return FileDigest(sha, "etag-multipart")
            if not uniform:
                raise ChecksumMismatch(
                    f"{where}: multipart MD5 {multi} of the bytes does not match the store's ETag {obj.etag}"
                )
        log.warning(
            "multipart ETag without part sizes from the store: store checksum not checked",
            extra={"object": where},
        )
    elif obj.etag:
        log.warning("ETag is not a checksum: store checksum not checked", extra={"object": where})
    sha, _, _ = hash_file(path, None, want_sha256, False) if want_sha256 else (None, None, None)
    return FileDigest(sha, "")


def dir_digest_of(file_sha256: Mapping[str, str]) -> str:
    """The directory digest of ``modelserver.loader.dir_digest`` from each relative path's sha256."""
    h = hashlib.sha256()
    for rel in sorted(file_sha256):
        h.update(rel.encode("utf-8") + b"\0" + file_sha256[rel].encode("ascii") + b"\n")
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ download


@dataclass(frozen=True)
class TransferOptions:
    #: objects at least this large are fetched as parallel ranged GETs of ``chunk_size`` (a multipart
    #: object: of its upload part size, so that each GET's MD5 is one part's)
    threshold: int = 8 * MiB
    chunk_size: int = 8 * MiB
    #: the bound on concurrent requests, all objects together
    concurrency: int = 10
    #: s3transfer's own retries of a body that broke off mid-stream
    stream_attempts: int = 5
    #: single-part objects up to this size come in one GET, MD5-checked as they stream; larger ones are
    #: ranged and their MD5 is computed from the file afterwards
    single_stream_max: int = 256 * MiB
    #: check each object against the store's ETag where that is a checksum (off: no MD5 work at all)
    etag_check: bool = True


class _HashingBody:
    """A GetObject body that hashes what is read through it and reports the digest when the stream ends."""

    def __init__(self, body: Any, algorithm: str, done: Callable[[bytes, int], None]) -> None:
        self._body = body
        self._hash = new_hasher(algorithm)
        self._n = 0
        self._done = done
        self._reported = False

    def read(self, amt: int | None = None) -> bytes:
        data = self._body.read(amt)
        if data:
            self._hash.update(data)
            self._n += len(data)
        elif not self._reported:
            self._reported = True
            self._done(self._hash.digest(), self._n)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


class StreamHashes:
    """The digest of every GetObject body (or range) as it streams, keyed by (bucket, key) and range start:
    the store's checksum is checked without reading the files again. MD5 (for the ETag) unless
    :meth:`use` names a flexible checksum algorithm for the object; a whole-object GET's flexible checksum
    header is kept too."""

    _CTX = "modeldeploy_fetch_get"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, str], dict[int, tuple[bytes, int]]] = {}
        self._algorithm: dict[tuple[str, str], str] = {}
        self._values: dict[tuple[str, str], StoreChecksum] = {}

    def install(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build.s3.GetObject", self._before)
        client.meta.events.register("after-call.s3.GetObject", self._after)

    def uninstall(self, client: Any) -> None:
        client.meta.events.unregister("before-parameter-build.s3.GetObject", self._before)
        client.meta.events.unregister("after-call.s3.GetObject", self._after)

    def use(self, bucket: str, key: str, algorithm: str) -> None:
        self._algorithm[(bucket, key)] = algorithm

    def _before(self, params: dict[str, Any], context: dict[str, Any], **kw: Any) -> None:
        context[self._CTX] = (params.get("Bucket"), params.get("Key"), params.get("Range"))

    def _after(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **kw: Any) -> None:
        info = context.get(self._CTX)
        if not info or "Body" not in parsed or getattr(http_response, "status_code", 200) >= 300:
            return
        bucket, key, rng = info
        m = re.match(r"bytes=(\d+)-", rng or "")
        start = int(m.group(1)) if m else 0
        algorithm = self._algorithm.get((bucket, key), "MD5")
        if rng is None and algorithm != "MD5":
            value = from_response(parsed, algorithm)
            if value is not None:
                with self._lock:
                    self._values[(bucket, key)] = value

        def done(digest: bytes, n: int) -> None:
            with self._lock:
                self._parts.setdefault((bucket, key), {})[start] = (digest, n)

        parsed["Body"] = _HashingBody(parsed["Body"], algorithm, done)

    def ranges(self, bucket: str, key: str) -> dict[int, tuple[bytes, int]]:
        """Each completed GET of the object: range start -> (digest, bytes)."""
        with self._lock:
            return dict(self._parts.get((bucket, key), {}))

    def value(self, bucket: str, key: str) -> StoreChecksum | None:
        """The flexible checksum a whole-object GET of the object answered with."""
        with self._lock:
            return self._values.get((bucket, key))

    def etag_of(self, bucket: str, key: str, part_sizes: list[int] | None) -> str | None:
        """The ETag the streamed bytes make: their MD5 (one GET, ``part_sizes`` None), or the MD5 of the
        parts' MD5s + ``-N`` when each part came in one ranged GET; None otherwise."""
        got = self.ranges(bucket, key)
        if part_sizes is None:
            return got[0][0].hex() if 0 in got and len(got) == 1 else None
        digests = part_digests(got, part_sizes)
        if digests is None:
            return None
        return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(part_sizes)}"


@dataclass
class _Plan:
    """How one object is downloaded and checked."""

    obj: RemoteObject
    #: the ranged-GET size (None: one GET)
    chunk: int | None
    #: "flex": the store's flexible checksum (CRC32, SHA-256, SHA-1), from the ranges' digests;
    #: "md5": one GET, MD5 as it streams; "multipart": one GET per upload part; "reread": hash the file
    #: afterwards; "none": the ETag is no checksum; "off": not asked for
    check: str
    part_sizes: list[int] | None = None
    #: "flex": the algorithm, the value when the listing's HEAD gave it (else the whole-object GET's answer
    #: or a HEAD after the download), and the checksum type as far as it is known
    algorithm: str = ""
    expected: StoreChecksum | None = None
    kind: str = ""


def _head_checksum(client: Any, bucket: str, obj: RemoteObject, algorithm: str) -> StoreChecksum | None:
    if obj.checksum is not None and obj.checksum.algorithm == algorithm:
        return obj.checksum
    extra = {"VersionId": obj.version_id} if obj.version_id else {}
    try:
        h = client.head_object(Bucket=bucket, Key=obj.key, ChecksumMode="ENABLED", **extra)
    except Exception:
        return None
    return from_response(h, algorithm)


def _flex_plan(client: Any, bucket: str, obj: RemoteObject, opts: TransferOptions) -> _Plan | None:
    """The plan that checks the store's flexible checksum of ``obj``; None when it has none we can check.
    The value itself is asked for (HEAD) only when the check needs it, after the download."""
    algorithm = pick_algorithm(obj.checksum_algorithms)
    if not algorithm:
        return None
    known = obj.checksum if obj.checksum is not None and obj.checksum.algorithm == algorithm else None
    etag_parts = _multipart_count(obj.etag)
    kind = obj.checksum_type or (known.kind if known is not None else "")
    if not kind and etag_parts > 1:
        # a store that gives no checksum type: a multipart upload's checksum is a COMPOSITE one (S3's rule
        # before FULL_OBJECT checksums)
        kind = "COMPOSITE"
    if kind == "COMPOSITE":
        parts = (known.parts if known is not None else 0) or etag_parts
        if not parts:
            known = _head_checksum(client, bucket, obj, algorithm)
            parts = known.parts if known is not None else 0
            if not parts:
                return None
        if parts == 1:
            return _Plan(obj, None, "flex", [obj.size], algorithm, known, kind)
        sizes = _part_sizes(client, bucket, obj, parts, uniform=True)
        if sizes is None:
            return None
        return _Plan(obj, sizes[0], "flex", sizes, algorithm, known, kind)
    if obj.size < opts.threshold:
        return _Plan(obj, None, "flex", None, algorithm, known, kind)
    if algorithm in COMBINABLE:
        return _Plan(obj, opts.chunk_size, "flex", None, algorithm, known, kind)
    if obj.size <= opts.single_stream_max:
        return _Plan(obj, None, "flex", None, algorithm, known, kind)
    return None


def _expected_checksum(client: Any, bucket: str, plan: _Plan, hashes: StreamHashes) -> StoreChecksum | None:
    """The store's value for a "flex" plan: from the listing's HEAD, the GET's answer, or a HEAD now; read
    with the plan's kind where the store did not say it (moto, for one, gives a COMPOSITE value without its
    "-N")."""
    obj = plan.obj
    got = plan.expected or hashes.value(bucket, obj.key)
    if got is None:
        got = _head_checksum(client, bucket, obj, plan.algorithm)
    if got is None or (got.kind and not (plan.kind == "COMPOSITE" and not got.parts)):
        return got
    if plan.kind == "COMPOSITE" and plan.part_sizes:
        value = got.value if got.parts else f"{got.value}-{len(plan.part_sizes)}"
        return StoreChecksum(got.algorithm, "COMPOSITE", value)
    return StoreChecksum(got.algorithm, "FULL_OBJECT", got.value)


def _plan(client: Any, bucket: str, objects: list[RemoteObject], opts: TransferOptions) -> list[_Plan]:
    from concurrent.futures import ThreadPoolExecutor

    def one(obj: RemoteObject) -> _Plan:
        big = obj.size >= opts.threshold
        if not opts.etag_check:
            return _Plan(obj, opts.chunk_size if big else None, "off")
        flex = _flex_plan(client, bucket, obj, opts)
        if flex is not None:
            return flex
        if _is_md5(obj.etag):
            if obj.size <= opts.single_stream_max:
                return _Plan(obj, None, "md5")
            return _Plan(obj, opts.chunk_size, "reread")
        count = _multipart_count(obj.etag)
        if count:
            sizes = _part_sizes(client, bucket, obj, count, uniform=True)
            if sizes is not None:
                return _Plan(obj, sizes[0] if count > 1 else None, "multipart", sizes)
            return _Plan(obj, opts.chunk_size if big else None, "reread")
        return _Plan(obj, opts.chunk_size if big else None, "none")

    def asks(o: RemoteObject) -> bool:
        """Whether planning ``o`` may send requests (HEADs for part sizes): those are planned in parallel."""
        return opts.etag_check and (_multipart_count(o.etag) > 1 or o.checksum_type == "COMPOSITE")

    asking = [o for o in objects if asks(o)]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(asking) or 1))) as ex:
        plans = {o.key: p for o, p in zip(asking, ex.map(one, asking), strict=True)}
    return [plans[o.key] if o.key in plans else one(o) for o in objects]


def _verify(
    client: Any, bucket: str, plan: _Plan, path: Path, hashes: StreamHashes, want_sha256: bool
) -> FileDigest:
    obj = plan.obj
    where = f"s3://{bucket}/{obj.key}"
    if path.stat().st_size != obj.size:
        raise ChecksumMismatch(f"{where}: {path.stat().st_size} bytes on disk, the store listed {obj.size}")
    sha = None
    if want_sha256:
        sha, _, _ = hash_file(path, None, True, False)
    if plan.check == "flex":
        expected = _expected_checksum(client, bucket, plan, hashes)
        ranges = hashes.ranges(bucket, obj.key)
        got = combined(expected, ranges, obj.size, plan.part_sizes) if expected is not None else None
        if expected is not None and got is not None:
            if got == expected.value:
                return FileDigest(sha, expected.algorithm.lower() + ("-composite" if expected.parts else ""))
            # a store may word its checksum otherwise than we read it: the ETag decides, read again
            d = verify_file(client, bucket, obj, path, want_sha256=False)
            if not d.verified:
                raise ChecksumMismatch(
                    f"{where}: {expected.algorithm} {got} of the bytes does not match the store's checksum "
                    f"{expected.value}"
                )
            log.warning(
                f"{expected.algorithm} {expected.value} of the store not understood; the ETag matched",
                extra={"object": where},
            )
            return FileDigest(sha, d.verified)
        # no value in the answer, or ranges that do not make it (a retried range): the ETag, re-read
        d = verify_file(client, bucket, obj, path, want_sha256=False)
        return FileDigest(sha, d.verified)
    if plan.check in ("md5", "multipart"):
        got = hashes.etag_of(bucket, obj.key, plan.part_sizes if plan.check == "multipart" else None)
        if got == obj.etag.lower():
            return FileDigest(sha, "etag-md5" if plan.check == "md5" else "etag-multipart")
        if got is not None and plan.check == "md5":
            if _kms_encrypted(client, bucket, obj):
                log.warning(
                    "ETag is not an MD5 (SSE-KMS or SSE-C): store checksum not checked",
                    extra={"object": where},
                )
                return FileDigest(sha, "")
            raise ChecksumMismatch(
                f"{where}: MD5 {got} of the bytes does not match the store's ETag {obj.etag}"
            )
        # the streams did not cover the parts one to one (a retried range, parts of unequal sizes): re-read
    if plan.check == "off":
        return FileDigest(sha, "")
    if plan.check == "none":
        if obj.etag:
            log.warning("ETag is not a checksum: store checksum not checked", extra={"object": where})
        return FileDigest(sha, "")
    d = verify_file(client, bucket, obj, path, want_sha256=False)
    return FileDigest(sha, d.verified)


def download(
    client: Any,
    listing: Listing,
    into: Path,
    *,
    opts: TransferOptions,
    progress: Progress,
    want_sha256: bool,
    deadline: float,
    cancelled: Callable[[], bool] = lambda: False,
    endpoint: str = "",
) -> dict[str, FileDigest]:
    """Download every object of ``listing`` below ``into`` (which exists), checking each against the store's
    checksum; the sha256 of each file when ``want_sha256``. Raises a :class:`FetchError`.

    Objects go in groups of equal ranged-GET size (one s3transfer TransferManager each, one group after the
    other, so that ``opts.concurrency`` bounds the requests in flight). Each range is hashed as it streams:
    with the store's flexible checksum where it has one we compute (a FULL_OBJECT CRC32 is combined from
    ranges of any size; a COMPOSITE one needs one range per upload part), else with MD5 for the ETag (a
    multipart object's ranges are its upload parts; a single-part object up to ``single_stream_max``
    comes in one GET whose MD5 is its ETag)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    from s3transfer.subscribers import BaseSubscriber

    bucket = listing.location.bucket

    class _Sub(BaseSubscriber):
        def __init__(self, obj: RemoteObject) -> None:
            self.obj = obj

        def on_queued(self, future: Any, **kwargs: Any) -> None:
            # size and ETag from the listing: no HEAD per object, and ranged GETs carry If-Match
            future.meta.provide_transfer_size(self.obj.size)
            if self.obj.etag:
                future.meta.provide_object_etag(f'"{self.obj.etag}"')

        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            progress.add(bytes_transferred)

        def on_done(self, future: Any, **kwargs: Any) -> None:
            events.put(future)

    def mapped(e: BaseException, obj: RemoteObject) -> FetchError:
        return map_error(e, f"s3://{bucket}/{obj.key}", endpoint)

    try:
        plans = _plan(client, bucket, listing.objects, opts)
    except Exception as e:
        raise map_error(e, listing.location.uri, endpoint) from e
    hashes = StreamHashes()
    if opts.etag_check:
        hashes.install(client)
        for plan in plans:
            if plan.check == "flex":
                hashes.use(bucket, plan.obj.key, plan.algorithm)
    groups: dict[int | None, list[_Plan]] = {}
    for plan in plans:
        key = plan.chunk
        if key is None and plan.obj.size < opts.chunk_size:
            # below that group's threshold: one GET there too, and no group (manager) of its own
            key = opts.chunk_size
        groups.setdefault(key, []).append(plan)
    hasher = ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="verify")
    # finished downloads and checks, as they finish: no polling interval between a transfer's end and its
    # check, or between one group and the next
    events: queue.Queue[Any] = queue.Queue()
    hashing: dict[Future[FileDigest], RemoteObject] = {}
    digests: dict[str, FileDigest] = {}
    ok = False
    manager = None
    try:
        for chunk, members in sorted(groups.items(), key=lambda kv: kv[0] or 0):
            cfg = TransferConfig(
                # None: one GET whatever the size
                multipart_threshold=chunk if chunk is not None else (1 << 62),
                multipart_chunksize=chunk or opts.chunk_size,
                max_concurrency=opts.concurrency,
                num_download_attempts=opts.stream_attempts,
                max_io_queue=1000,
                preferred_transfer_client="classic",
            )
            manager = create_transfer_manager(client, cfg)
            pending: dict[Any, _Plan] = {}
            for plan in members:
                target = into / plan.obj.rel
                target.parent.mkdir(parents=True, exist_ok=True)
                extra = {"VersionId": plan.obj.version_id} if plan.obj.version_id else {}
                fut = manager.download(
                    bucket, plan.obj.key, str(target), extra_args=extra, subscribers=[_Sub(plan.obj)]
                )
                pending[fut] = plan
            while pending:
                _tick(listing, deadline, cancelled)
                done = _next_event(events)
                if done is None:
                    # no word for a while: look at the transfers themselves too (a done callback that was
                    # never called must not leave the fetch waiting for its deadline)
                    done = next((f for f in pending if f.done()), None)
                if done in pending:
                    plan = pending.pop(done)
                    try:
                        done.result()
                    except Exception as e:
                        raise mapped(e, plan.obj) from e
                    path = into / plan.obj.rel
                    hf = hasher.submit(_verify, client, bucket, plan, path, hashes, want_sha256)
                    hashing[hf] = plan.obj
                    hf.add_done_callback(events.put)
                _collect(hashing, digests, mapped)
                progress.maybe_log()
            manager.shutdown()
            manager = None
        while hashing:
            _tick(listing, deadline, cancelled)
            _next_event(events)
            _collect(hashing, digests, mapped)
        ok = True
    finally:
        if opts.etag_check:
            hashes.uninstall(client)
        hasher.shutdown(wait=ok, cancel_futures=True)
        if manager is not None:
            # cancel what runs; threads blocked in a read end at the read timeout: do not wait for them
            threading.Thread(target=manager.shutdown, kwargs={"cancel": True}, daemon=True).start()
    return digests


def _next_event(events: queue.Queue[Any], timeout: float = 0.1) -> Any:
    """The next finished transfer or check; None after ``timeout`` (the deadline and cancellation are
    checked at least that often)."""
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        return None


def _tick(listing: Listing, deadline: float, cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise DownloadTimeout(f"{listing.location.uri}: cancelled")
    if time.monotonic() > deadline:
        raise DownloadTimeout(f"{listing.location.uri}: not complete before the deadline")


def _collect(
    hashing: dict[Any, RemoteObject],
    digests: dict[str, FileDigest],
    mapped: Callable[[BaseException, RemoteObject], FetchError],
) -> None:
    for hf in [f for f in hashing if f.done()]:
        obj = hashing.pop(hf)
        try:
            digests[obj.rel] = hf.result()
        except Exception as e:
            raise mapped(e, obj) from e
