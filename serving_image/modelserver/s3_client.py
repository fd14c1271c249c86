"""S3 for the model fetch: the ``s3://`` URI, the settings from the environment (storage_s3 lists them),
and the boto3 client made from them."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .fetch_errors import (
    FetchError,
    InvalidURI,
)

log = logging.getLogger("modelserver.fetch")


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$", re.IGNORECASE)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


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
