"""The listing of an ``s3://`` URI: one object, or a prefix's objects (paths kept below the prefix;
directory markers skipped; over :data:`MAX_OBJECTS` refused), with each one's size, ETag and checksums."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from .fetch_errors import (
    AccessDenied,
    FetchError,
    NotFound,
)
from .s3_client import S3Location
from .s3_errors import map_error
from .store_checksums import (
    SUPPORTED,
    StoreChecksum,
    from_response,
    pick_algorithm,
)

#: a listing larger than this is refused (a bucket root by mistake)
MAX_OBJECTS = 100_000


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
