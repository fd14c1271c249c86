"""Checks of a downloaded file by reading it again: SHA-256, the MD5 an ETag is (single-part or
multipart), the directory digest; used where a check could not run while the object streamed."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .dir_digest import dir_digest_of
from .fetch_errors import (
    ChecksumMismatch,
)
from .s3_listing import RemoteObject

READ_SIZE = 4 << 20  # bytes per read when a file is hashed again

log = logging.getLogger("modelserver.fetch")


@dataclass
class FileDigest:
    sha256: str | None = None
    #: what the store's checksum check did: "crc32", "crc32-composite", "sha256", ... (a flexible
    #: checksum), "etag-md5", "etag-multipart", "" (none)
    verified: str = ""


def is_md5(etag: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-fA-F]{32}", etag))


def multipart_count(etag: str) -> int:
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
            buf = f.read(READ_SIZE)
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


def part_sizes(client: Any, bucket: str, obj: RemoteObject, count: int, uniform: bool) -> list[int] | None:
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


def kms_encrypted(client: Any, bucket: str, obj: RemoteObject) -> bool:
    try:
        h = client.head_object(Bucket=bucket, Key=obj.key)
    except Exception:
        return False
    return str(h.get("ServerSideEncryption", "")).startswith("aws:kms") or bool(h.get("SSECustomerAlgorithm"))


def md5_mismatch(
    client: Any, bucket: str, obj: RemoteObject, where: str, sha: str | None, md5: str
) -> FileDigest:
    """An MD5 that is not the ETag: unchecked when the object is SSE-KMS/SSE-C encrypted (its ETag is no
    MD5 then), else a :class:`ChecksumMismatch`."""
    if kms_encrypted(client, bucket, obj):
        log.warning(
            "ETag is not an MD5 (SSE-KMS or SSE-C): store checksum not checked", extra={"object": where}
        )
        return FileDigest(sha, "")
    raise ChecksumMismatch(f"{where}: MD5 {md5} of the bytes does not match the store's ETag {obj.etag}")


def verify_file(client: Any, bucket: str, obj: RemoteObject, path: Path, want_sha256: bool) -> FileDigest:
    """The file's sha256 (when wanted), after checking it against the store's ETag where that is a checksum:
    the MD5 of a single-part object, or the MD5 of the parts' MD5s of a multipart one (part sizes from the
    store). SSE-KMS / SSE-C objects, whose ETag is no MD5, and stores that do not give part sizes are not
    checked (logged)."""
    where = f"s3://{bucket}/{obj.key}"
    if path.stat().st_size != obj.size:
        raise ChecksumMismatch(f"{where}: {path.stat().st_size} bytes on disk, the store listed {obj.size}")
    count = multipart_count(obj.etag)
    if is_md5(obj.etag):
        sha, md5, _ = hash_file(path, None, want_sha256, True)
        if md5 != obj.etag.lower():
            return md5_mismatch(client, bucket, obj, where, sha, md5)
        return FileDigest(sha, "etag-md5")
    if count:
        for uniform in (True, False):
            sizes = part_sizes(client, bucket, obj, count, uniform)
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


__all__ = [
    "FileDigest",
    "dir_digest_of",
    "hash_file",
    "is_md5",
    "kms_encrypted",
    "multipart_count",
    "part_sizes",
    "verify_file",
]
