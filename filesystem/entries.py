"""What a file or directory of the ``sr3://`` namespace is on the ring: its record.

Every path has one record (``ring.fs_api.path_key``). A file's holds its size,
modification time and either its bytes (small files: most of what Spark writes, one
request per replica) or the ``BlobRef`` of the chunks that hold them, written and
durable before the record. A directory's holds its modification time.

    value = b"SR3F" | u8 type | u64 size | u64 mtime_ms | u32 header length
            | header JSON (the blob, if any) | inline bytes

Type, size and time come first, in ``STAT_BYTES``: a scan of a directory (which gives
each record's first bytes) describes its entries without reading their records.

The record's refs are the chunk ids of the blob, so the chunks stay while it exists and
are collected (after the grace) once its tombstone replaces it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any, Literal

from ring import api
from ring.blobs import BlobRef
from ring.errors import ProtocolError
from ring.fs_api import FILE_BYTES_MAX, MTIME_MS_MAX

__all__ = ["INLINE_BYTES_MAX", "STAT_BYTES", "Entry", "decode_entry", "decode_stat", "encode_entry"]

MAGIC = b"SR3F"
_STAT = struct.Struct(">BQQ")
_HEADER = struct.Struct(">I")
STAT_BYTES = len(MAGIC) + _STAT.size
_TYPES: tuple[Literal["file", "directory"], ...] = ("file", "directory")
HEADER_BYTES_MAX = 64 * 1024
# Files up to this size live in their record; larger ones in chunks. A record holds at
# most ``api.RECORD_BYTES_MAX``; keeping inline files well below it keeps rounds small.
INLINE_BYTES_MAX = 256 * 1024


@dataclass(frozen=True, slots=True)
class Entry:
    """A file (``inline`` bytes or a ``blob``) or a directory made by mkdirs."""

    type: Literal["file", "directory"]
    size: int
    mtime_ms: int
    inline: bytes = b""
    blob: BlobRef | None = None

    @property
    def refs(self) -> tuple[str, ...]:
        if self.blob is None:
            return ()
        return tuple(dict.fromkeys(extent.chunk_id for extent in self.blob.extents))


def encode_entry(entry: Entry) -> bytes:
    header: dict[str, Any] = {}
    if entry.blob is not None:
        header["blob"] = entry.blob.to_json()
    raw = json.dumps(header, separators=(",", ":")).encode()
    stat = _STAT.pack(_TYPES.index(entry.type), entry.size, entry.mtime_ms)
    value = MAGIC + stat + _HEADER.pack(len(raw)) + raw + entry.inline
    if len(value) > api.RECORD_BYTES_MAX:
        raise ProtocolError(f"a file record of {len(value)} bytes is above the record limit")
    return value


def _int(value: Any, name: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ProtocolError(f"file record: {name} must be an integer in 0..{maximum}")
    return value


def decode_stat(head: bytes) -> tuple[Literal["file", "directory"], int, int]:
    """Type, size and modification time from a record's first ``STAT_BYTES``."""
    if len(head) < STAT_BYTES or not head.startswith(MAGIC):
        raise ProtocolError("not a file record")
    kind, size, mtime_ms = _STAT.unpack_from(head, len(MAGIC))
    if kind >= len(_TYPES):
        raise ProtocolError("file record: type is 'file' or 'directory'")
    return (
        _TYPES[kind],
        _int(size, "size", FILE_BYTES_MAX),
        _int(mtime_ms, "mtime_ms", MTIME_MS_MAX),
    )


def decode_entry(value: bytes) -> Entry:
    """The entry a record value holds; ``ProtocolError`` for anything else (a record
    under the namespace's keys written by someone else, or damaged)."""
    kind, size, mtime_ms = decode_stat(value)
    if len(value) < STAT_BYTES + _HEADER.size:
        raise ProtocolError("not a file record")
    (length,) = _HEADER.unpack_from(value, STAT_BYTES)
    start = STAT_BYTES + _HEADER.size
    if length > HEADER_BYTES_MAX or start + length > len(value):
        raise ProtocolError("file record: bad header length")
    header = api.load_json(value[start : start + length])
    if not isinstance(header, dict):
        raise ProtocolError("file record: the header is a JSON object")
    inline = value[start + length :]
    blob = BlobRef.from_json(header["blob"]) if header.get("blob") is not None else None
    if kind == "file" and (blob.size if blob is not None else len(inline)) != size:
        raise ProtocolError("file record: its size does not match its bytes")
    if blob is not None and inline:
        raise ProtocolError("file record: bytes inline and in chunks")
    if kind == "directory" and (blob is not None or inline or size):
        raise ProtocolError("file record: a directory holds no bytes")
    return Entry(kind, size, mtime_ms, inline, blob)
