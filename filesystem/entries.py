"""What a file or directory of the ``sr3://`` namespace is on the ring: its record.

Every path has one record (``ring.fs_api.path_key``). A file's holds its size,
modification time and either its bytes (small files: most of what Spark writes, one
request per replica) or the ``BlobRef`` of the chunks that hold them, written and
durable before the record. A directory's holds its modification time.

    value = b"SR3F" | u8 type and marker | u64 size | u64 mtime_ms
            | [12 bytes: the rename's id, when marked] | u32 header length
            | header JSON (the blob, if any; the previous entry's stat, if any)
            | inline bytes | the previous entry's inline bytes

Type, size, time and marker come first, in ``STAT_BYTES``: a scan of a directory (which
gives each record's first bytes) describes its entries without reading their records.

A directory rename marks what it moves (``Marker``, in the type byte's high bits): the
copy at the destination as *incoming* and the original as *outgoing*, both naming the
rename. Such an entry is visible by the state of the rename's intent record
(``filesystem.moves``): incoming ones once it committed, outgoing ones until then. A
file renamed with overwrite onto a file (``filesystem.file_rename``) is written incoming
over it with that file as its *previous* entry (a flag in the type byte): readers see the
previous one until the rename commits, so the target holds the old file or the new one,
never neither.

The record's refs are the chunk ids of the blob, so the chunks stay while it exists and
are collected (after the grace) once its tombstone replaces it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace
from typing import Any, Literal

import xxhash

from ring import api
from ring.blobs import BlobRef
from ring.errors import ProtocolError
from ring.fs_api import FILE_BYTES_MAX, MTIME_MS_MAX

__all__ = [
    "INLINE_BYTES_MAX",
    "STAT_BYTES",
    "Entry",
    "Head",
    "Marker",
    "decode_entry",
    "decode_head",
    "encode_entry",
]

MAGIC = b"SR3F"
_STAT = struct.Struct(">BQQ")
_HEADER = struct.Struct(">I")
_MARKER_ID_BYTES = 12  # a rename's operation id: 24 hex digits
# What a scan asks of each record: enough for a marked one; an unmarked one's head is
# shorter (its header length and header follow, and are not read as a head).
STAT_BYTES = len(MAGIC) + _STAT.size + _MARKER_ID_BYTES
_UNMARKED_BYTES = len(MAGIC) + _STAT.size
_TYPES: tuple[Literal["file", "directory"], ...] = ("file", "directory")
_TYPE_BITS = 0x0F
_PREVIOUS = 0x20
_INCOMING = 0x40
_OUTGOING = 0x80
MarkerKind = Literal["incoming", "outgoing"]
HEADER_BYTES_MAX = 64 * 1024
# Files up to this size live in their record; larger ones in chunks. A record holds at
# most ``api.RECORD_BYTES_MAX``; keeping inline files well below it keeps rounds small.
INLINE_BYTES_MAX = 256 * 1024


@dataclass(frozen=True, slots=True)
class Marker:
    """An entry a directory rename is moving: its copy at the destination (incoming)
    or the original (outgoing); ``rename`` is the rename's operation id."""

    kind: MarkerKind
    rename: str


@dataclass(frozen=True, slots=True)
class Head:
    """What a record's first ``STAT_BYTES`` say: type, size, time, marker."""

    type: Literal["file", "directory"]
    size: int
    mtime_ms: int
    marker: Marker | None
    # An incoming file that holds the file it replaces until its rename commits.
    has_previous: bool = False


@dataclass(frozen=True, slots=True)
class Entry:
    """A file (``inline`` bytes or a ``blob``) or a directory made by mkdirs."""

    type: Literal["file", "directory"]
    size: int
    mtime_ms: int
    inline: bytes = b""
    blob: BlobRef | None = None
    marker: Marker | None = None
    # The file an incoming one replaces, shown until its rename commits (unmarked itself).
    previous: Entry | None = None

    @property
    def refs(self) -> tuple[str, ...]:
        """The chunks the record keeps: its blob's and its previous entry's."""
        blobs = [e.blob for e in (self, self.previous) if e is not None and e.blob is not None]
        return tuple(dict.fromkeys(extent.chunk_id for blob in blobs for extent in blob.extents))

    def settled(self) -> Entry:
        """The entry with no marker and no previous one: what a committed rename leaves."""
        return Entry(self.type, self.size, self.mtime_ms, self.inline, self.blob)

    @property
    def checksum(self) -> str:
        """A file's content checksum (``fs_api.CHECKSUM_ALGORITHM``): its blob's digest,
        or that of its inline bytes; empty for a directory."""
        if self.type != "file":
            return ""
        if self.blob is not None:
            return self.blob.digest
        return xxhash.xxh3_128(self.inline).hexdigest()


def encode_entry(entry: Entry) -> bytes:
    header: dict[str, Any] = {}
    if entry.blob is not None:
        header["blob"] = entry.blob.to_json()
    kind = _TYPES.index(entry.type)
    previous = entry.previous
    tail = b""
    if previous is not None:
        marked = entry.marker is not None and entry.marker.kind == "incoming"
        if (
            not marked
            or entry.type != "file"
            or previous.type != "file"
            or (previous.marker is not None or previous.previous is not None)
        ):
            raise ProtocolError("only an incoming file holds a previous one, an unmarked file")
        header["previous"] = {
            "size": previous.size,
            "mtime_ms": previous.mtime_ms,
            "blob": None if previous.blob is None else previous.blob.to_json(),
            "inline": len(previous.inline),
        }
        kind |= _PREVIOUS
        tail = previous.inline
    raw = json.dumps(header, separators=(",", ":")).encode()
    marker = b""
    if entry.marker is not None:
        kind |= _INCOMING if entry.marker.kind == "incoming" else _OUTGOING
        marker = bytes.fromhex(entry.marker.rename)
        if len(marker) != _MARKER_ID_BYTES:
            raise ProtocolError("a marker names a rename by its 24-digit operation id")
    stat = _STAT.pack(kind, entry.size, entry.mtime_ms)
    value = MAGIC + stat + marker + _HEADER.pack(len(raw)) + raw + entry.inline + tail
    if len(value) > api.RECORD_BYTES_MAX:
        raise ProtocolError(f"a file record of {len(value)} bytes is above the record limit")
    return value


def _int(value: Any, name: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ProtocolError(f"file record: {name} must be an integer in 0..{maximum}")
    return value


def decode_head(head: bytes) -> Head:
    """Type, size, modification time and marker from a record's first bytes (up to
    ``STAT_BYTES``; fewer for an unmarked record)."""
    if len(head) < _UNMARKED_BYTES or not head.startswith(MAGIC):
        raise ProtocolError("not a file record")
    kind, size, mtime_ms = _STAT.unpack_from(head, len(MAGIC))
    flags = kind & ~_TYPE_BITS
    has_previous = flags == _INCOMING | _PREVIOUS
    if has_previous:
        flags = _INCOMING
    if (kind & _TYPE_BITS) >= len(_TYPES) or flags not in (0, _INCOMING, _OUTGOING):
        raise ProtocolError("file record: type is 'file' or 'directory', one marker at most")
    marker = None
    if flags:
        if len(head) < STAT_BYTES:
            raise ProtocolError("file record: a marker without its rename")
        rename = head[_UNMARKED_BYTES:STAT_BYTES].hex()
        marker = Marker("incoming" if flags == _INCOMING else "outgoing", rename)
    return Head(
        _TYPES[kind & _TYPE_BITS],
        _int(size, "size", FILE_BYTES_MAX),
        _int(mtime_ms, "mtime_ms", MTIME_MS_MAX),
        marker,
        has_previous,
    )


def decode_entry(value: bytes) -> Entry:
    """The entry a record value holds; ``ProtocolError`` for anything else (a record
    under the namespace's keys written by someone else, or damaged)."""
    head = decode_head(value[:STAT_BYTES])
    kind, size, mtime_ms = head.type, head.size, head.mtime_ms
    at = STAT_BYTES if head.marker is not None else _UNMARKED_BYTES
    if len(value) < at + _HEADER.size:
        raise ProtocolError("not a file record")
    (length,) = _HEADER.unpack_from(value, at)
    start = at + _HEADER.size
    if length > HEADER_BYTES_MAX or start + length > len(value):
        raise ProtocolError("file record: bad header length")
    header = api.load_json(value[start : start + length])
    if not isinstance(header, dict):
        raise ProtocolError("file record: the header is a JSON object")
    inline = value[start + length :]
    previous = None
    if head.has_previous:
        if kind != "file" or not isinstance(header.get("previous"), dict):
            raise ProtocolError("file record: the previous entry is missing")
        prior = header["previous"]
        held = _int(prior.get("inline"), "previous inline bytes", len(inline))
        inline, prior_inline = inline[: len(inline) - held], inline[len(inline) - held :]
        prior_blob = BlobRef.from_json(prior["blob"]) if prior.get("blob") is not None else None
        previous = _checked(
            "file",
            _int(prior.get("size"), "previous size", FILE_BYTES_MAX),
            _int(prior.get("mtime_ms"), "previous mtime_ms", MTIME_MS_MAX),
            prior_inline,
            prior_blob,
        )
    blob = BlobRef.from_json(header["blob"]) if header.get("blob") is not None else None
    entry = _checked(kind, size, mtime_ms, inline, blob)
    return replace(entry, marker=head.marker, previous=previous)


def _checked(
    kind: Literal["file", "directory"],
    size: int,
    mtime_ms: int,
    inline: bytes,
    blob: BlobRef | None,
) -> Entry:
    if kind == "file" and (blob.size if blob is not None else len(inline)) != size:
        raise ProtocolError("file record: its size does not match its bytes")
    if blob is not None and inline:
        raise ProtocolError("file record: bytes inline and in chunks")
    if kind == "directory" and (blob is not None or inline or size):
        raise ProtocolError("file record: a directory holds no bytes")
    return Entry(kind, size, mtime_ms, inline, blob)
