"""The store's flexible checksums, made from the digests of ranges fetched in parallel."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import zlib

import pytest
from modelserver.store_checksums import (
    StoreChecksum,
    combined,
    crc32_combine,
    from_response,
    new_hasher,
    pick_algorithm,
)

MiB = 1 << 20


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def crc32_b64(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def ranges_of(algorithm: str, pieces: list[bytes]) -> dict[int, tuple[bytes, int]]:
    """Each piece's digest keyed by its start, as the download's stream hashes record them."""
    out, start = {}, 0
    for data in pieces:
        h = new_hasher(algorithm)
        h.update(data)
        out[start] = (h.digest(), len(data))
        start += len(data)
    return out


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    out, at = [], 0
    for n in sizes:
        out.append(data[at : at + n])
        at += n
    assert at == len(data)
    return out


@pytest.mark.parametrize("len_a,len_b", [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 3), (3 * MiB + 7, MiB - 1)])
def test_crc32_combine_is_the_crc_of_the_concatenation(len_a: int, len_b: int):
    a, b = os.urandom(len_a), os.urandom(len_b)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_full_object_crc32_from_ranges_of_any_sizes():
    data = os.urandom(5 * MiB + 123)
    expected = StoreChecksum("CRC32", "FULL_OBJECT", crc32_b64(data))
    for sizes in ([len(data)], [MiB] * 5 + [123], [7, len(data) - 7], [2 * MiB, 3 * MiB + 123]):
        assert combined(expected, ranges_of("CRC32", split(data, sizes)), len(data), None) == expected.value


def test_full_object_crc32_of_other_bytes_differs():
    data = os.urandom(2 * MiB)
    expected = StoreChecksum("CRC32", "FULL_OBJECT", crc32_b64(data))
    flipped = bytearray(data)
    flipped[MiB + 5] ^= 0x01
    got = combined(expected, ranges_of("CRC32", split(bytes(flipped), [MiB, MiB])), len(data), None)
    assert got is not None and got != expected.value


def test_ranges_that_do_not_tile_the_object_make_no_value():
    data = os.urandom(3000)
    expected = StoreChecksum("CRC32", "FULL_OBJECT", crc32_b64(data))
    r = ranges_of("CRC32", split(data, [1000, 1000, 1000]))
    del r[1000]  # a range that never completed
    assert combined(expected, r, len(data), None) is None


def test_composite_crc32_is_the_crc_of_the_parts_crcs_with_their_count():
    """S3's COMPOSITE checksum: the checksum of the concatenated part checksums, then "-N"."""
    data = os.urandom(11 * MiB)
    sizes = [5 * MiB, 5 * MiB, MiB]
    parts = split(data, sizes)
    value = crc32_b64(b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts)) + "-3"
    expected = StoreChecksum("CRC32", "COMPOSITE", value)
    assert expected.parts == 3
    assert combined(expected, ranges_of("CRC32", parts), len(data), sizes) == value
    # ranges that are not the parts cannot make it
    assert combined(expected, ranges_of("CRC32", split(data, [MiB] * 11)), len(data), sizes) is None


def test_composite_sha256():
    data = os.urandom(3 * MiB)
    sizes = [2 * MiB, MiB]
    parts = split(data, sizes)
    value = b64(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()) + "-2"
    expected = StoreChecksum("SHA256", "COMPOSITE", value)
    assert combined(expected, ranges_of("SHA256", parts), len(data), sizes) == value


def test_full_object_sha256_needs_one_range():
    data = os.urandom(4096)
    expected = StoreChecksum("SHA256", "FULL_OBJECT", b64(hashlib.sha256(data).digest()))
    assert combined(expected, ranges_of("SHA256", [data]), len(data), None) == expected.value
    assert combined(expected, ranges_of("SHA256", split(data, [1000, 3096])), len(data), None) is None


def test_from_response_and_the_algorithm_choice():
    full = {"ChecksumCRC32": "XUhZqw==", "ChecksumType": "FULL_OBJECT"}
    assert from_response(full, "CRC32") == StoreChecksum("CRC32", "FULL_OBJECT", "XUhZqw==")
    # no type given: "-N" means COMPOSITE; otherwise the caller decides
    composite = StoreChecksum("CRC32", "COMPOSITE", "nwsbsg==-5")
    assert from_response({"ChecksumCRC32": "nwsbsg==-5"}, "CRC32") == composite
    assert from_response({"ChecksumCRC32": "nwsbsg=="}, "CRC32") == StoreChecksum("CRC32", "", "nwsbsg==")
    assert from_response({"ChecksumSHA256": "x"}, "CRC32") is None
    assert pick_algorithm(["SHA256", "CRC32"]) == "CRC32"  # the cheapest first
    assert pick_algorithm(["crc32c"]) == ""  # needs awscrt: the ETag is checked instead
    assert pick_algorithm(["CRC64NVME", "SHA1"]) == "SHA1"


def test_random_tilings_agree_with_zlib():
    rng = random.Random(7)
    data = os.urandom(300_000)
    expected = StoreChecksum("CRC32", "FULL_OBJECT", crc32_b64(data))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert combined(expected, ranges_of("CRC32", split(data, sizes)), len(data), None) == expected.value
