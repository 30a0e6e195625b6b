"""The chunk codec: content addresses and the stored form of a chunk.

A chunk is immutable bytes addressed by the xxh3-128 of its raw content (32 hex digits).
Peers store and ship the *stored form*: a fixed 48-byte header followed by the payload,
which is the raw bytes compressed with zstd, or the raw bytes themselves when compression
does not pay. The header carries the format version, the codec, the raw and payload
lengths, an xxh3-64 of the payload (cheap check of what is on disk or on the wire) and the
chunk id (the end-to-end check after decompression).

    offset size field
    0      4    magic b"SR3C"
    4      1    format version (1)
    5      1    codec (0 = raw, 1 = zstd)
    6      2    reserved, zero
    8      8    raw length (little endian)
    16     8    payload length
    24     8    xxh3-64 of the payload
    32     16   chunk id: xxh3-128 of the raw bytes (big endian digest)

Everything here is a pure function of bytes; callers own the I/O.
"""

from __future__ import annotations

import json
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any

import xxhash
import zstandard

from ring.errors import ChunkCorrupt, ChunkTooLarge

__all__ = [
    "CHUNK_BYTES_MAX",
    "compact_json",
    "CHUNK_ID_PATTERN",
    "CODEC_RAW",
    "CODEC_ZSTD",
    "HEADER_BYTES",
    "StoredHeader",
    "check_before_write",
    "check_content",
    "chunk_id",
    "compression_level",
    "decode",
    "encode",
    "is_chunk_id",
    "parse_header",
    "verify_stored",
    "worth_compressing",
]

MAGIC = b"SR3C"
FORMAT_VERSION = 1
CODEC_RAW = 0
CODEC_ZSTD = 1
HEADER = struct.Struct("<4sBBHQQQ16s")
HEADER_BYTES = HEADER.size  # 48
# Largest raw chunk accepted anywhere. Blobs are cut into chunks of at most this size;
# bodies on the wire are bounded by it plus the header and zstd's worst-case expansion.
CHUNK_BYTES_MAX = 8 * 1024 * 1024
STORED_BYTES_MAX = HEADER_BYTES + CHUNK_BYTES_MAX + CHUNK_BYTES_MAX // 128 + 1024
CHUNK_ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
# zstd level 1 is the fastest level that compresses both kinds of state well: raw
# values and already compressed files (Spark's LZ4 delta files, RocksDB's SSTs), where
# what zstd still gains comes from its entropy coding.
ZSTD_LEVEL = 1
# A fast level skips that entropy coding of literals: on data whose gain comes from
# repeats (raw state) it compresses as well for a quarter less CPU and decodes faster, on
# already compressed files it gains nothing. A chunk whose sample compresses at the fast
# level to at most FAST_LEVEL_SLACK more than at ZSTD_LEVEL is compressed at the fast
# level (benchmarks/bench_cpu_budget.py measures the levels on state-like data and on
# real Spark checkpoints: -2 stores state-like data 0.8 % larger than level 1, -3 3 %,
# -4 46 %). zstd frames are decoded alike whatever their level.
ZSTD_LEVEL_FAST = -2
FAST_LEVEL_SLACK = 0.03
# Compression must save at least this fraction to be kept; otherwise the payload is raw
# and reads skip decompression.
COMPRESSION_GAIN_MIN = 0.03
# Before compressing a chunk, a sample of it (slices from its start, middle and end) is
# compressed: a chunk whose sample saves less than SAMPLE_GAIN_MIN is stored raw without
# compressing the rest. What Spark writes is mostly compressed already (LZ4 delta and
# snapshot files, compressed RocksDB SST files): compressing it again costs the writer
# CPU and every reader a decompression, for a few percent.
SAMPLE_SLICE_BYTES = 32 * 1024
SAMPLE_SLICES = 3
SAMPLE_GAIN_MIN = 0.10

_local = threading.local()


def _compressor(level: int = ZSTD_LEVEL) -> zstandard.ZstdCompressor:
    compressors: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if compressors is None:
        compressors = _local.compressors = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    decompressor: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if decompressor is None:
        decompressor = zstandard.ZstdDecompressor()
        _local.decompressor = decompressor
    return decompressor


@dataclass(frozen=True, slots=True)
class StoredHeader:
    codec: int
    raw_bytes: int
    payload_bytes: int
    payload_checksum: int
    chunk_id: str


def compact_json(data: Any) -> bytes:
    """JSON without spaces, UTF-8: the body of every JSON request between peers."""
    return json.dumps(data, separators=(",", ":")).encode()


def chunk_id(raw: bytes | memoryview) -> str:
    """The content address of raw chunk bytes: xxh3-128, 32 lowercase hex digits."""
    return xxhash.xxh3_128_hexdigest(raw)


def is_chunk_id(text: str) -> bool:
    return CHUNK_ID_PATTERN.match(text) is not None


def compression_level(raw: bytes | memoryview) -> int | None:
    """The zstd level to compress ``raw`` at, judged on a sample of it: None (store it
    raw) unless the sample compresses by at least ``SAMPLE_GAIN_MIN``; then
    ``ZSTD_LEVEL_FAST`` if it does about as well there, else ``ZSTD_LEVEL``. Small chunks
    are simply compressed whole at ``ZSTD_LEVEL``."""
    if len(raw) <= 2 * SAMPLE_SLICES * SAMPLE_SLICE_BYTES:
        return ZSTD_LEVEL
    view = memoryview(raw)
    step = (len(raw) - SAMPLE_SLICE_BYTES) // (SAMPLE_SLICES - 1)
    sample = b"".join(view[i * step : i * step + SAMPLE_SLICE_BYTES] for i in range(SAMPLE_SLICES))
    packed = len(_compressor(ZSTD_LEVEL).compress(sample))
    if packed > len(sample) * (1.0 - SAMPLE_GAIN_MIN):
        return None
    fast = len(_compressor(ZSTD_LEVEL_FAST).compress(sample))
    return ZSTD_LEVEL_FAST if fast <= packed * (1.0 + FAST_LEVEL_SLACK) else ZSTD_LEVEL


def worth_compressing(raw: bytes | memoryview) -> bool:
    """Whether a sample of ``raw`` compresses by at least ``SAMPLE_GAIN_MIN``."""
    return compression_level(raw) is not None


def encode(
    raw: bytes | memoryview, *, compress: bool = True, sample: bool = True
) -> tuple[str, bytes]:
    """Return ``(chunk_id, stored_form)`` for raw chunk bytes: compressed when
    ``compress`` and it pays, at the level a sample chooses (``compression_level``;
    without ``sample``, the whole chunk is tried at ``ZSTD_LEVEL``)."""
    chunk_id, header, payload = encode_parts(raw, compress=compress, sample=sample)
    return chunk_id, header + payload


def encode_parts(
    raw: bytes | memoryview, *, compress: bool = True, sample: bool = True
) -> tuple[str, bytes, bytes]:
    """``encode`` as ``(chunk_id, header, payload)``: the stored form is the header
    followed by the payload, for a writer that sends them without joining them. The
    payload never shares memory with ``raw``."""
    if len(raw) > CHUNK_BYTES_MAX:
        raise ChunkTooLarge(f"chunk of {len(raw)} bytes is above the limit of {CHUNK_BYTES_MAX}")
    digest = xxhash.xxh3_128_digest(raw)
    codec = CODEC_RAW
    payload: bytes | memoryview = raw
    level = None
    if compress and len(raw) > 0:
        level = compression_level(raw) if sample else ZSTD_LEVEL
    if level is not None:
        packed = _compressor(level).compress(raw)
        if len(packed) <= len(raw) * (1.0 - COMPRESSION_GAIN_MIN):
            codec, payload = CODEC_ZSTD, packed
    header = HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        codec,
        0,
        len(raw),
        len(payload),
        xxhash.xxh3_64_intdigest(payload),
        digest,
    )
    return digest.hex(), header, bytes(payload)


def parse_header(stored: bytes | memoryview) -> StoredHeader:
    """Parse and sanity-check the header of a stored chunk (not its payload)."""
    if len(stored) < HEADER_BYTES:
        raise ChunkCorrupt(f"stored chunk of {len(stored)} bytes is shorter than its header")
    magic, version, codec, reserved, raw_bytes, payload_bytes, checksum, digest = (
        HEADER.unpack_from(stored)
    )
    if magic != MAGIC:
        raise ChunkCorrupt("stored chunk has a bad magic number")
    if version != FORMAT_VERSION or reserved != 0:
        raise ChunkCorrupt(f"stored chunk has unsupported format version {version}")
    if codec not in (CODEC_RAW, CODEC_ZSTD):
        raise ChunkCorrupt(f"stored chunk has unknown codec {codec}")
    if raw_bytes > CHUNK_BYTES_MAX:
        # No stored chunk can be that large: the header is damaged (or forged). Corrupt,
        # so that peers quarantine the file and readers fall back to another replica.
        raise ChunkCorrupt(f"stored chunk claims {raw_bytes} raw bytes, above the limit")
    if codec == CODEC_RAW and payload_bytes != raw_bytes:
        raise ChunkCorrupt("raw chunk payload length differs from its raw length")
    return StoredHeader(codec, raw_bytes, payload_bytes, checksum, digest.hex())


def verify_stored(stored: bytes | memoryview, expected_id: str | None = None) -> StoredHeader:
    """Check the header and payload checksum of a stored chunk without decompressing it."""
    header = parse_header(stored)
    if expected_id is not None and header.chunk_id != expected_id:
        raise ChunkCorrupt(f"stored chunk is {header.chunk_id}, expected {expected_id}")
    payload = memoryview(stored)[HEADER_BYTES:]
    if len(payload) != header.payload_bytes:
        raise ChunkCorrupt(
            f"chunk {header.chunk_id}: payload is {len(payload)} bytes, header says "
            f"{header.payload_bytes}"
        )
    if xxhash.xxh3_64_intdigest(payload) != header.payload_checksum:
        raise ChunkCorrupt(f"chunk {header.chunk_id}: payload checksum mismatch")
    # The payload checksum does not cover the header's raw length; for zstd the frame
    # header records the content size, which must agree (a raw chunk's was checked above).
    if header.codec == CODEC_ZSTD and _frame_content_size(payload) != header.raw_bytes:
        raise ChunkCorrupt(f"chunk {header.chunk_id}: raw length disagrees with its payload")
    return header


def check_before_write(stored: bytes | memoryview, expected_id: str) -> StoredHeader:
    """What a peer checks before it writes a chunk: everything ``decode`` checks, the
    content address included (a compressed chunk is decompressed and hashed), so that
    the first writer of an address never decides what it means: a payload altered by a
    fault in its writer or on the way, with a checksum recomputed to match, is refused
    here. The writer does not decode what it encoded (every replica does): it encodes
    again when the replicas refuse it (``ChunkIO.store_raw_chunk``)."""
    return check_content(stored, expected_id)


def check_content(stored: bytes | memoryview, expected_id: str) -> StoredHeader:
    """``decode``'s checks without returning the raw bytes: a compressed chunk is
    decompressed into a buffer this thread keeps (as large as the largest chunk it
    checked, at most ``CHUNK_BYTES_MAX``) rather than a new one per chunk, whose fresh
    pages cost more CPU than the decompression on some machines."""
    header = verify_stored(stored, expected_id)
    payload = memoryview(stored)[HEADER_BYTES:]
    if header.codec != CODEC_ZSTD:
        raw: memoryview = payload
    else:
        buffer: bytearray | None = getattr(_local, "check_buffer", None)
        if buffer is None or len(buffer) < header.raw_bytes:
            buffer = _local.check_buffer = bytearray(header.raw_bytes)
        raw = memoryview(buffer)[: header.raw_bytes]
        filled = 0
        try:
            # The whole payload as one input: zstd then decodes the frame in one pass
            # into ``raw`` instead of through its window buffer (4 % less CPU per chunk).
            with _decompressor().stream_reader(
                payload, read_size=max(len(payload), 1), read_across_frames=False
            ) as reader:
                while filled < header.raw_bytes:
                    count = reader.readinto(raw[filled:])
                    if not count:
                        break
                    filled += count
                more = reader.read(1)
        except zstandard.ZstdError as exc:
            raise ChunkCorrupt(f"chunk {header.chunk_id}: {exc}") from exc
        if filled != header.raw_bytes or more:
            raise ChunkCorrupt(f"chunk {header.chunk_id}: decompressed length mismatch")
    if xxhash.xxh3_128_hexdigest(raw) != header.chunk_id:
        raise ChunkCorrupt(f"chunk {header.chunk_id}: content does not match its address")
    return header


def _frame_content_size(payload: memoryview) -> int:
    try:
        return int(zstandard.frame_content_size(payload))
    except zstandard.ZstdError:
        return -1


def decode(stored: bytes | memoryview, expected_id: str | None = None) -> bytes:
    """Verify a stored chunk end to end and return its raw bytes.

    Raises ``ChunkCorrupt`` unless the payload checksum, the decompressed length and the
    content address all match. A chunk that fails is never returned.
    """
    raw = decode_view(stored, expected_id)
    return raw if isinstance(raw, bytes) else bytes(raw)


def decode_view(stored: bytes | memoryview, expected_id: str | None = None) -> bytes | memoryview:
    """``decode`` without copying a raw (uncompressed) chunk: its bytes are returned as a
    view into ``stored``. For a caller that only checks a chunk or writes it out."""
    header = verify_stored(stored, expected_id)
    payload = memoryview(stored)[HEADER_BYTES:]
    raw: bytes | memoryview
    if header.codec == CODEC_ZSTD:
        try:
            raw = _decompressor().decompress(
                payload, max_output_size=header.raw_bytes, allow_extra_data=False
            )
        except zstandard.ZstdError as exc:
            raise ChunkCorrupt(f"chunk {header.chunk_id}: {exc}") from exc
    else:
        raw = payload
    if len(raw) != header.raw_bytes:
        raise ChunkCorrupt(f"chunk {header.chunk_id}: decompressed length mismatch")
    if xxhash.xxh3_128_hexdigest(raw) != header.chunk_id:
        raise ChunkCorrupt(f"chunk {header.chunk_id}: content does not match its address")
    return raw
