"""What a file of the ``sr3://`` namespace is on the ring: the value of its record.

A file's record (``ring.fs_api.file_key``) holds its size, modification time and either
its bytes (small files: most of what Spark writes, one request per replica) or the
``BlobRef`` of the chunks that hold them, written and durable before the record. A
directory made by mkdirs has a record of its own (``ring.fs_api.directory_key``) with
its modification time; other directories are implied by the paths of their files.

    value = b"SR3F" | u32 header length | header JSON | inline bytes

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

__all__ = ["INLINE_BYTES_MAX", "Entry", "decode_entry", "encode_entry"]

MAGIC = b"SR3F"
_HEADER = struct.Struct(">I")
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
    header: dict[str, Any] = {"type": entry.type, "size": entry.size, "mtime_ms": entry.mtime_ms}
    if entry.blob is not None:
        header["blob"] = entry.blob.to_json()
    raw = json.dumps(header, separators=(",", ":")).encode()
    value = MAGIC + _HEADER.pack(len(raw)) + raw + entry.inline
    if len(value) > api.RECORD_BYTES_MAX:
        raise ProtocolError(f"a file record of {len(value)} bytes is above the record limit")
    return value


def _int(value: Any, name: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ProtocolError(f"file record: {name} must be an integer in 0..{maximum}")
    return value


def decode_entry(value: bytes) -> Entry:
    """The entry a record value holds; ``ProtocolError`` for anything else (a record
    under the namespace's keys written by someone else, or damaged)."""
    if len(value) < len(MAGIC) + _HEADER.size or not value.startswith(MAGIC):
        raise ProtocolError("not a file record")
    (length,) = _HEADER.unpack_from(value, len(MAGIC))
    start = len(MAGIC) + _HEADER.size
    if length > HEADER_BYTES_MAX or start + length > len(value):
        raise ProtocolError("file record: bad header length")
    header = api.load_json(value[start : start + length])
    if not isinstance(header, dict):
        raise ProtocolError("file record: the header is a JSON object")
    kind = header.get("type")
    if kind not in ("file", "directory"):
        raise ProtocolError("file record: type is 'file' or 'directory'")
    size = _int(header.get("size"), "size", FILE_BYTES_MAX)
    mtime_ms = _int(header.get("mtime_ms"), "mtime_ms", MTIME_MS_MAX)
    inline = value[start + length :]
    blob = BlobRef.from_json(header["blob"]) if header.get("blob") is not None else None
    if kind == "file" and (blob.size if blob is not None else len(inline)) != size:
        raise ProtocolError("file record: its size does not match its bytes")
    if blob is not None and inline:
        raise ProtocolError("file record: bytes inline and in chunks")
    return Entry(kind, size, mtime_ms, inline, blob)
