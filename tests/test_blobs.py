"""Unit tests for ring.blobs: how sources are laid out into chunks, and blob references.

What must hold: every source byte lands in exactly one piece, pieces of one source come in
offset order (the client hashes them in that order), small sources are never split across
chunks, no chunk is empty or above ``chunk_bytes``; a ``BlobRef`` survives a JSON round
trip and a malformed one is refused with ``ProtocolError``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import codec
from ring.blobs import BlobRef, Extent, plan_chunks
from ring.errors import ProtocolError

REPLAYABLE = settings(max_examples=200, derandomize=True, database=None, deadline=None)

sizes_strategy = st.lists(
    st.one_of(st.integers(0, 40), st.integers(0, 3000)), min_size=0, max_size=40
)


@REPLAYABLE
@given(
    sizes=sizes_strategy,
    chunk_bytes=st.integers(1, 600),
    pack_below_bytes=st.integers(0, 800),
)
def test_plan_covers_every_byte_once_in_order_within_bounds(
    sizes: list[int], chunk_bytes: int, pack_below_bytes: int
) -> None:
    plans = plan_chunks(sizes, chunk_bytes=chunk_bytes, pack_below_bytes=pack_below_bytes)
    pieces_of: dict[int, list[tuple[int, int]]] = defaultdict(list)
    chunks_of: dict[int, set[int]] = defaultdict(set)
    for index, plan in enumerate(plans):
        assert plan.pieces, "a chunk with no pieces"
        assert 0 < plan.raw_bytes <= chunk_bytes
        for piece in plan.pieces:
            assert piece.length > 0
            pieces_of[piece.source].append((piece.offset, piece.length))
            chunks_of[piece.source].add(index)
    small_below = min(pack_below_bytes, chunk_bytes)
    for source, size in enumerate(sizes):
        pieces = pieces_of.get(source, [])
        # Contiguous from 0 to size, in the order they appear: each byte exactly once.
        position = 0
        for offset, length in pieces:
            assert offset == position
            position += length
        assert position == size
        if 0 < size < small_below:
            assert len(chunks_of[source]) == 1, "a small source straddles chunks"
            assert pieces == [(0, size)]
    assert set(pieces_of) == {source for source, size in enumerate(sizes) if size > 0}


def test_large_sources_are_cut_at_chunk_bytes_and_small_ones_packed() -> None:
    plans = plan_chunks([10, 25, 3, 4], chunk_bytes=10, pack_below_bytes=5)
    layout = [[(p.source, p.offset, p.length) for p in plan.pieces] for plan in plans]
    assert layout == [
        [(0, 0, 10)],
        [(1, 0, 10)],
        [(1, 10, 10)],
        [(1, 20, 5)],
        [(2, 0, 3), (3, 0, 4)],
    ]


@pytest.mark.parametrize("chunk_bytes", [0, -1, codec.CHUNK_BYTES_MAX + 1])
def test_plan_refuses_chunk_size_outside_bounds(chunk_bytes: int) -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        plan_chunks([1], chunk_bytes=chunk_bytes)


def test_plan_refuses_negative_sizes() -> None:
    with pytest.raises(ValueError, match="negative"):
        plan_chunks([1, -1])


# -- BlobRef ------------------------------------------------------------------------------

ID_A = codec.chunk_id(b"a")
ID_B = codec.chunk_id(b"b")

extents_strategy = st.lists(
    st.builds(
        Extent,
        chunk_id=st.sampled_from([ID_A, ID_B]),
        offset=st.integers(0, 2**40),
        length=st.integers(0, 2**30),
    ),
    max_size=20,
)


@REPLAYABLE
@given(extents=extents_strategy, digest=st.text("0123456789abcdef", min_size=32, max_size=32))
def test_blob_ref_json_round_trip(extents: list[Extent], digest: str) -> None:
    ref = BlobRef(sum(e.length for e in extents), digest, tuple(extents))
    wire = json.loads(json.dumps(ref.to_json()))
    assert BlobRef.from_json(wire) == ref


GOOD: dict[str, Any] = {"size": 5, "digest": "d" * 32, "extents": [[ID_A, 0, 2], [ID_B, 7, 3]]}

MALFORMED: dict[str, Any] = {
    "not an object": ["size", 5],
    "null": None,
    "missing size": {"digest": "d" * 32, "extents": []},
    "missing extents": {"size": 0, "digest": "d" * 32},
    "size not a number": {**GOOD, "size": "five"},
    "extents do not add up": {**GOOD, "size": 6},
    "extent with two fields": {**GOOD, "extents": [[ID_A, 0], [ID_B, 7, 3]]},
    "extents not a list": {**GOOD, "extents": 5},
    "bad chunk id": {**GOOD, "extents": [["../../etc/passwd", 0, 2], [ID_B, 7, 3]]},
    "upper-case chunk id": {**GOOD, "extents": [[ID_A.upper(), 0, 2], [ID_B, 7, 3]]},
    "negative offset": {**GOOD, "extents": [[ID_A, -1, 2], [ID_B, 7, 3]]},
    "negative length": {**GOOD, "size": 1, "extents": [[ID_A, 0, -2], [ID_B, 7, 3]]},
}


def test_good_blob_ref_parses() -> None:
    ref = BlobRef.from_json(GOOD)
    assert ref.extents == (Extent(ID_A, 0, 2), Extent(ID_B, 7, 3))


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_blob_ref_is_refused(kind: str) -> None:
    with pytest.raises(ProtocolError):
        BlobRef.from_json(MALFORMED[kind])
