"""The directory digest: one definition for the server's own check (:func:`.loader.dir_digest`), the
fetch's (:mod:`.s3_verify`, from the sha256s it computed while downloading) and ``python -m modelserver
digest DIR``. It is the sha256 of one line per file, in the order of the relative paths:
``<relative posix path> NUL <hex sha256 of the file> LF``."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping


def dir_digest_of(file_sha256: Mapping[str, str]) -> str:
    """The directory digest from each relative path's sha256."""
    h = hashlib.sha256()
    for rel in sorted(file_sha256):
        h.update(rel.encode("utf-8") + b"\0" + file_sha256[rel].encode("ascii") + b"\n")
    return h.hexdigest()
