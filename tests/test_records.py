"""Unit tests for ring.records on real files (no peer process): the acceptor's slots.

What must hold: a slot applies the consensus rules (``ring.paxos``) and keeps what it
promised and accepted across a restart (a forgotten promise could let two values be
chosen); a new owner's merge takes the highest promise and the value accepted at the
highest ballot; tombstones expire after their TTL; records written before consensus load
as accepted at the lowest classic ballot; a corrupt record file is quarantined, never
returned; keys that could escape the data folder or are otherwise malformed are refused.
"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import pytest
import xxhash

from ring.errors import ProtocolError
from ring.paxos import FAST, NOTHING, Ballot, Preempted, Slot, Value
from ring.records import (
    KEY_CHARS_MAX,
    LEGACY_BALLOT,
    RECORD_BYTES_MAX,
    RecordStore,
    validate_key,
)

CHUNK_A = "ab" * 16
B1, B2, B3 = Ballot(1, "aa"), Ballot(2, "bb"), Ballot(3, "aa")


def _open(root: Path, **options: object) -> RecordStore:
    store = RecordStore(root, **options)  # type: ignore[arg-type]
    store.open()
    return store


def _value(version: int, data: bytes = b"v", *, refs: tuple[str, ...] = ()) -> Value:
    return Value(version, data, refs, False, f"{version:02x}")


async def test_a_promise_and_an_acceptance_survive_a_restart(tmp_path: Path) -> None:
    """Breaks: a peer promises B2 and accepts a value at it, then restarts. Must hold:
    after the restart it still refuses B1 (prepare and accept) and holds the value at B2:
    both were on disk before the calls returned."""
    store = _open(tmp_path)
    assert await store.slot("m") == NOTHING
    promised = await store.prepare("m", B2)
    assert isinstance(promised, Slot) and promised.promised == B2
    assert isinstance(await store.accept("m", B2, _value(1, b"one"), B3), Slot)
    reopened = _open(tmp_path)
    slot = await reopened.slot("m")
    assert (slot.promised, slot.accepted, slot.value.data) == (B3, B2, b"one")
    assert await reopened.prepare("m", B1) == Preempted(B3)
    assert await reopened.accept("m", B1, _value(1, b"stale")) == Preempted(B3)
    assert reopened.version("m") == 1 and reopened.accepted("m") == (B2, "01")


async def test_fast_accept_only_on_a_pristine_slot(tmp_path: Path) -> None:
    """Breaks: a fast create on a key that holds a bare promise, and on one that holds a
    value. Must hold: both are refused; on a pristine key it is stored."""
    store = _open(tmp_path)
    assert isinstance(await store.accept("new", FAST, _value(1)), Slot)
    assert isinstance(await store.prepare("promised", B1), Slot)
    assert isinstance(await store.accept("promised", FAST, _value(1)), Preempted)
    assert isinstance(await store.accept("new", FAST, _value(1, b"other")), Preempted)
    assert (await store.slot("new")).value == _value(1)


async def test_merge_takes_the_highest_promise_and_the_highest_accepted_value(
    tmp_path: Path,
) -> None:
    """Breaks: a new owner merges three acceptors' slots: one promised B3 over an older
    value, one accepted a newer value at B2, one holds nothing. Must hold: its slot holds
    promise B3 and the value accepted at B2 (what a round would have found there)."""
    store = _open(tmp_path)
    older = Slot(B3, B1, _value(1, b"old"))
    newer = Slot(B2, B2, _value(2, b"new"))
    merged = await store.merge("k", [older, newer, NOTHING])
    assert (merged.promised, merged.accepted, merged.value.data) == (B3, B2, b"new")
    assert await _open(tmp_path).slot("k") == merged


async def test_merge_of_fast_values_takes_the_one_most_hold_and_keeps_its_own(
    tmp_path: Path,
) -> None:
    """Breaks: racing fast creates left different ballot-0 values on the acceptors a new
    owner merges (two hold one, one the other, listed either way round). Must hold: an
    empty slot takes the value most of them hold (a value a fast quorum chose is held by
    most of any majority); a slot that accepted a ballot-0 value keeps its own (an
    acceptor votes once per ballot)."""
    store = _open(tmp_path)
    chosen, other = Slot(B1, FAST, _value(1, b"chosen")), Slot(B1, FAST, _value(1, b"other"))
    for key, slots in [("a", [other, chosen, chosen]), ("b", [chosen, other, chosen])]:
        merged = await store.merge(key, slots)
        assert (merged.promised, merged.accepted, merged.value.data) == (B1, FAST, b"chosen")
    assert isinstance(await store.accept("mine", FAST, _value(1, b"other")), Slot)
    merged = await store.merge("mine", [chosen, chosen])
    assert (merged.promised, merged.accepted, merged.value.data) == (B1, FAST, b"other")


async def test_merge_never_lowers_what_a_slot_holds(tmp_path: Path) -> None:
    """Breaks: an acceptor that accepted at B3 merges a slot accepted at B1. Must hold:
    it keeps the value at B3."""
    store = _open(tmp_path)
    assert isinstance(await store.prepare("k", B3), Slot)
    assert isinstance(await store.accept("k", B3, _value(3, b"mine")), Slot)
    merged = await store.merge("k", [Slot(B1, B1, _value(1, b"older"))])
    assert (merged.accepted, merged.value.data) == (B3, b"mine")


async def test_a_tombstone_is_listed_only_when_asked_and_counts_as_absent(
    tmp_path: Path,
) -> None:
    """Breaks: a key is written then deleted (a tombstone accepted at a higher ballot).
    Must hold: ``count`` and a plain listing leave it out, a listing with tombstones
    shows its version, and it references no chunk any more."""
    store = _open(tmp_path)
    await store.accept("gone", B1, _value(1, b"v", refs=(CHUNK_A,)))
    await store.accept("kept", B1, _value(1))
    assert store.referenced() == {CHUNK_A}
    await store.accept("gone", B2, Value(2, deleted=True, op="02"))
    assert store.count() == 1 and store.is_deleted("gone")
    assert store.list("", 10) == [("kept", 1)]
    assert store.list("", 10, include_deleted=True) == [("gone", 2), ("kept", 1)]
    assert store.referenced() == set()
    assert store.keys() == ["gone", "kept"]


async def test_tombstones_are_purged_after_their_ttl(tmp_path: Path) -> None:
    """Breaks: a tombstone is stored, then the wall clock passes its TTL. Must hold: it
    is kept before the TTL and purged after (slot and file), live records stay."""
    now = [1_000.0]
    store = _open(tmp_path, tombstone_ttl_s=60.0, wall_clock=lambda: now[0])
    await store.accept("gone", B1, Value(1, deleted=True, op="01"))
    await store.accept("kept", B1, _value(1))
    now[0] += 59.0
    assert await store.purge_tombstones() == 0
    now[0] += 2.0
    assert await store.purge_tombstones() == 1
    assert not store.holds("gone") and store.holds("kept")
    assert _open(tmp_path).keys() == ["kept"]


async def test_value_above_limit_is_refused(tmp_path: Path) -> None:
    store = _open(tmp_path)
    with pytest.raises(ProtocolError):
        await store.accept("big", B1, _value(1, b"x" * (RECORD_BYTES_MAX + 1)))
    assert not store.holds("big")


def _legacy_file(key: str, version: object, value: bytes, refs: bytes, *, deleted: bool) -> bytes:
    meta = {
        "key": key,
        "version": version,
        "value_bytes": len(value),
        "value_xxh3": xxhash.xxh3_64_hexdigest(value),
        "refs": len(refs) // 16,
        "refs_xxh3": xxhash.xxh3_64_hexdigest(refs),
        **({"deleted": 1_000.0} if deleted else {}),
    }
    encoded = json.dumps(meta).encode()
    return b"SR3R" + struct.pack("<I", len(encoded)) + encoded + refs + value


@pytest.mark.parametrize("deleted", [False, True])
async def test_records_from_before_consensus_load_at_the_lowest_classic_ballot(
    tmp_path: Path, deleted: bool
) -> None:
    """Breaks: a record file in the format written before consensus (SR3R). Must hold:
    it loads as a value accepted at LEGACY_BALLOT with its version, value, refs and
    tombstone flag; any later round's ballot is above it."""
    store = _open(tmp_path)
    value, refs = (b"", b"") if deleted else (b"manifest", bytes.fromhex(CHUNK_A))
    store._path("old").write_bytes(_legacy_file("old", 4, value, refs, deleted=deleted))
    reopened = _open(tmp_path)
    slot = await reopened.slot("old")
    assert slot.accepted == LEGACY_BALLOT and slot.value.version == 4
    assert slot.value.deleted is deleted and slot.value.data == value
    assert slot.value.refs == (() if deleted else (CHUNK_A,))
    assert reopened.is_deleted("old") is deleted
    assert isinstance(await reopened.prepare("old", Ballot(1, "01")), Slot)


_DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize(
    "damage",
    [
        b"", b"SR3", b"XXXX\x00\x00\x00\x00{}", b"SR3P\xff\xff\x00\x00{", "flip value",
        # A legacy file's metadata nested past any recursion limit (was: RecursionError
        # out of the store's open, and the peer did not start), or a version as a string.
        b"SR3R" + struct.pack("<I", len(_DEEP)) + _DEEP,
        "version as a string",
    ],
    ids=["empty", "short", "bad magic", "bad metadata", "value flipped", "legacy nested",
         "legacy version"],
)  # fmt: skip
async def test_corrupt_record_file_is_quarantined_on_open(
    tmp_path: Path, damage: bytes | str
) -> None:
    """Breaks: a record file on disk. Must hold: the next open moves it to quarantine,
    does not know the key any more (a read falls back to other replicas), and keeps
    every other record."""
    store = _open(tmp_path)
    await store.accept("victim", B1, _value(1, b"precious value"))
    await store.accept("bystander", B1, _value(1, b"fine"))
    path = store._path("victim")
    if damage == "flip value":
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "version as a string":
        path.write_bytes(_legacy_file("victim", "1", b"precious value", b"", deleted=False))
    else:
        assert isinstance(damage, bytes)
        path.write_bytes(damage)
    reopened = _open(tmp_path)
    assert not path.exists()
    assert len(list((tmp_path / "quarantine").iterdir())) == 1
    assert reopened.version("victim") == 0
    assert await reopened.slot("victim") == NOTHING
    assert (await reopened.slot("bystander")).value.data == b"fine"


async def test_a_round_on_a_record_corrupted_while_open_quarantines_it_and_goes_on(
    tmp_path: Path,
) -> None:
    """Breaks: a record file is damaged on disk, then a prepare and an accept arrive.
    Must hold: each answers (the damaged slot is quarantined under the lock the round
    holds, which is not taken twice) instead of hanging every later round."""
    store = _open(tmp_path)
    assert isinstance(await store.accept("m", B1, _value(1)), Slot)
    store._path("m").write_bytes(b"damaged")
    async with asyncio.timeout(5):
        promised = await store.prepare("m", B2)
        assert isinstance(promised, Slot) and promised.accepted is None
        assert isinstance(await store.accept("n", B1, _value(1)), Slot)
    assert (tmp_path / "quarantine").iterdir()


async def test_record_corrupted_while_open_is_quarantined_on_read(tmp_path: Path) -> None:
    store = _open(tmp_path)
    await store.accept("k", B1, _value(1))
    store._path("k").write_bytes(b"SR3P garbage")
    assert await store.slot("k") == NOTHING
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
