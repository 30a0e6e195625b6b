"""Unit tests for ring.records on real files (no peer process).

What must hold: compare-and-set stores ``expected + 1`` when the replica is not newer
than expected and refuses a stale version with ``RecordConflict`` naming the current one;
records survive a restart; a corrupt record file is quarantined, never returned; keys
that could escape the data folder or are otherwise malformed are refused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ring.errors import ProtocolError, RecordConflict
from ring.records import KEY_CHARS_MAX, RECORD_BYTES_MAX, RecordStore, validate_key

CHUNK_A = "ab" * 16


def _open(root: Path) -> RecordStore:
    store = RecordStore(root)
    store.open()
    return store


async def test_compare_and_set_rules(tmp_path: Path) -> None:
    store = _open(tmp_path)
    assert store.version("m") == 0
    assert (await store.put("m", b"one", expected_version=0)).version == 1
    with pytest.raises(RecordConflict) as stale:
        await store.put("m", b"stale", expected_version=0)
    assert (stale.value.expected, stale.value.current) == (0, 1)
    assert (await store.put("m", b"two", expected_version=1)).version == 2
    record = await store.get("m")
    assert record is not None
    assert (record.version, record.value) == (2, b"two")
    # A replica that missed writes catches up: expected newer than its own is accepted.
    assert (await store.put("m", b"six", expected_version=5)).version == 6
    with pytest.raises(RecordConflict):
        await store.put("m", b"late", expected_version=5)
    assert store.version("m") == 6
    assert await store.get("absent") is None


async def test_concurrent_writers_of_one_version_one_wins(tmp_path: Path) -> None:
    store = _open(tmp_path)
    results = await asyncio.gather(
        *(store.put("race", f"w{i}".encode(), expected_version=0) for i in range(8)),
        return_exceptions=True,
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, RecordConflict) for r in results if r not in winners)
    record = await store.get("race")
    assert record is not None and record.value == winners[0].value


async def test_delete_is_compare_and_set_and_leaves_a_tombstone(tmp_path: Path) -> None:
    store = _open(tmp_path)
    await store.put("d", b"x", expected_version=0, refs=(CHUNK_A,))
    assert store.referenced() == {CHUNK_A}
    with pytest.raises(RecordConflict):
        await store.delete("d", expected_version=0)
    tombstone = await store.delete("d", expected_version=1)
    assert tombstone.version == 2 and tombstone.deleted
    stored = await store.get("d")
    assert stored is not None and stored.deleted and stored.value == b"" and not stored.refs
    assert store.list("", 10) == [] and store.count() == 0 and store.keys() == ["d"]
    assert store.referenced() == set(), "a deleted record still pins its chunks"
    with pytest.raises(RecordConflict):
        await store.delete("d", expected_version=1)
    # A replica that never held the key stores the tombstone too.
    assert (await store.delete("never", expected_version=0)).version == 1
    # Written again over the tombstone: live, with the next version.
    assert (await store.put("d", b"again", expected_version=2)).version == 3
    assert store.list("", 10) == [("d", 3)]


async def test_tombstone_beats_an_older_repair_copy_and_survives_restart(tmp_path: Path) -> None:
    """Breaks: the replica restarts after the delete, then repair offers the old value.
    Holds: the tombstone is still there and the older copy is refused (no resurrection)."""
    store = _open(tmp_path)
    await store.put("m", b"old", expected_version=0)
    await store.delete("m", expected_version=1)
    reopened = _open(tmp_path)
    assert reopened.is_deleted("m") and reopened.version("m") == 2
    assert not await reopened.put_repair("m", b"old", 1)
    assert not await reopened.put_repair("m", b"old", 2)
    assert reopened.list("", 10) == []
    # A newer repair tombstone is taken; a tombstone with a value is malformed.
    assert await reopened.put_repair("m", b"", 3, deleted=True)
    with pytest.raises(ProtocolError):
        await reopened.put_repair("m", b"x", 4, deleted=True)


async def test_tombstones_are_purged_after_their_ttl(tmp_path: Path) -> None:
    now = [1_000.0]
    store = RecordStore(tmp_path, tombstone_ttl_s=60.0, wall_clock=lambda: now[0])
    store.open()
    await store.put("a", b"x", expected_version=0)
    await store.delete("a", expected_version=1)
    await store.put("b", b"y", expected_version=0)
    now[0] += 59.0
    assert await store.purge_tombstones() == 0 and store.version("a") == 2
    now[0] += 1.0
    assert await store.purge_tombstones() == 1
    assert store.version("a") == 0 and store.keys() == ["b"]
    assert len(list((tmp_path / "records").glob("*.rec"))) == 1


async def test_value_above_limit_is_refused(tmp_path: Path) -> None:
    store = _open(tmp_path)
    with pytest.raises(ProtocolError):
        await store.put("big", bytes(RECORD_BYTES_MAX + 1), expected_version=0)
    assert store.count() == 0
    assert (await store.put("big", bytes(RECORD_BYTES_MAX), expected_version=0)).version == 1


async def test_records_survive_restart(tmp_path: Path) -> None:
    store = _open(tmp_path)
    for index in range(5):
        await store.put(f"manifest/q/{index}", f"v{index}".encode(), expected_version=0)
    await store.put("manifest/q/0", b"v0b", expected_version=1)
    reopened = _open(tmp_path)
    assert reopened.count() == 5
    assert reopened.list("manifest/q/", 3) == [
        ("manifest/q/0", 2),
        ("manifest/q/1", 1),
        ("manifest/q/2", 1),
    ]
    record = await reopened.get("manifest/q/0")
    assert record is not None and (record.version, record.value) == (2, b"v0b")
    with pytest.raises(RecordConflict):
        await reopened.put("manifest/q/0", b"stale", expected_version=1)


@pytest.mark.parametrize(
    "damage",
    [b"", b"SR3", b"XXXX\x00\x00\x00\x00{}", b"SR3R\xff\xff\x00\x00{", "flip value"],
    ids=["empty", "short", "bad magic", "bad metadata", "value flipped"],
)
async def test_corrupt_record_file_is_quarantined_on_open(
    tmp_path: Path, damage: bytes | str
) -> None:
    """Breaks: a record file on disk. Must hold: the next open moves it to quarantine,
    does not know the key any more (a read falls back to other replicas), and keeps
    every other record."""
    store = _open(tmp_path)
    await store.put("victim", b"precious value", expected_version=0)
    await store.put("bystander", b"fine", expected_version=0)
    path = store._path("victim")
    if damage == "flip value":
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    else:
        assert isinstance(damage, bytes)
        path.write_bytes(damage)
    reopened = _open(tmp_path)
    assert not path.exists()
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    assert reopened.version("victim") == 0
    assert await reopened.get("victim") is None
    bystander = await reopened.get("bystander")
    assert bystander is not None and bystander.value == b"fine"


async def test_record_corrupted_while_open_is_quarantined_on_read(tmp_path: Path) -> None:
    store = _open(tmp_path)
    await store.put("k", b"value", expected_version=0)
    store._path("k").write_bytes(b"SR3R garbage")
    assert await store.get("k") is None
    assert store.version("k") == 0
    assert len(list((tmp_path / "quarantine").iterdir())) == 1


GOOD_KEYS = ["a", "blob/state.bin", "manifest/query-1/batch=42", "A:b_c-d.e", "x" * KEY_CHARS_MAX]
BAD_KEYS = [
    "",
    "../x",
    "a/../x",
    "a/./b",
    "a/..",
    "/abs",
    "a//b",
    ".hidden",
    "-flag",
    "a b",
    "a\x00b",
    "a\\b",
    "é",
    "x" * (KEY_CHARS_MAX + 1),
]


@pytest.mark.parametrize("key", GOOD_KEYS)
def test_good_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(key: str) -> None:
    with pytest.raises(ProtocolError):
        validate_key(key)
