"""How each object is downloaded and checked (:class:`Plan`): the transfer options, and the choice of
check -- the store's flexible checksum, the MD5 an ETag is (streamed, per part, or by re-reading), or
none -- made from the listing and, where needed, HEAD requests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .s3_listing import RemoteObject
from .s3_verify import is_md5, multipart_count, part_sizes
from .store_checksums import (
    COMBINABLE,
    StoreChecksum,
    from_response,
    pick_algorithm,
)

MiB = 1 << 20


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


@dataclass
class Plan:
    """How one object is downloaded and checked."""

    obj: RemoteObject
    #: the ranged-GET size (None: one GET)
    chunk: int | None
    #: "flex": the store's flexible checksum (a CRC, SHA-256, SHA-1), from the ranges' digests;
    #: "md5": one GET, MD5 as it streams; "multipart": one GET per upload part; "reread": hash the file
    #: afterwards; "none": the ETag is no checksum; "off": not asked for
    check: str
    part_sizes: list[int] | None = None
    #: "flex": the algorithm, the value when the listing's HEAD gave it (else the whole-object GET's answer
    #: or a HEAD after the download), and the checksum type as far as it is known
    algorithm: str = ""
    expected: StoreChecksum | None = None
    kind: str = ""


def head_checksum(client: Any, bucket: str, obj: RemoteObject, algorithm: str) -> StoreChecksum | None:
    if obj.checksum is not None and obj.checksum.algorithm == algorithm:
        return obj.checksum
    extra = {"VersionId": obj.version_id} if obj.version_id else {}
    try:
        h = client.head_object(Bucket=bucket, Key=obj.key, ChecksumMode="ENABLED", **extra)
    except Exception:
        return None
    return from_response(h, algorithm)


def flex_plan(client: Any, bucket: str, obj: RemoteObject, opts: TransferOptions) -> Plan | None:
    """The plan that checks the store's flexible checksum of ``obj``; None when it has none we can check.
    The value itself is asked for (HEAD) only when the check needs it, after the download."""
    algorithm = pick_algorithm(obj.checksum_algorithms)
    if not algorithm:
        return None
    known = obj.checksum if obj.checksum is not None and obj.checksum.algorithm == algorithm else None
    etag_parts = multipart_count(obj.etag)
    kind = obj.checksum_type or (known.kind if known is not None else "")
    if not kind and etag_parts > 1:
        # a store that gives no checksum type: a multipart upload's checksum is a COMPOSITE one (S3's rule
        # before FULL_OBJECT checksums)
        kind = "COMPOSITE"
    if kind == "COMPOSITE":
        parts = (known.parts if known is not None else 0) or etag_parts
        if not parts:
            known = head_checksum(client, bucket, obj, algorithm)
            parts = known.parts if known is not None else 0
            if not parts:
                return None
        if parts == 1:
            return Plan(obj, None, "flex", [obj.size], algorithm, known, kind)
        sizes = part_sizes(client, bucket, obj, parts, uniform=True)
        if sizes is None:
            return None
        return Plan(obj, sizes[0], "flex", sizes, algorithm, known, kind)
    if obj.size < opts.threshold:
        return Plan(obj, None, "flex", None, algorithm, known, kind)
    if algorithm in COMBINABLE:
        return Plan(obj, opts.chunk_size, "flex", None, algorithm, known, kind)
    if obj.size <= opts.single_stream_max:
        return Plan(obj, None, "flex", None, algorithm, known, kind)
    return None


def plan_objects(client: Any, bucket: str, objects: list[RemoteObject], opts: TransferOptions) -> list[Plan]:
    from concurrent.futures import ThreadPoolExecutor

    def one(obj: RemoteObject) -> Plan:
        big = obj.size >= opts.threshold
        if not opts.etag_check:
            return Plan(obj, opts.chunk_size if big else None, "off")
        flex = flex_plan(client, bucket, obj, opts)
        if flex is not None:
            return flex
        if is_md5(obj.etag):
            if obj.size <= opts.single_stream_max:
                return Plan(obj, None, "md5")
            return Plan(obj, opts.chunk_size, "reread")
        count = multipart_count(obj.etag)
        if count:
            sizes = part_sizes(client, bucket, obj, count, uniform=True)
            if sizes is not None:
                return Plan(obj, sizes[0] if count > 1 else None, "multipart", sizes)
            return Plan(obj, opts.chunk_size if big else None, "reread")
        return Plan(obj, opts.chunk_size if big else None, "none")

    def asks(o: RemoteObject) -> bool:
        """Whether planning ``o`` may send requests (HEADs for part sizes): those are planned in parallel."""
        return opts.etag_check and (multipart_count(o.etag) > 1 or o.checksum_type == "COMPOSITE")

    asking = [o for o in objects if asks(o)]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(asking) or 1))) as ex:
        plans = {o.key: p for o, p in zip(asking, ex.map(one, asking), strict=True)}
    return [plans[o.key] if o.key in plans else one(o) for o in objects]
