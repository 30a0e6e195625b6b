"""Blobs: how files map onto chunks. Pure functions and value types, no I/O.

A blob (one file's bytes) is an ordered list of extents, each a slice of one chunk. Large
blobs are cut into chunks of ``chunk_bytes``; small blobs (below ``pack_below_bytes``) are
packed together into shared chunks so that many small files cost a few round trips, not
one each. A small blob never straddles two chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ring.codec import CHUNK_BYTES_MAX, is_chunk_id
from ring.errors import ProtocolError
from ring.parse import json_int

__all__ = [
    "CHUNK_BYTES_DEFAULT",
    "PACK_BELOW_BYTES_DEFAULT",
    "BlobRef",
    "ChunkPlan",
    "Extent",
    "Piece",
    "plan_chunks",
]

CHUNK_BYTES_DEFAULT = 4 * 1024 * 1024
PACK_BELOW_BYTES_DEFAULT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Extent:
    chunk_id: str
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Where a blob's bytes are: its size, xxh3-128 digest and extents in order."""

    size: int
    digest: str
    extents: tuple[Extent, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "digest": self.digest,
            "extents": [[e.chunk_id, e.offset, e.length] for e in self.extents],
        }

    @classmethod
    def from_json(cls, data: Any) -> BlobRef:
        try:
            extents = tuple(
                Extent(str(chunk_id), json_int(offset, "offset"), json_int(length, "length"))
                for chunk_id, offset, length in data["extents"]
            )
            ref = cls(json_int(data["size"], "size"), str(data["digest"]), extents)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed blob reference: {exc}") from exc
        if sum(e.length for e in extents) != ref.size or not all(
            is_chunk_id(e.chunk_id) and e.offset >= 0 and e.length >= 0 for e in extents
        ):
            raise ProtocolError("blob reference extents do not add up to its size")
        return ref


@dataclass(frozen=True, slots=True)
class Piece:
    """``length`` bytes of source ``source`` from ``offset``, placed in a chunk."""

    source: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """One chunk to build: the concatenation of its pieces, in order."""

    pieces: tuple[Piece, ...]

    @property
    def raw_bytes(self) -> int:
        return sum(piece.length for piece in self.pieces)


def _split(source: int, size: int, chunk_bytes: int) -> list[ChunkPlan]:
    return [
        ChunkPlan((Piece(source, offset, min(chunk_bytes, size - offset)),))
        for offset in range(0, size, chunk_bytes)
    ]


def plan_chunks(
    sizes: Sequence[int],
    *,
    chunk_bytes: int = CHUNK_BYTES_DEFAULT,
    pack_below_bytes: int = PACK_BELOW_BYTES_DEFAULT,
) -> list[ChunkPlan]:
    """Lay out sources of the given sizes into chunks.

    Sources of at least ``pack_below_bytes`` are split into chunks of ``chunk_bytes``;
    smaller ones are packed, in source order, into chunks of at most ``chunk_bytes``.
    Every source byte appears in exactly one piece; empty sources get no piece.
    """
    if not 0 < chunk_bytes <= CHUNK_BYTES_MAX:
        raise ValueError(f"chunk_bytes must be in 1..{CHUNK_BYTES_MAX}")
    pack_below_bytes = min(pack_below_bytes, chunk_bytes)
    plans: list[ChunkPlan] = []
    packing: list[Piece] = []
    packed_bytes = 0
    for source, size in enumerate(sizes):
        if size < 0:
            raise ValueError("a source size cannot be negative")
        if size == 0:
            continue
        if size >= pack_below_bytes:
            plans.extend(_split(source, size, chunk_bytes))
            continue
        if packed_bytes + size > chunk_bytes:
            plans.append(ChunkPlan(tuple(packing)))
            packing, packed_bytes = [], 0
        packing.append(Piece(source, 0, size))
        packed_bytes += size
    if packing:
        plans.append(ChunkPlan(tuple(packing)))
    return plans
