"""The local cluster's object store (versitygw) as tests and tools use it.

``up`` starts versitygw (POSIX backend, data under ``<state dir>/s3/data``) inside the pod network
namespace on ``http://10.244.N.254:9000``: the same URL from the host and from pods. The URL is in
``<state dir>/s3-url``, the root user's credentials in ``<state dir>/s3-credentials.json``
(``{"accessKey": ..., "secretKey": ...}``), and every request is a line of ``<state dir>/logs/s3-access.log``.

* :class:`ObjectStore` — a boto3 client (path-style addressing, region ``us-east-1``), buckets, uploads of a
  directory tree, and the access log (:meth:`ObjectStore.requests`, :meth:`ObjectStore.count`).
* :func:`parse_access_log_line` — one line of versitygw's access log (the S3 server access log fields,
  space-separated: owner, bucket, ``[time]``, remote IP, requester, request id, operation such as
  ``s3_GetObject``, key, request URI, HTTP status, error code, bytes sent, object size, ...; the user agent
  that follows is not quoted). Note that versitygw writes ``0`` for bytes sent and object size of a
  ``GetObject``: count requests, not bytes.

For a cluster not started here (``E2E_KUBECONFIG``), ``E2E_S3_URL`` and ``E2E_S3_CREDENTIALS`` (a file
like ``s3-credentials.json``) and optionally ``E2E_S3_ACCESS_LOG`` name the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import S3_REGION
from .state import Layout

if TYPE_CHECKING:
    from .cluster import Cluster

_LINE = re.compile(
    r"^(?P<owner>\S+) (?P<bucket>\S+) \[(?P<time>[^\]]*)\] (?P<remote_ip>\S+) (?P<requester>\S+) "
    r"(?P<request_id>\S+) (?P<operation>\S+) (?P<key>.*?) (?P<uri>\S+) (?P<status>\d{3}) "
    r"(?P<error>\S+) (?P<bytes_sent>\d+) (?P<object_size>\d+) (?P<total_ms>\d+) (?P<turnaround_ms>\d+) "
)


@dataclass(frozen=True)
class AccessLogEntry:
    time: str
    remote_ip: str
    requester: str
    operation: str  # versitygw's names: s3_GetObject, s3_PutObject, s3_HeadObject, s3_ListObjectsV2, ...
    bucket: str  # "" for none
    key: str  # "" for none
    uri: str  # the request URI as sent (query string included)
    status: int
    error: str  # "" or an S3 error code such as AccessDenied, NoSuchKey, SignatureDoesNotMatch

    @property
    def action(self) -> str:
        """The operation without versitygw's ``s3_`` prefix: ``GetObject``."""
        return self.operation.removeprefix("s3_")


def parse_access_log_line(line: str) -> AccessLogEntry | None:
    """One request of versitygw's access log; None for its ``log starts ...`` lines and anything else."""
    m = _LINE.match(line)
    if m is None:
        return None

    def opt(v: str) -> str:
        return "" if v == "-" else v

    return AccessLogEntry(
        time=m["time"],
        remote_ip=m["remote_ip"],
        requester=opt(m["requester"]),
        operation=m["operation"],
        bucket=opt(m["bucket"]),
        key=opt(m["key"]),
        uri=m["uri"],
        status=int(m["status"]),
        error=opt(m["error"]),
    )


def parse_access_log(text: str) -> list[AccessLogEntry]:
    return [e for e in map(parse_access_log_line, text.splitlines()) if e is not None]


@dataclass(frozen=True)
class ObjectStore:
    url: str
    access_key: str
    secret_key: str
    access_log: Path | None = None
    region: str = S3_REGION

    @classmethod
    def of_state_dir(cls, state_dir: Path) -> ObjectStore:
        layout = Layout(state_dir)
        creds = json.loads(layout.s3_credentials_file.read_text())
        return cls(
            layout.s3_url_file.read_text().strip(),
            creds["accessKey"],
            creds["secretKey"],
            layout.s3_access_log,
        )

    @classmethod
    def of_cluster(cls, cluster: Cluster) -> ObjectStore | None:
        """The cluster's store: the local cluster's files, or ``E2E_S3_*`` for an external one."""
        if os.environ.get("E2E_S3_URL"):
            creds = json.loads(Path(os.environ["E2E_S3_CREDENTIALS"]).read_text())
            log = os.environ.get("E2E_S3_ACCESS_LOG")
            return cls(
                os.environ["E2E_S3_URL"], creds["accessKey"], creds["secretKey"], Path(log) if log else None
            )
        if not cluster.s3_url:
            return None
        return cls.of_state_dir(cluster.state_dir)

    def client(self, *, access_key: str | None = None, secret_key: str | None = None, **config: Any) -> Any:
        """A boto3 S3 client for this store (path-style; other credentials to test refusals)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}, **config),
        )

    def make_bucket(self, name: str) -> None:
        """Create bucket ``name``; one that exists already (ours) is fine."""
        s3 = self.client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=name)

    def upload_dir(self, local: Path, bucket: str, prefix: str = "", checksum: str = "") -> list[str]:
        """Upload every file below ``local`` to ``bucket`` as ``prefix/<relative path>``; the keys, sorted.
        ``checksum``: the flexible checksum the SDK sends (``CRC64NVME``, ...; default: the SDK's, CRC32)."""
        s3 = self.client()
        extra = {"ChecksumAlgorithm": checksum} if checksum else None
        prefix = prefix.strip("/")
        keys = []
        for f in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            rel = f.relative_to(local).as_posix()
            key = f"{prefix}/{rel}" if prefix else rel
            s3.upload_file(str(f), bucket, key, ExtraArgs=extra)
            keys.append(key)
        return keys

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        s3 = self.client()
        out: list[str] = []
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents") or []]
        return sorted(out)

    # -- the access log -------------------------------------------------------------------------------
    def log_offset(self) -> int:
        """The access log's current size: pass it as ``since`` to look only at later requests."""
        if self.access_log is None:
            raise RuntimeError("this object store's access log is not readable here")
        try:
            return self.access_log.stat().st_size
        except FileNotFoundError:
            return 0

    def requests(self, since: int = 0) -> Iterator[AccessLogEntry]:
        """The requests logged since byte offset ``since`` (see :meth:`log_offset`)."""
        if self.access_log is None:
            raise RuntimeError("this object store's access log is not readable here")
        with open(self.access_log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        yield from parse_access_log(text)

    def count(
        self,
        action: str = "GetObject",
        *,
        bucket: str | None = None,
        key_prefix: str = "",
        since: int = 0,
        status: int | None = 200,
        remote_ip: str | None = None,
    ) -> int:
        """How many requests of ``action`` (``GetObject``: one per ranged GET too) matched."""
        return sum(
            1
            for e in self.requests(since)
            if e.action == action
            and (bucket is None or e.bucket == bucket)
            and e.key.startswith(key_prefix)
            and (status is None or e.status == status)
            and (remote_ip is None or e.remote_ip == remote_ip)
        )
