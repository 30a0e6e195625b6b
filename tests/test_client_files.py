"""The client's file writes fail with one clear error and leave nothing behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest

from ring.blobs import BlobRef
from ring.client.chunks import ChunkIO
from ring.client.options import ClientOptions


async def test_get_file_under_a_file_raises_one_error_and_leaves_nothing(tmp_path: Path) -> None:
    """The open fails (ENOTDIR) before any chunk is read; the cleanup must not raise a
    second error chained to it."""
    (tmp_path / "file").write_bytes(b"")
    chunks = ChunkIO(cast(Any, None), cast(Any, None), ClientOptions())
    with pytest.raises(NotADirectoryError) as caught:
        await chunks.get_file(BlobRef(0, "0" * 32, ()), tmp_path / "file" / "out")
    assert caught.value.__context__ is None
    assert sorted(os.listdir(tmp_path)) == ["file"]
