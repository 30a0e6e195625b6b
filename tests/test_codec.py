"""Unit tests for ring.codec: the stored form of a chunk and how it fails.

What must hold: ``decode(encode(raw)) == raw`` for every codec; a stored chunk that was
altered in any way (header or payload, one bit or many, truncated or extended) never
decodes: it raises ``ChunkCorrupt`` so that readers fall back to another replica; raw
chunks above the limit are refused with ``ChunkTooLarge``.
"""

from __future__ import annotations

import random
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import codec
from ring.errors import ChunkCorrupt, ChunkTooLarge
from sr3.statedata import state_bytes

REPLAYABLE = settings(max_examples=60, derandomize=True, database=None, deadline=None)

COMPRESSIBLE = state_bytes(256 * 1024, seed=11)
INCOMPRESSIBLE = random.Random(12).randbytes(64 * 1024)


def _reheader(stored: bytes, **fields: int | bytes) -> bytes:
    """``stored`` with header fields replaced and the payload checksum recomputed, so
    that only the field under test is wrong."""
    names = ("magic", "version", "codec", "reserved", "raw", "payload", "checksum", "digest")
    values = dict(zip(names, codec.HEADER.unpack_from(stored), strict=True))
    payload = fields.pop("payload_bytes_value", stored[codec.HEADER_BYTES :])
    assert isinstance(payload, bytes)
    values.update(fields)
    if "checksum" not in fields:
        values["checksum"] = xxhash.xxh3_64_intdigest(payload)
    return codec.HEADER.pack(*values.values()) + payload


def test_chunk_id_is_xxh3_128_hex_of_raw_bytes() -> None:
    chunk_id, _stored = codec.encode(b"state")
    assert chunk_id == xxhash.xxh3_128_hexdigest(b"state")
    assert codec.chunk_id(b"state") == chunk_id
    assert codec.is_chunk_id(chunk_id)
    assert not codec.is_chunk_id(chunk_id.upper())
    assert not codec.is_chunk_id(chunk_id[:-1])


def test_compressible_chunk_round_trips_through_zstd() -> None:
    chunk_id, stored = codec.encode(COMPRESSIBLE)
    header = codec.verify_stored(stored, chunk_id)
    assert header.codec == codec.CODEC_ZSTD
    assert header.raw_bytes == len(COMPRESSIBLE)
    assert len(stored) < len(COMPRESSIBLE)
    assert codec.decode(stored, chunk_id) == COMPRESSIBLE


def test_incompressible_chunk_is_stored_raw() -> None:
    chunk_id, stored = codec.encode(INCOMPRESSIBLE)
    header = codec.parse_header(stored)
    assert header.codec == codec.CODEC_RAW
    assert header.payload_bytes == header.raw_bytes == len(INCOMPRESSIBLE)
    assert stored[codec.HEADER_BYTES :] == INCOMPRESSIBLE
    assert codec.decode(stored, chunk_id) == INCOMPRESSIBLE


def test_a_chunk_whose_sample_does_not_compress_is_stored_raw_without_compressing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Already compressed data (Spark's LZ4 files, RocksDB's SSTs) costs one sample's
    compression, not the whole chunk's; compressible data is still compressed whole, and
    small chunks are simply tried whole."""
    rng = random.Random(5)
    noise = rng.randbytes(4 * 1024 * 1024)
    compressed_sizes: list[int] = []
    real = codec._compressor

    class Counting:
        def __init__(self, level: int = codec.ZSTD_LEVEL) -> None:
            self.inner = real(level)

        def compress(self, data: bytes) -> bytes:
            compressed_sizes.append(len(data))
            return self.inner.compress(data)

    monkeypatch.setattr(codec, "_compressor", Counting)
    assert not codec.worth_compressing(noise)
    _chunk_id, stored = codec.encode(noise)
    assert codec.parse_header(stored).codec == codec.CODEC_RAW
    assert max(compressed_sizes) == codec.SAMPLE_SLICES * codec.SAMPLE_SLICE_BYTES
    compressed_sizes.clear()
    state = state_bytes(4 * 1024 * 1024, seed=3)
    _chunk_id, stored = codec.encode(state)
    assert codec.parse_header(stored).codec == codec.CODEC_ZSTD
    assert max(compressed_sizes) == len(state)
    small = rng.randbytes(1000)
    assert codec.worth_compressing(small)
    assert codec.decode(codec.encode(small)[1]) == small


def test_the_sample_picks_the_fast_level_only_where_it_compresses_as_well() -> None:
    """State-like bytes (their gain is repeats) compress at the fast level; bytes whose
    gain is only entropy coding (as Spark's LZ4 files and RocksDB's SSTs) at
    ``ZSTD_LEVEL``, where the fast level would store them uncompressed; both decode."""
    state = state_bytes(4 * 1024 * 1024, seed=7)
    assert codec.compression_level(state) == codec.ZSTD_LEVEL_FAST
    state_id, stored = codec.encode(state)
    fast = codec._compressor(codec.ZSTD_LEVEL_FAST).compress(state)
    assert stored[codec.HEADER_BYTES :] == fast
    assert codec.decode(stored, state_id) == state
    rng = random.Random(9)
    letters = bytes(rng.choice(b"abcdefghijklmnop") for _ in range(4 * 1024 * 1024))
    assert len(codec._compressor(codec.ZSTD_LEVEL_FAST).compress(letters)) > len(letters) * 0.9
    assert codec.compression_level(letters) == codec.ZSTD_LEVEL
    letters_id, stored = codec.encode(letters)
    assert codec.parse_header(stored).codec == codec.CODEC_ZSTD
    assert len(stored) < len(letters) * 0.6
    assert codec.decode(stored, letters_id) == letters


def test_decode_view_hands_out_a_raw_chunk_without_copying_it() -> None:
    chunk_id, stored = codec.encode(INCOMPRESSIBLE)
    raw = codec.decode_view(stored, chunk_id)
    assert isinstance(raw, memoryview) and raw.obj is stored
    assert raw == INCOMPRESSIBLE
    packed_id, packed = codec.encode(COMPRESSIBLE)
    assert codec.decode_view(packed, packed_id) == COMPRESSIBLE
    assert isinstance(codec.decode(stored, chunk_id), bytes)


def test_compression_can_be_switched_off() -> None:
    chunk_id, stored = codec.encode(COMPRESSIBLE, compress=False)
    assert codec.parse_header(stored).codec == codec.CODEC_RAW
    assert codec.decode(stored, chunk_id) == COMPRESSIBLE


def test_empty_chunk_round_trips() -> None:
    chunk_id, stored = codec.encode(b"")
    assert len(stored) == codec.HEADER_BYTES
    assert codec.decode(stored, chunk_id) == b""


@REPLAYABLE
@given(raw=st.binary(max_size=4096), compress=st.booleans())
def test_round_trip_any_bytes(raw: bytes, compress: bool) -> None:
    chunk_id, stored = codec.encode(raw, compress=compress)
    assert codec.decode(stored, chunk_id) == raw
    assert codec.decode(memoryview(stored)) == raw


def test_chunk_at_the_limit_is_accepted_and_one_byte_more_is_too_large() -> None:
    at_limit = bytes(codec.CHUNK_BYTES_MAX)
    chunk_id, stored = codec.encode(at_limit)
    assert codec.decode(stored, chunk_id) == at_limit
    with pytest.raises(ChunkTooLarge):
        codec.encode(bytes(codec.CHUNK_BYTES_MAX + 1))


# -- every way a stored chunk can be wrong raises ChunkCorrupt ----------------------------

ZSTD_ID, ZSTD_STORED = codec.encode(COMPRESSIBLE)
RAW_ID, RAW_STORED = codec.encode(INCOMPRESSIBLE)
OTHER_ID = codec.chunk_id(b"another chunk")


def _forged_content() -> bytes:
    """Consistent header and checksum, but the payload is not the addressed content."""
    _other_id, other = codec.encode(INCOMPRESSIBLE[::-1])
    return _reheader(RAW_STORED, payload_bytes_value=other[codec.HEADER_BYTES :])


def _forged_zstd_garbage() -> bytes:
    """A zstd chunk whose payload checksum matches garbage that is not a zstd frame."""
    garbage = b"\x00" * len(ZSTD_STORED[codec.HEADER_BYTES :])
    return _reheader(ZSTD_STORED, payload_bytes_value=garbage)


def _decompresses_to_other_length() -> bytes:
    """The header's raw length disagrees with what the zstd frame decompresses to."""
    (raw_bytes,) = struct.unpack_from("<Q", ZSTD_STORED, 8)
    return _reheader(ZSTD_STORED, raw=raw_bytes - 1)


CORRUPTIONS = {
    "empty": lambda: b"",
    "shorter than header": lambda: ZSTD_STORED[: codec.HEADER_BYTES - 1],
    "bad magic": lambda: b"XXXX" + ZSTD_STORED[4:],
    "unknown format version": lambda: _reheader(ZSTD_STORED, version=2),
    "reserved bits set": lambda: _reheader(ZSTD_STORED, reserved=1),
    "unknown codec": lambda: _reheader(ZSTD_STORED, codec=7),
    "raw codec with payload length != raw length": lambda: _reheader(
        RAW_STORED, raw=len(INCOMPRESSIBLE) + 1
    ),
    "truncated payload": lambda: ZSTD_STORED[:-1],
    "extra trailing bytes": lambda: ZSTD_STORED + b"\x00",
    "payload checksum mismatch": lambda: ZSTD_STORED[:-1] + bytes([ZSTD_STORED[-1] ^ 1]),
    "content does not match its address": _forged_content,
    "payload is not a zstd frame": _forged_zstd_garbage,
    "decompressed length mismatch": _decompresses_to_other_length,
    "header claims more than the chunk limit": lambda: _reheader(
        RAW_STORED, raw=codec.CHUNK_BYTES_MAX + 1, payload=codec.CHUNK_BYTES_MAX + 1
    ),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_every_corruption_kind_raises_chunk_corrupt(kind: str) -> None:
    """Breaks: one part of the stored form. Must hold: decode raises ChunkCorrupt (the
    error readers fall back on), never returns bytes, never raises anything else."""
    stored = CORRUPTIONS[kind]()
    with pytest.raises(ChunkCorrupt):
        codec.decode(stored)
    with pytest.raises(ChunkCorrupt):
        codec.decode_view(stored)


def test_wrong_expected_id_is_corrupt() -> None:
    with pytest.raises(ChunkCorrupt, match="expected"):
        codec.verify_stored(ZSTD_STORED, OTHER_ID)
    with pytest.raises(ChunkCorrupt):
        codec.decode(ZSTD_STORED, OTHER_ID)


@REPLAYABLE
@given(
    which=st.sampled_from(["zstd", "raw"]),
    position=st.one_of(st.integers(0, codec.HEADER_BYTES - 1), st.integers(min_value=0)),
    bit=st.integers(min_value=0, max_value=7),
)
def test_any_single_bit_flip_is_detected_by_decode(which: str, position: int, bit: int) -> None:
    """Breaks: one bit anywhere in a stored chunk (header included). Must hold: decode
    raises ChunkCorrupt, so a client falls back to the next replica instead of failing."""
    stored = bytearray(ZSTD_STORED if which == "zstd" else RAW_STORED)
    stored[position % len(stored)] ^= 1 << bit
    with pytest.raises(ChunkCorrupt):
        codec.decode(bytes(stored))
    with pytest.raises(ChunkCorrupt):
        codec.decode_view(bytes(stored))


@pytest.mark.parametrize("position", range(codec.HEADER_BYTES))
def test_any_header_byte_flip_is_caught_without_decompressing(position: int) -> None:
    """Breaks: one byte of the header of a zstd chunk. Must hold: ``verify_stored`` (the
    check a peer runs on every read before serving a chunk) raises ChunkCorrupt, so a peer
    quarantines the file instead of serving it."""
    stored = bytearray(ZSTD_STORED)
    stored[position] ^= 0x01
    with pytest.raises(ChunkCorrupt):
        codec.verify_stored(bytes(stored), ZSTD_ID)


def _with_payload(stored: bytes, payload: bytes) -> bytes:
    """``stored``'s header over another payload, its length and checksum recomputed
    (what a writer with the secret could send)."""
    header = bytearray(stored[: codec.HEADER_BYTES])
    header[16:24] = struct.pack("<Q", len(payload))
    header[24:32] = struct.pack("<Q", xxhash.xxh3_64_intdigest(payload))
    return bytes(header) + payload


@REPLAYABLE
@given(st.integers(0, 2**32 - 1), st.sampled_from(["flip", "cut", "append", "other", "none"]))
def test_the_peers_content_check_agrees_with_a_readers_decode(seed: int, change: str) -> None:
    """Breaks: a compressed chunk's payload flipped, cut, with bytes appended, or replaced
    by another chunk's, each with its length and checksum recomputed. Must hold: the
    check a peer runs before writing (``check_content``, into a reused buffer) refuses
    exactly what a reader's ``decode`` refuses, and never returns other content."""
    rng = random.Random(seed)
    offset = rng.randrange(0, len(COMPRESSIBLE) - 100_000)
    chunk_id, stored = codec.encode(COMPRESSIBLE[offset : offset + 100_000])
    assert codec.parse_header(stored).codec == codec.CODEC_ZSTD
    payload = bytearray(stored[codec.HEADER_BYTES :])
    if change == "flip":
        payload[rng.randrange(len(payload))] ^= 1 << rng.randrange(8)
    elif change == "cut":
        del payload[rng.randrange(1, len(payload)) :]
    elif change == "append":
        payload += codec.encode(rng.randbytes(100) * 50)[1][codec.HEADER_BYTES :]
    elif change == "other":
        payload = bytearray(codec.encode(COMPRESSIBLE[:90_000])[1][codec.HEADER_BYTES :])
    candidate = _with_payload(stored, bytes(payload))
    try:
        decoded = codec.decode(candidate, chunk_id)
    except ChunkCorrupt:
        decoded = None
    try:
        codec.check_content(candidate, chunk_id)
        checked = True
    except ChunkCorrupt:
        checked = False
    assert checked == (decoded is not None), change
    assert decoded is None or codec.chunk_id(decoded) == chunk_id
