"""Scans of records: one request per peer tells which records under a prefix are chosen.

What must hold: a peer's page is the keys under the prefix in order, past ``after``,
rolled up at "/" with a delimiter (only where something live is under the prefix), cut
at ``limit`` with ``truncated`` and the last key it covers; the client's verdicts count
a peer's slot only when it places keys as the client does, covered the key and is caught
up, and call a record chosen exactly when ``paxos.chosen_value`` would on those slots
(otherwise the record is read); on a real ring, a scan gives what reading each record
gives, also after one acceptor missed writes and deletes (SIGKILLed, then restarted),
and a sorted index answers a scan of a small prefix among many records.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import paxos, records_api
from ring.client import Client
from ring.client.proposer import Acceptors
from ring.client.records import scan_verdicts
from ring.errors import DataUnavailable, ProtocolError
from ring.paxos import FAST, Ballot, Slot, Value
from ring.placement import Member, Ring
from ring.records import RecordStore
from sr3.local import LocalCluster

B1, B2 = Ballot(1, "aa"), Ballot(2, "bb")


def _open(root: Path) -> RecordStore:
    store = RecordStore(root)
    store.open()
    return store


async def _put(store: RecordStore, key: str, data: bytes = b"v", *, deleted: bool = False) -> None:
    value = Value(1, b"" if deleted else data, (), deleted, "01" * 12)
    assert isinstance(await store.accept(key, B1, value), Slot)


# -- one peer's page ----------------------------------------------------------------------


async def test_a_page_lists_in_order_rolls_up_and_resumes_after_a_key(tmp_path: Path) -> None:
    store = _open(tmp_path)
    for key in ["d/a", "d/b/1", "d/b/2", "d/c", "d/e/x", "d0", "e/a"]:
        await _put(store, key, key.encode())
    await _put(store, "d/gone/1", deleted=True)
    page = store.scan("d/", 10, delimiter=True, head_bytes=2)
    assert [(r.key, r.head) for r in page.records] == [("d/a", b"d/"), ("d/c", b"d/")]
    assert page.prefixes == ["d/b/", "d/e/"]  # d/gone/ holds only a tombstone here
    assert (page.truncated, page.last) == (False, "d/gone/")
    assert [r.key for r in store.scan("d/", 10).records] == [
        "d/a", "d/b/1", "d/b/2", "d/c", "d/e/x", "d/gone/1",
    ]  # fmt: skip
    first = store.scan("d/", 2, delimiter=True)
    assert ([r.key for r in first.records], first.prefixes) == (["d/a"], ["d/b/"])
    assert (first.truncated, first.last) == (True, "d/b/")
    rest = store.scan("d/", 10, delimiter=True, after=first.last)
    assert ([r.key for r in rest.records], rest.prefixes) == (["d/c"], ["d/e/"])
    after_key = store.scan("d/", 10, after="d/b/1")
    assert [r.key for r in after_key.records][:2] == ["d/b/2", "d/c"]
    with pytest.raises(ProtocolError):
        store.scan("d/", 10, head_bytes=records_api.SCAN_HEAD_BYTES_MAX + 1)


async def test_tombstones_do_not_fill_a_page_and_a_key_past_a_prefix_is_not_skipped(
    tmp_path: Path,
) -> None:
    """A directory Spark prunes holds far more tombstones than live entries: a page of
    ``limit`` live records must not end early on them (a listing, or a non-recursive
    delete's emptiness check, would see nothing). Resuming past a rolled-up prefix
    ("d/a/") must not skip a key that sorts right after it ("d/a0")."""
    store = _open(tmp_path)
    for number in range(90):
        await _put(store, f"t/{number:03d}", deleted=True)
    for number in range(90, 100):
        await _put(store, f"t/{number:03d}")
    page = store.scan("t/", 3)
    assert [r.key for r in page.records if not r.deleted] == ["t/090", "t/091", "t/092"]
    assert len([r for r in page.records if r.deleted]) == 90 and page.truncated
    first = store.scan("t/", 1)
    assert [r.key for r in first.records if not r.deleted] == ["t/090"]
    for key in ["d/a/x", "d/a0", "d/b"]:
        await _put(store, key)
    head = store.scan("d/", 1, delimiter=True)
    assert (head.prefixes, head.last, head.truncated) == (["d/a/"], "d/a/", True)
    rest = store.scan("d/", 10, delimiter=True, after=head.last)
    assert [r.key for r in rest.records] == ["d/a0", "d/b"]


async def test_the_index_follows_writes_deletes_and_a_restart(tmp_path: Path) -> None:
    store = _open(tmp_path)
    for number in range(300):
        await _put(store, f"k/{number:04d}")
    await store.delete_local("k/0005")
    assert len(store.scan("k/", 1000).records) == 299
    assert [key for key, _v in store.list("k/01", 3)] == ["k/0100", "k/0101", "k/0102"]
    reopened = _open(tmp_path)
    assert reopened.keys() == store.keys()
    held = reopened.keys()
    assert "k/0005" not in held and len(held) == 299


# -- the client's verdicts ----------------------------------------------------------------

MEMBERS = tuple(Member(f"peer-{n}", f"127.0.0.{n}:1") for n in range(1, 6))
RING = Ring.build(MEMBERS, vnodes=16)
PLACEMENT = paxos.placement_digest(MEMBERS)


def _acceptors(key: str) -> Acceptors:
    members = RING.preference_list(key, 3)
    return Acceptors(members, 3, 2, paxos.view_digest([m.peer_id for m in members]))


def _record(
    key: str, ballot: Ballot | None, version: int, *, synced: bool = True
) -> records_api.ScanRecord:
    return records_api.ScanRecord(
        key, version, "" if ballot is None else ballot.wire(), f"{version:024x}", False,
        b"head", synced,
    )  # fmt: skip


def _page(
    records: list[records_api.ScanRecord], *, settled: bool = True, placement: str = PLACEMENT,
    truncated: bool = False, last: str = "",
) -> records_api.ScanAnswer:  # fmt: skip
    return records_api.ScanAnswer(tuple(records), (), truncated, last, placement, settled)


def _holders(key: str) -> list[str]:
    return [m.peer_id for m in _acceptors(key).members]


def test_agreeing_acceptors_decide_and_a_lone_one_does_not() -> None:
    key = "fs/a"
    first, second, third = _holders(key)
    pages = {peer: _page([_record(key, B1, 1)]) for peer in (first, second)}
    pages[third] = _page([])
    verdict = scan_verdicts(pages, PLACEMENT, _acceptors)
    assert verdict.chosen[key].version == 1 and not verdict.undecided
    lone = {first: _page([_record(key, B1, 1)]), second: _page([]), third: _page([])}
    # Two acceptors that accepted nothing: a value one holds was never chosen.
    assert scan_verdicts(lone, PLACEMENT, _acceptors).chosen[key] == paxos.EMPTY
    split = {first: _page([_record(key, B1, 1)]), second: _page([_record(key, B2, 2)])}
    assert scan_verdicts(split, PLACEMENT, _acceptors).undecided == [key]


def test_only_trustworthy_slots_count() -> None:
    key = "fs/b"
    first, second, third = _holders(key)
    held = _record(key, B1, 1)
    cases = {
        "unsettled peer without the key": {
            first: _page([held]), second: _page([], settled=False), third: _page([], settled=False)
        },
        "other placement": {
            first: _page([held]), second: _page([held], placement="other"), third: _page([])
        },
        "not caught up on the key": {
            first: _page([held]), second: _page([_record(key, B1, 1, synced=False)]),
            third: _page([]),
        },
    }  # fmt: skip
    for name, pages in cases.items():
        assert scan_verdicts(pages, PLACEMENT, _acceptors).undecided == [key], name


def test_a_truncated_page_covers_only_up_to_its_last_key() -> None:
    keys = sorted(f"fs/t/{n}" for n in range(40))
    full = {peer.peer_id: _page([_record(k, B1, 1) for k in keys]) for peer in MEMBERS}
    cut_peer = MEMBERS[0].peer_id
    full[cut_peer] = _page([_record(k, B1, 1) for k in keys[:10]], truncated=True, last=keys[9])
    verdict = scan_verdicts(full, PLACEMENT, _acceptors)
    assert (verdict.truncated, verdict.last) == (True, keys[9])
    assert sorted(verdict.chosen) == keys[:10]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([None, FAST, B1, B2]),
            st.integers(1, 2),
            st.booleans(),  # answered
        ),
        min_size=3,
        max_size=3,
    )
)
def test_verdicts_agree_with_a_read_of_the_same_slots(
    slots: list[tuple[Ballot | None, int, bool]],
) -> None:
    """A scan decides a record exactly when a read of the acceptors that answered would
    (``paxos.chosen_value``), and on the same value."""
    key = "fs/h"
    pages: dict[str, records_api.ScanAnswer] = {}
    read: list[Slot] = []
    for peer, (ballot, version, answered) in zip(_holders(key), slots, strict=True):
        if not answered:
            continue
        if ballot is None:
            pages[peer] = _page([])
            read.append(paxos.NOTHING)
            continue
        record = _record(key, ballot, version)
        pages[peer] = _page([record])
        value = Value(version, b"head", (), False, record.op)
        read.append(Slot(ballot, ballot, value))
    if not pages:
        return
    expected = paxos.chosen_value(read, 3, 2)
    verdict = scan_verdicts(pages, PLACEMENT, _acceptors)
    if not any(page.records for page in pages.values()):
        assert verdict.chosen == {} and verdict.undecided == []
    elif expected is None:
        assert verdict.undecided == [key]
    else:
        assert verdict.chosen[key] == expected


# -- a real ring --------------------------------------------------------------------------


async def _scan_all(client: Client, prefix: str, **options: object) -> dict[str, tuple[int, bytes]]:
    found: dict[str, tuple[int, bytes]] = {}
    after = ""
    for _page_number in range(100):
        scan = await client.scan_records(prefix, after=after, **options)  # type: ignore[arg-type]
        found.update({r.key: (r.version, r.head) for r in scan.records})
        if not scan.truncated:
            return found
        after = scan.last
    raise AssertionError("the scan did not end")


async def test_a_scan_gives_what_reads_give_after_an_acceptor_missed_writes(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: one peer is SIGKILLed while records under a prefix are written, updated
    and deleted, then restarted (it holds stale slots for some keys). Must hold: a scan
    (paged, small pages) returns exactly the records and versions reading each key
    returns, with their heads."""
    prefix = f"scan/{rng.randrange(10**9)}/"
    keys = [f"{prefix}{n:03d}" for n in range(60)]
    async with Client(ring.ring, ring.secret) as client:
        for key in keys[:30]:
            await client.put_record(key, key.encode() + b"-1", expected_version=0)
        victim = ring.cluster.peers[rng.randrange(len(ring.cluster.peers))].peer_id
        ring.kill(victim)
        for key in keys[30:]:
            await client.put_record(key, key.encode() + b"-1", expected_version=0)
        for key in keys[:10]:
            await client.put_record(key, key.encode() + b"-2", expected_version=1)
        for key in keys[10:20]:
            await client.delete_record(key, expected_version=1)
        ring.start(victim)
        expected: dict[str, tuple[int, bytes]] = {}
        for key in keys:
            record = await client.get_record(key)
            if record is not None:
                expected[key] = (record.version, record.value[:8])
        scanned = await _scan_all(client, prefix, limit=7, head_bytes=8)
        assert scanned == expected
        assert len(expected) == 50
        rolled = await client.scan_records(prefix[: prefix.index("/") + 1], delimiter=True)
        assert prefix in rolled.prefixes


async def test_a_scan_that_cannot_see_every_record_says_so(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: three of five peers are SIGKILLed, so every key has three of its five
    acceptors down (two of five leave a majority of each group: a scan still sees
    everything, as reads do). Must hold: a scan raises ``DataUnavailable`` (a read of such a key
    would) instead of leaving records out; with ``allow_stale`` it answers what the
    others hold and says it is not complete."""
    prefix = f"scan-cover/{rng.randrange(10**9)}/"
    async with Client(ring.ring, ring.secret) as client:
        for number in range(20):
            await client.put_record(f"{prefix}{number:02d}", b"v", expected_version=0)
        assert (await client.scan_records(prefix)).complete
        victims = [peer.peer_id for peer in ring.cluster.peers[:3]]
        for victim in victims:
            ring.kill(victim)
        try:
            with pytest.raises(DataUnavailable):
                await client.scan_records(prefix)
            stale = await client.scan_records(prefix, allow_stale=True)
            assert not stale.complete
            assert {r.key for r in stale.records} <= {f"{prefix}{n:02d}" for n in range(20)}
        finally:
            for victim in victims:
                ring.start(victim)
