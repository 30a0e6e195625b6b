"""Unit tests for ring.chunkstore on real files (no peer process).

What must hold: a stored chunk reads back verified and survives a restart (re-indexed
from disk); a chunk is checked in full (content against address) before it is written,
and a copy from an earlier run before it is served or answers a duplicate write; a full
disk or an exhausted quota is a clear ``StorageFull`` and leaves nothing indexed or
half-written; leftovers of interrupted writes are removed on open; a file altered on
disk is detected on read, moved to ``quarantine``, counted and never returned.
"""

from __future__ import annotations

import errno
import random
from pathlib import Path

import pytest

import ring.files
from ring import codec
from ring.chunkstore import ChunkStore, write_file_atomic
from ring.errors import ChunkCorrupt, ChunkError, StorageFull
from ring.paxos import FAST, Value
from ring.records import RecordStore
from sr3.statedata import state_bytes

# State-like bytes, generated once (the generator builds an 8 MiB pool per seed).
STATE = state_bytes(256 * 1024, seed=30)


def _chunk(seed: int, size: int = 64 * 1024) -> tuple[str, bytes]:
    """A distinct compressible chunk per seed."""
    assert size <= len(STATE)
    start = (seed * 4099) % (len(STATE) - size + 1)
    return codec.encode(seed.to_bytes(8, "little") + STATE[start : start + size - 8])


def _open(root: Path, **options: object) -> ChunkStore:
    store = ChunkStore(root, **options)  # type: ignore[arg-type]
    store.open()
    return store


def _files(directory: Path) -> list[Path]:
    return sorted(path for path in directory.rglob("*") if path.is_file())


async def test_put_get_round_trip_and_stats(tmp_path: Path) -> None:
    store = _open(tmp_path)
    chunk_id, stored = _chunk(1)
    assert await store.put(chunk_id, stored) is True
    assert await store.put(chunk_id, stored) is False  # content addressed: already there
    assert store.has(chunk_id)
    assert store.stored_size(chunk_id) == len(stored)
    assert await store.get(chunk_id) == stored
    assert (tmp_path / "chunks" / chunk_id[:2] / chunk_id).read_bytes() == stored
    stats = store.stats()
    assert (stats.chunk_count, stats.stored_bytes, stats.quarantined) == (1, len(stored), 0)
    assert await store.get(codec.chunk_id(b"absent")) is None
    assert _files(tmp_path / "tmp") == []


async def test_chunk_is_verified_before_it_is_written(tmp_path: Path) -> None:
    """Breaks: a PUT whose body does not match its id, or is not a stored chunk at all.
    Must hold: ChunkCorrupt, and nothing is indexed or left on disk."""
    store = _open(tmp_path)
    chunk_id, stored = _chunk(2)
    other_id, _other = _chunk(3)
    with pytest.raises(ChunkCorrupt):
        await store.put(other_id, stored)
    with pytest.raises(ChunkCorrupt):
        await store.put(chunk_id, b"not a chunk")
    with pytest.raises(ChunkCorrupt):
        await store.put(chunk_id, stored[:-1] + bytes([stored[-1] ^ 1]))
    assert store.stats().chunk_count == 0
    assert _files(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
async def test_disk_full_is_storage_full_and_nothing_is_indexed(tmp_path: Path, code: int) -> None:
    """Breaks: the disk fills up during the write. Must hold: StorageFull (a clear error
    the peer answers 507 with), nothing indexed, no file left; the store works again once
    there is room."""
    failing = True

    def write_file(tmp_dir: Path, final: Path, data: bytes) -> None:
        if failing:
            # A real partial write first, as a filling disk would leave it.
            (tmp_dir / f"{final.name}.partial").write_bytes(data[: len(data) // 2])
            (tmp_dir / f"{final.name}.partial").unlink()
            raise OSError(code, "No space left on device")
        write_file_atomic(tmp_dir, final, data)

    store = _open(tmp_path, write_file=write_file)
    chunk_id, stored = _chunk(4)
    with pytest.raises(StorageFull, match="disk full"):
        await store.put(chunk_id, stored)
    assert not store.has(chunk_id)
    assert store.stats().chunk_count == 0
    assert store.stats().stored_bytes == 0
    assert await store.get(chunk_id) is None
    assert _files(tmp_path) == []
    failing = False
    assert await store.put(chunk_id, stored) is True
    assert await store.get(chunk_id) == stored


async def test_other_os_errors_are_not_reported_as_storage_full(tmp_path: Path) -> None:
    def write_file(tmp_dir: Path, final: Path, data: bytes) -> None:
        raise OSError(errno.EIO, "I/O error")

    store = _open(tmp_path, write_file=write_file)
    chunk_id, stored = _chunk(5)
    with pytest.raises(OSError, match="I/O error") as caught:
        await store.put(chunk_id, stored)
    assert not isinstance(caught.value, StorageFull)
    assert not store.has(chunk_id)


async def test_capacity_quota_is_storage_full(tmp_path: Path) -> None:
    """Breaks: a peer configured with ``capacity_bytes`` fills its quota. Must hold:
    StorageFull for the chunk that does not fit, nothing of it written or indexed; chunks
    already stored stay readable."""
    first_id, first = _chunk(6)
    second_id, second = _chunk(7)
    store = _open(tmp_path, capacity_bytes=len(first) + len(second) - 1)
    assert await store.put(first_id, first)
    with pytest.raises(StorageFull, match="capacity"):
        await store.put(second_id, second)
    assert not store.has(second_id)
    assert store.stats().stored_bytes == len(first)
    assert store.stats().capacity_bytes == len(first) + len(second) - 1
    assert not (tmp_path / "chunks" / second_id[:2] / second_id).exists()
    assert await store.get(first_id) == first


async def test_open_removes_leftover_tmp_files(tmp_path: Path) -> None:
    """Breaks: a crash between writing a temp file and renaming it. Must hold: the next
    open deletes the leftovers and indexes only complete chunks."""
    store = _open(tmp_path)
    chunk_id, stored = _chunk(8)
    await store.put(chunk_id, stored)
    leftover = tmp_path / "tmp" / f"{chunk_id}.abc123"
    leftover.write_bytes(stored[:100])
    (tmp_path / "tmp" / "other.partial").write_bytes(b"x")
    reopened = _open(tmp_path)
    assert list((tmp_path / "tmp").iterdir()) == []
    assert reopened.ids() == [chunk_id]


async def test_open_makes_every_shard_folder_durably_and_writes_make_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: a chunk written into a shard folder that the write itself created, whose
    entry in ``chunks`` nothing fsynced (a crash could lose the folder with the chunk
    that was acknowledged as durable); and every fresh peer paying a folder creation on
    its first 256 writes. Must hold: open makes the 256 shard folders and fsyncs the
    folders that gained them; a write whose shard an operator removed makes it again
    and fsyncs ``chunks`` before the chunk counts as stored."""
    synced: list[Path] = []
    real_fsync_dir = ring.files.fsync_dir

    def recording_fsync_dir(path: Path) -> None:
        synced.append(path)
        real_fsync_dir(path)

    monkeypatch.setattr(ring.files, "fsync_dir", recording_fsync_dir)
    store = _open(tmp_path)
    shards = sorted(path.name for path in (tmp_path / "chunks").iterdir())
    assert shards == [f"{shard:02x}" for shard in range(256)]
    assert tmp_path / "chunks" in synced and tmp_path in synced
    synced.clear()
    made: list[Path] = []
    real_mkdir = Path.mkdir

    def recording_mkdir(path: Path, *args: object, **kwargs: object) -> None:
        made.append(path)
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", recording_mkdir)
    chunk_id, stored = _chunk(9)
    assert await store.put(chunk_id, stored) is True
    assert made == []
    assert synced == [tmp_path / "chunks" / chunk_id[:2]]
    other_id, other = _chunk(10)
    assert other_id[:2] != chunk_id[:2]
    (tmp_path / "chunks" / other_id[:2]).rmdir()
    synced.clear()
    assert await store.put(other_id, other) is True
    assert made == [tmp_path / "chunks" / other_id[:2]]
    assert synced == [tmp_path / "chunks", tmp_path / "chunks" / other_id[:2]]
    assert await _open(tmp_path).get(other_id) == other


async def test_restart_re_indexes_everything(tmp_path: Path) -> None:
    store = _open(tmp_path)
    chunks = dict(_chunk(seed, 4096 * seed) for seed in range(10, 40))
    for chunk_id, stored in chunks.items():
        await store.put(chunk_id, stored)
    reopened = _open(tmp_path)
    assert sorted(reopened.ids()) == sorted(chunks)
    assert reopened.stats() == store.stats()
    for chunk_id, stored in chunks.items():
        assert await reopened.get(chunk_id) == stored
        assert await reopened.verify(chunk_id)


async def test_every_stored_byte_flip_is_quarantined(tmp_path: Path) -> None:
    """Breaks: one byte of a chunk file on disk, at every header offset and at sampled
    payload offsets. Must hold: ``get`` raises ChunkCorrupt (never returns the bytes),
    the file moves to ``quarantine``, the count and ``on_corrupt`` report it."""
    rng = random.Random(31)
    chunk_id, stored = _chunk(31)
    assert codec.parse_header(stored).codec == codec.CODEC_ZSTD
    positions = list(range(codec.HEADER_BYTES)) + rng.sample(
        range(codec.HEADER_BYTES, len(stored)), 16
    )
    missed = []
    for position in positions:
        root = tmp_path / f"flip-{position}"
        store = _open(root)
        reported: list[str] = []
        store.on_corrupt = lambda corrupt_id, _reason, seen=reported: seen.append(corrupt_id)
        await store.put(chunk_id, stored)
        path = root / "chunks" / chunk_id[:2] / chunk_id
        damaged = bytearray(stored)
        damaged[position] ^= 0x01
        path.write_bytes(bytes(damaged))
        try:
            served = await store.get(chunk_id)
        except ChunkCorrupt:
            served = None
        except ChunkError:  # any other error: the file was neither served nor quarantined
            missed.append(position)
            continue
        if served is not None or reported != [chunk_id]:
            missed.append(position)
            continue
        assert not path.exists()
        assert len(list((root / "quarantine").iterdir())) == 1
        assert store.stats().quarantined == 1
        assert not store.has(chunk_id)
        assert await store.get(chunk_id) is None
    assert missed == [], f"flips at these offsets were served or not quarantined: {missed}"


async def test_truncated_and_deleted_files(tmp_path: Path) -> None:
    store = _open(tmp_path)
    truncated_id, truncated = _chunk(40)
    deleted_id, deleted = _chunk(41)
    await store.put(truncated_id, truncated)
    await store.put(deleted_id, deleted)
    (tmp_path / "chunks" / truncated_id[:2] / truncated_id).write_bytes(b"")
    (tmp_path / "chunks" / deleted_id[:2] / deleted_id).unlink()
    with pytest.raises(ChunkCorrupt):
        await store.get(truncated_id)
    assert await store.get(deleted_id) is None
    assert store.stats().chunk_count == 0
    assert store.stats().stored_bytes == 0


async def test_full_verify_quarantines_content_that_only_decompression_catches(
    tmp_path: Path,
) -> None:
    """A payload whose checksum was recomputed after tampering passes the cheap read
    check; ``verify`` (decompress and re-hash) must still catch and quarantine it."""
    store = _open(tmp_path)
    chunk_id, stored = codec.encode(random.Random(42).randbytes(4096))
    await store.put(chunk_id, stored)
    _forged_id, forged = codec.encode(random.Random(43).randbytes(4096))
    header = bytearray(forged[: codec.HEADER_BYTES])
    header[32:48] = bytes.fromhex(chunk_id)  # claims to be chunk_id
    (tmp_path / "chunks" / chunk_id[:2] / chunk_id).write_bytes(
        bytes(header) + forged[codec.HEADER_BYTES :]
    )
    with pytest.raises(ChunkCorrupt):
        await store.verify(chunk_id)
    assert store.stats().quarantined == 1
    assert not store.has(chunk_id)


def _forged(raw: bytes, claimed: str) -> bytes:
    """The stored form of ``raw`` under the id ``claimed``: header and checksum valid,
    content not matching the address (what a writer with the secret could send)."""
    _other_id, other = codec.encode(raw)
    header = bytearray(other[: codec.HEADER_BYTES])
    header[32:48] = bytes.fromhex(claimed)
    return bytes(header) + other[codec.HEADER_BYTES :]


def _poison(store_root: Path, chunk_id: str, stored: bytes) -> None:
    """Put ``stored`` in place of ``chunk_id``'s file, as a run that checked less might
    have left it."""
    path = store_root / "chunks" / chunk_id[:2] / chunk_id
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(stored)


async def test_a_write_checks_the_content_against_its_address_raw_or_compressed(
    tmp_path: Path,
) -> None:
    """Breaks: a raw and a compressed body whose header, checksum and claimed id are
    valid but whose content is another chunk's. Must hold: both are refused
    (``ChunkCorrupt``, content vs address) and nothing is stored under the id."""
    store = _open(tmp_path)
    raw_id, _stored = codec.encode(random.Random(44).randbytes(4096))
    with pytest.raises(ChunkCorrupt, match="address"):
        await store.put(raw_id, _forged(random.Random(45).randbytes(4096), raw_id))
    assert not store.has(raw_id)
    packed_id, good = codec.encode(state_bytes(65536, seed=1))
    assert codec.parse_header(good).codec == codec.CODEC_ZSTD
    with pytest.raises(ChunkCorrupt, match="address"):
        await store.put(packed_id, _forged(state_bytes(65536, seed=2), packed_id))
    assert not store.has(packed_id) and _files(tmp_path / "chunks") == []
    assert await store.put(packed_id, good)
    assert await store.get(packed_id) == good


async def test_a_poisoned_copy_is_never_served_and_a_good_write_replaces_it(
    tmp_path: Path,
) -> None:
    """Breaks: a compressed chunk's file holds another chunk's content under its id (left
    by a run that checked less). Must hold: after a restart a read checks it in full,
    quarantines it (the file kept as evidence) and raises; and a duplicate write of
    the good bytes, without a read before it, replaces the bad copy (created) instead
    of answering "already here"."""
    packed_id, good = codec.encode(state_bytes(65536, seed=1))
    bad = _forged(state_bytes(65536, seed=2), packed_id)
    _poison(tmp_path, packed_id, bad)
    corrupt: list[str] = []
    store = _open(tmp_path)
    store.on_corrupt = lambda chunk_id, _reason: corrupt.append(chunk_id)
    assert store.has(packed_id)
    with pytest.raises(ChunkCorrupt, match="address"):
        await store.get(packed_id)
    assert corrupt == [packed_id] and not store.has(packed_id)
    assert [path.read_bytes() for path in _files(tmp_path / "quarantine")] == [bad]
    assert await store.put(packed_id, good)
    assert await store.get(packed_id) == good

    _poison(tmp_path, packed_id, bad)
    again = _open(tmp_path)
    assert again.has(packed_id)
    assert await again.put(packed_id, good), "a bad copy must not answer a duplicate write"
    assert await again.get(packed_id) == good
    assert await again.put(packed_id, good) is False
    assert len(_files(tmp_path / "quarantine")) == 2


async def test_a_verified_copy_answers_duplicates_without_a_read_and_reads_check_rot(
    tmp_path: Path,
) -> None:
    """A copy written (checked in full) here is verified: a duplicate write is answered
    from the index, even with a bad body it never needs; a read still checks the
    checksum, so a flipped bit after the write is caught and quarantined."""
    store = _open(tmp_path)
    chunk_id, good = codec.encode(state_bytes(65536, seed=3))
    assert await store.put(chunk_id, good)
    assert await store.put(chunk_id, _forged(state_bytes(65536, seed=4), chunk_id)) is False
    assert await store.get(chunk_id) == good
    path = tmp_path / "chunks" / chunk_id[:2] / chunk_id
    rotten = bytearray(path.read_bytes())
    rotten[-1] ^= 0x01
    path.write_bytes(bytes(rotten))
    with pytest.raises(ChunkCorrupt, match="checksum"):
        await store.get(chunk_id)
    assert not store.has(chunk_id)


async def test_quarantined_count_survives_restart_and_counts_chunks_only(tmp_path: Path) -> None:
    """Breaks: one chunk file and one record file on disk, then the peer restarts. Must
    hold: ``quarantined`` (a chunk figure) is 1 before and after the restart; the record
    quarantined into the shared folder does not count as a chunk."""
    store = _open(tmp_path)
    records = RecordStore(tmp_path)
    records.open()
    await records.accept("manifest/a", FAST, Value(1, b"value", op="01"))
    chunk_id, stored = _chunk(50)
    await store.put(chunk_id, stored)
    (tmp_path / "chunks" / chunk_id[:2] / chunk_id).write_bytes(b"garbage")
    with pytest.raises(ChunkCorrupt):
        await store.get(chunk_id)
    assert store.stats().quarantined == 1
    for record_file in (tmp_path / "records").iterdir():
        record_file.write_bytes(b"garbage")
    RecordStore(tmp_path).open()  # quarantines the record file
    assert _open(tmp_path).stats().quarantined == 1


async def test_a_copy_whose_file_cannot_be_read_is_quarantined_like_a_corrupt_one(
    tmp_path: Path,
) -> None:
    """Breaks: a chunk's file that cannot be read: a directory in its place, and a read
    that fails with EIO as a direct read does when the file shrinks under it (rewritten
    in place) or the disk fails (injected: the file reader is the one seam). Must hold:
    a read and the scrubber's verify raise ``ChunkCorrupt`` (was: ``OSError``, a 500
    and a traceback at a GET), the copy is quarantined and reported (``on_corrupt``)
    and no longer indexed; a good write stores it again. An error of the process (out
    of file handles) says nothing of the copy: it propagates and the copy stays."""
    store = _open(tmp_path)
    corrupt: list[str] = []
    store.on_corrupt = lambda chunk_id, _reason: corrupt.append(chunk_id)
    folder_id, folder_stored = _chunk(60)
    await store.put(folder_id, folder_stored)
    path = tmp_path / "chunks" / folder_id[:2] / folder_id
    path.unlink()
    path.mkdir()
    with pytest.raises(ChunkCorrupt, match="cannot be read"):
        await store.get(folder_id)
    assert corrupt == [folder_id] and not store.has(folder_id)
    assert [p.name.split(".")[0] for p in (tmp_path / "quarantine").iterdir()] == [folder_id]
    assert await store.put(folder_id, folder_stored)
    assert await store.get(folder_id) == folder_stored

    real_read = store._read_file
    failing: dict[str, int] = {}

    def read_file(file: Path) -> bytes:
        code = failing.get(file.name)
        if code is None:
            return real_read(file)
        raise OSError(code, f"file ended at 0 of {file.stat().st_size} bytes while read")

    store._read_file = read_file
    for action, seed in ((store.get, 61), (store.verify, 62)):
        chunk_id, stored = _chunk(seed)
        await store.put(chunk_id, stored)
        failing[chunk_id] = errno.EIO
        with pytest.raises(ChunkCorrupt, match="cannot be read"):
            await action(chunk_id)
        assert corrupt[-1] == chunk_id and not store.has(chunk_id), action
    kept_id, kept = _chunk(63)
    await store.put(kept_id, kept)
    failing[kept_id] = errno.EMFILE
    with pytest.raises(OSError, match="ended"):
        await store.get(kept_id)
    assert store.has(kept_id) and corrupt[-1] != kept_id
    del failing[kept_id]
    assert await store.get(kept_id) == kept
    assert store.stats().quarantined == 3
