"""Direct I/O of chunk files (``ring.files.DirectIO``), on real files.

What must hold: bytes written with ``O_DIRECT`` read back identical whatever their length
(padding to whole blocks never shows); a chunk stored on a file system that takes
``O_DIRECT`` is not left in the page cache; a full disk is ``StorageFull`` with no temp
file left, as for buffered writes; more transfers at once than pooled buffers still
work; a file system that refuses ``O_DIRECT`` gets buffered I/O.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from support import small_disk

from ring import codec
from ring.chunkstore import ChunkStore
from ring.errors import StorageFull
from ring.files import DIRECT_ALIGN_BYTES, DirectIO

SIZES = (0, 1, DIRECT_ALIGN_BYTES - 1, DIRECT_ALIGN_BYTES, DIRECT_ALIGN_BYTES + 1, 3 * 2**20 + 7)


def _folders(root: Path) -> tuple[Path, Path]:
    tmp, out = root / "tmp", root / "out"
    tmp.mkdir()
    out.mkdir()
    if not DirectIO.usable(tmp):
        pytest.skip(f"{root} does not take O_DIRECT")
    return tmp, out


def test_round_trip_of_any_length(tmp_path: Path) -> None:
    tmp, out = _folders(tmp_path)
    direct = DirectIO(buffers=1)
    for size in (*SIZES, *reversed(SIZES)):  # buffers grow, then serve smaller files
        data = os.urandom(size)
        final = out / f"f{size}"
        direct.write_atomic(tmp, final, data)
        assert final.stat().st_size == size
        assert final.read_bytes() == data
        assert direct.read(final) == data
    assert list(tmp.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        direct.read(out / "absent")


def _resident_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache, by util-linux ``fincore``."""
    answer = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(answer.stdout.strip())


async def test_a_stored_chunk_bypasses_the_page_cache(tmp_path: Path) -> None:
    """Breaks: nothing; measures. Must hold: on a file system that takes O_DIRECT the
    peer's chunk file is written and read without entering the page cache, and a buffered
    write of the same bytes would have left it there (so the check can fail)."""
    if shutil.which("fincore") is None:
        pytest.skip("util-linux fincore is not installed")
    _folders(tmp_path)
    store = ChunkStore(tmp_path / "peer")
    store.open()
    assert store.stats().direct_io
    chunk_id, stored = codec.encode(os.urandom(2 * 2**20))
    assert await store.put(chunk_id, stored)
    path = tmp_path / "peer" / "chunks" / chunk_id[:2] / chunk_id
    assert await store.get(chunk_id) == stored
    assert _resident_bytes(path) == 0
    buffered = tmp_path / "buffered"
    buffered.write_bytes(stored)
    assert _resident_bytes(buffered) > 0


def test_more_transfers_than_buffers(tmp_path: Path) -> None:
    """Breaks: six threads write and read at once through a pool of one buffer (as when
    cancelled callers' threads still run). Must hold: every file is whole and its own."""
    tmp, out = _folders(tmp_path)
    direct = DirectIO(buffers=1)
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for round_ in range(10):
                data = bytes([index]) * (100_000 + index * 4096 + round_)
                final = out / f"t{index}-{round_}"
                direct.write_atomic(tmp, final, data)
                assert direct.read(final) == data
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_a_full_disk_is_storage_full_and_leaves_no_temp_file(tmp_path: Path) -> None:
    """Breaks: a 1 MiB tmpfs fills while direct writes go on. Must hold: StorageFull, the
    temp file removed, every file written before intact."""
    with small_disk(tmp_path / "disk", 1024 * 1024) as disk:
        tmp, out = _folders(disk)
        direct = DirectIO(buffers=1)
        written: dict[Path, bytes] = {}
        with pytest.raises(StorageFull, match="disk full"):
            for index in range(64):
                data = os.urandom(100_000)
                direct.write_atomic(tmp, out / f"f{index}", data)
                written[out / f"f{index}"] = data
        assert written
        assert list(tmp.iterdir()) == []
        for path, data in written.items():
            assert direct.read(path) == data


async def test_a_file_system_without_o_direct_gets_buffered_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: the file system refuses O_DIRECT (EINVAL at open, as some do). Must hold:
    the store says so and keeps working through the page cache."""
    real_open = os.open

    def refusing_open(path: object, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr("ring.files.os.open", refusing_open)
    store = ChunkStore(tmp_path)
    store.open()
    assert not store.stats().direct_io
    chunk_id, stored = codec.encode(os.urandom(70_000))
    assert await store.put(chunk_id, stored)
    assert await store.get(chunk_id) == stored


async def test_direct_io_can_be_turned_off(tmp_path: Path) -> None:
    """``--no-direct-io``: the store goes through the page cache even where the file
    system takes O_DIRECT."""
    _folders(tmp_path)
    store = ChunkStore(tmp_path / "peer", direct_io=False)
    store.open()
    assert not store.stats().direct_io
    chunk_id, stored = codec.encode(os.urandom(70_000))
    assert await store.put(chunk_id, stored)
    assert await store.get(chunk_id) == stored
