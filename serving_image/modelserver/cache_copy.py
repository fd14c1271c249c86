"""A node-cache hit, trusted only after its files are read: copy an entry into the pod's model volume and
verify every byte on the way.

What a hit checks (``copy_verified``), before the server ever sees the model:

* the entry holds exactly the files of the store's listing made a moment ago -- no file more (a
  ``handler.py`` planted beside the weights is refused, not executed), none less, no symbolic link, each
  of the listed size;
* the bytes read are the bytes recorded when the entry was filled: the sha256 of each file (the directory
  digest for a prefix) equals the entry's ``meta.json`` ``sha256``, which the filling fetch computed
  from bytes it had checked against the store;
* for each file whose ETag the filling fetch found to be its MD5 (a single-part object, not SSE-KMS), the
  MD5 of the bytes read equals that ETag -- so an entry whose files *and* ``meta.json`` were rewritten
  together is refused as well.

A failed check raises :class:`CorruptEntry`; the fetch then drops the entry and downloads the model again
(``cache_corrupt`` in its log). The copy is a copy, never a hard link: nothing a pod can write reaches
the cache (issue 24, finding 1). Reading the files costs one pass over the model per pod start (measured
in ``make bench-storage``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Collection
from pathlib import Path

from .storage_s3 import Listing, dir_digest_of, is_md5

CHUNK = 4 << 20


class CorruptEntry(Exception):
    """A cache entry whose files are not what it recorded (or not what the store lists)."""


def entry_files(data: Path) -> dict[str, Path]:
    """Every file and link below ``data`` by its relative path (links are not followed)."""
    out: dict[str, Path] = {}
    for top, dirs, files in os.walk(data, followlinks=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            p = Path(top, name)
            out[p.relative_to(data).as_posix()] = p
    return out


def _check_names(have: dict[str, Path], listing: Listing) -> None:
    want = {o.rel: o.size for o in listing.objects}
    extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
    if extra:
        raise CorruptEntry(f"files the store does not list: {', '.join(extra[:3])}")
    if missing:
        raise CorruptEntry(f"files missing: {', '.join(missing[:3])}")
    for rel, p in have.items():
        st = os.lstat(p)
        if not os.path.isfile(p) or os.path.islink(p):
            raise CorruptEntry(f"{rel} is not a regular file")
        if st.st_size != want[rel]:
            raise CorruptEntry(f"{rel} is {st.st_size} bytes, the store lists {want[rel]}")


def _copy_one(src: Path, target: Path, etag: str | None, check: Callable[[], None]) -> tuple[str, str | None]:
    """Copy one file: (its sha256, its MD5 when ``etag`` is given)."""
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False) if etag else None
    target.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fi, target.open("wb") as fo:
        while buf := fi.read(CHUNK):
            sha.update(buf)
            if md5 is not None:
                md5.update(buf)
            fo.write(buf)
            check()
    return sha.hexdigest(), md5.hexdigest() if md5 is not None else None


def copy_verified(
    data: Path,
    listing: Listing,
    recorded_sha256: str | None,
    md5_etags: Collection[str],
    into: Path,
    check: Callable[[], None],
    learn: bool = False,
) -> tuple[str, list[str]]:
    """Copy the entry's files (``data``) into ``into``, verifying them as above. ``md5_etags``: the relative
    paths whose ETag is their MD5 (recorded by the first copy after the fill, ``learn=True``: bytes just
    checked against the store, so an MD5-shaped ETag that matches them is their MD5, and one that does not
    is an SSE-KMS ETag). Returns (the sha256 of one object or the directory digest of a prefix, the paths
    whose MD5 matched their ETag). Raises :class:`CorruptEntry`; ``check`` runs between chunks."""
    if not recorded_sha256:
        raise CorruptEntry("the entry records no sha256 (filled by an older version)")
    have = entry_files(data)
    _check_names(have, listing)
    sums: dict[str, str] = {}
    matched: list[str] = []
    for o in listing.objects:
        want_md5 = o.rel in md5_etags or (learn and is_md5(o.etag))
        sums[o.rel], md5 = _copy_one(have[o.rel], into / o.rel, o.etag if want_md5 else None, check)
        if md5 is not None and md5 == o.etag.lower():
            matched.append(o.rel)
        elif o.rel in md5_etags:
            raise CorruptEntry(f"{o.rel}: MD5 {md5} is not the store's ETag {o.etag}")
    digest = sums[listing.objects[0].rel] if listing.kind == "object" else dir_digest_of(sums)
    if digest != recorded_sha256:
        raise CorruptEntry(f"the files' digest {digest} is not the recorded {recorded_sha256}")
    return digest, sorted(matched)
