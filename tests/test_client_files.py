"""The client's file writes: large pieces read into reused buffers, and failures that
give one clear error and leave nothing behind."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, cast

import pytest
from support import MakeCluster

from ring import codec
from ring.blobs import BlobRef
from ring.client import Client
from ring.client.chunks import BUFFERED_READ_BYTES_MIN, ChunkIO
from ring.client.options import ClientOptions, Source, file_source
from ring.errors import SR3Error
from sr3.statedata import state_bytes


async def test_get_file_under_a_file_raises_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    """The open fails (ENOTDIR) before any chunk is read; the cleanup must not raise a
    second error chained to it."""
    (tmp_path / "file").write_bytes(b"")
    chunks = ChunkIO(cast(Any, None), cast(Any, None), ClientOptions())
    with pytest.raises(NotADirectoryError) as caught:
        await chunks.get_file(BlobRef(0, "0" * 32, ()), tmp_path / "file" / "out")
    assert caught.value.__context__ is None
    assert sorted(os.listdir(tmp_path)) == ["file"]


async def test_large_pieces_read_into_reused_buffers_keep_each_chunk_s_own_bytes(
    tmp_path: Path, make_cluster: MakeCluster
) -> None:
    """Pieces of at least ``BUFFERED_READ_BYTES_MIN`` are read into buffers reused from
    chunk to chunk; two transfers at a time here, so each buffer carries several chunks.
    The source refuses plain reads of such pieces, so the reused buffers must be used.
    Chunks alternate between state-like bytes (compressed) and random ones (stored raw,
    so sent as header and payload in slices).
    Must hold: every chunk is addressed by its own bytes (a buffer handed back before its
    chunk was encoded and sent would give it another's) and the blob reads back whole."""
    cluster = make_cluster(3, replication=3, write_quorum=2)
    size = BUFFERED_READ_BYTES_MIN
    rng = random.Random(5)
    data = b"".join(
        state_bytes(size, seed=index) if index % 2 else rng.randbytes(size) for index in range(7)
    ) + rng.randbytes(1000)
    path = tmp_path / "in.bin"
    path.write_bytes(data)
    real = file_source(path)

    def read(offset: int, length: int) -> bytes:
        assert length < BUFFERED_READ_BYTES_MIN, "a large piece was read into fresh memory"
        return real.read(offset, length)

    options = ClientOptions(chunk_bytes=size, transfers_max=2)
    async with Client(cluster.ring, cluster.secret, options=options) as client:
        ref = await client.put_sources([Source(real.size, read, real.read_into)])
        (ref,) = ref
        expected = [codec.chunk_id(data[i : i + size]) for i in range(0, len(data), size)]
        assert [extent.chunk_id for extent in ref.extents] == expected
        await client.chunks.get_file(ref, tmp_path / "out.bin")
    assert (tmp_path / "out.bin").read_bytes() == data


async def test_a_file_cut_short_while_stored_raises_one_clear_error(tmp_path: Path) -> None:
    """A file truncated after it was sized is read into a reused buffer.
    Must hold: the read fails with the error naming the file, not a short chunk."""
    path = tmp_path / "shrinking.bin"
    path.write_bytes(bytes(3 * BUFFERED_READ_BYTES_MIN))
    source = file_source(path)
    path.write_bytes(b"")
    chunks = ChunkIO(cast(Any, None), cast(Any, None), ClientOptions(chunk_bytes=1 << 20))
    with pytest.raises(SR3Error, match="changed while it was being stored"):
        await chunks.put_sources([source])
