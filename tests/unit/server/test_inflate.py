"""A compressed request body is inflated in steps with a cap on its inflated size: a compression bomb
(a small gzip body that inflates to gigabytes) is refused with 413 having held no more than the cap, the
body and a few steps, never inflated whole; corrupt and cut-short streams are 400s; what gzip.decompress
accepted still decodes the same (issue 24, finding 5)."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pytest
from modelserver.errors import InvalidInput, PayloadTooLarge
from modelserver.inflate import STEP, inflate

LIMIT = 4 * 1024 * 1024


def bomb(inflated: int, encoding: str = "gzip") -> bytes:
    """``inflated`` zero bytes, compressed in pieces (never held whole here either)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    piece = bytes(1 << 20)
    parts = [c.compress(piece) for _ in range(inflated // len(piece))]
    return b"".join(parts) + c.flush()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_bomb_is_refused_holding_no_more_than_the_cap_and_one_step(encoding):
    body = bomb(1 << 30, encoding)  # 1 GiB of zeros in about 1 MiB
    assert len(body) < 2 * 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge, match="inflates to more than"):
            inflate(body, encoding, LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # what was held: the output so far (the cap), a step, and the input's unconsumed tail -- bounded by the
    # cap and the body, not by the 1 GiB it would inflate to
    assert peak < LIMIT + len(body) + 4 * STEP


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)], ids=["gzip", "deflate"]
)
def test_a_body_under_the_cap_decodes_as_before(encoding, compress):
    data = b"".join(i.to_bytes(4, "little") for i in range(500_000))  # 2 MB, more than one step
    assert inflate(compress(data), encoding, LIMIT) == data
    assert inflate(compress(data), encoding, len(data)) == data  # exactly the cap is allowed
    with pytest.raises(PayloadTooLarge):
        inflate(compress(data), encoding, len(data) - 1)


def test_several_gzip_members_decode_as_gzip_decompress_does():
    body = gzip.compress(b"first ") + gzip.compress(b"second")
    assert inflate(body, "gzip", LIMIT) == gzip.decompress(body) == b"first second"


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (gzip.compress(b"x" * 100_000)[:-20], "gzip"),  # cut short
        (zlib.compress(b"x" * 100_000)[:-10], "deflate"),
        (b"not compressed at all", "gzip"),
        (b"not compressed at all", "deflate"),
    ],
    ids=["gzip-truncated", "deflate-truncated", "gzip-garbage", "deflate-garbage"],
)
def test_corrupt_or_truncated_streams_are_invalid_input(body, encoding):
    with pytest.raises(InvalidInput, match=f"cannot decode {encoding} body"):
        inflate(body, encoding, LIMIT)
