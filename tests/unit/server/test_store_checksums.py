"""The store's flexible checksums, made from the digests of ranges fetched in parallel."""

from __future__ import annotations

import base64
import hashlib
import os
import random
import zlib

import pytest
from modelserver.store_checksums import (
    COMBINABLE,
    StoreChecksum,
    combine,
    combined,
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


def crc_of(algorithm: str, data: bytes) -> int:
    h = new_hasher(algorithm)
    h.update(data)
    return int.from_bytes(h.digest(), "big")


def reflected_crc(data: bytes, poly: int, width: int) -> int:
    """A bit-at-a-time reflected CRC (init and final XOR all ones): the textbook definition, to hold the
    library to on small inputs."""
    mask = (1 << width) - 1
    crc = mask
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
    return crc ^ mask


REFERENCE = {  # reflected polynomial, width, the catalogue's check value of b"123456789"
    "CRC32": (0xEDB88320, 32, 0xCBF43926),
    "CRC32C": (0x82F63B78, 32, 0xE3069283),
    "CRC64NVME": (0x9A6C9329AC4BC9B5, 64, 0xAE8B14860A799888),
}


@pytest.mark.parametrize("algorithm", COMBINABLE)
def test_each_crc_is_the_catalogued_one(algorithm: str):
    poly, width, check = REFERENCE[algorithm]
    assert reflected_crc(b"123456789", poly, width) == check  # the reference itself
    assert crc_of(algorithm, b"123456789") == check
    data = os.urandom(777)
    assert crc_of(algorithm, data) == reflected_crc(data, poly, width)
    h = new_hasher(algorithm)  # streamed in pieces: the same value
    for at in range(0, len(data), 100):
        h.update(data[at : at + 100])
    assert int.from_bytes(h.digest(), "big") == reflected_crc(data, poly, width)
    assert len(h.digest()) == width // 8


@pytest.mark.parametrize("algorithm", COMBINABLE)
@pytest.mark.parametrize("len_a,len_b", [(0, 0), (0, 5), (5, 0), (1, 1), (1000, 3), (3 * MiB + 7, MiB - 1)])
def test_combine_is_the_crc_of_the_concatenation(algorithm: str, len_a: int, len_b: int):
    a, b = os.urandom(len_a), os.urandom(len_b)
    assert combine(algorithm, crc_of(algorithm, a), crc_of(algorithm, b), len(b)) == crc_of(algorithm, a + b)
    if algorithm == "CRC32":  # and zlib agrees
        assert combine(algorithm, zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@pytest.mark.parametrize("algorithm", ["CRC32C", "CRC64NVME"])
def test_full_object_crc32c_and_crc64nvme_from_ranges(algorithm: str):
    """The CRCs the store may list besides CRC32, combined from ranges the same way (8-byte digests for
    CRC64NVME)."""
    data = os.urandom(3 * MiB + 5)
    h = new_hasher(algorithm)
    h.update(data)
    expected = StoreChecksum(algorithm, "FULL_OBJECT", b64(h.digest()))
    for sizes in ([len(data)], [MiB, MiB, MiB + 5], [5, len(data) - 5]):
        assert combined(expected, ranges_of(algorithm, split(data, sizes)), len(data), None) == expected.value
    flipped = bytearray(data)
    flipped[7] ^= 0x80
    got = combined(expected, ranges_of(algorithm, split(bytes(flipped), [MiB, 2 * MiB + 5])), len(data), None)
    assert got is not None and got != expected.value


def test_composite_crc32c_is_the_crc32c_of_the_parts_crc32cs():
    data = os.urandom(6 * MiB)
    sizes = [5 * MiB, MiB]
    parts = split(data, sizes)
    joined = b"".join(crc_of("CRC32C", p).to_bytes(4, "big") for p in parts)
    value = b64(crc_of("CRC32C", joined).to_bytes(4, "big")) + "-2"
    expected = StoreChecksum("CRC32C", "COMPOSITE", value)
    assert combined(expected, ranges_of("CRC32C", parts), len(data), sizes) == value


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
    assert pick_algorithm(["CRC32", "crc32c"]) == "CRC32C"
    assert pick_algorithm(["CRC64NVME", "SHA1"]) == "CRC64NVME"
    assert pick_algorithm(["SHA1", "SHA256"]) == "SHA256"
    assert pick_algorithm(["MD5"]) == ""  # none we compute: the ETag is checked instead


def test_random_tilings_agree_with_zlib():
    rng = random.Random(7)
    data = os.urandom(300_000)
    expected = StoreChecksum("CRC32", "FULL_OBJECT", crc32_b64(data))
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 12)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        assert combined(expected, ranges_of("CRC32", split(data, sizes)), len(data), None) == expected.value
