"""Unit tests for ring.paxos: the consensus rules and the slot codec, pure.

What must hold: an acceptor never promises or accepts below what it promised (ballot 0
only when pristine); a proposer recovers the value at the highest classic ballot, a
fast-round value only when enough promises hold it that it may have been chosen by a fast
quorum (and then always); a read sees a value as chosen only from enough identical
answers; a slot survives encoding, and any malformed slot is a
``ProtocolError``, never another exception.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import struct
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring import paxos
from ring.errors import ProtocolError
from ring.paxos import EMPTY, FAST, NOTHING, Ballot, Preempted, Slot, Value

B1, B2, B3 = Ballot(1, "aa"), Ballot(2, "bb"), Ballot(3, "aa")
V1 = Value(1, b"one", (), False, "01")
V2 = Value(2, b"two", (), False, "02")
NOW = 1_000.0


def test_ballots_order_by_counter_then_proposer() -> None:
    assert FAST < Ballot(1, "0") < Ballot(1, "ff") < Ballot(2, "00")
    assert Ballot(7, "ab").following() == Ballot(8, "ab")


@pytest.mark.parametrize(
    "text",
    [None, "", "1", "1.", "x.ab", "-1.ab", "1.AB", "1.a b", "1.5.ab", "0.ab", "1." + "a" * 33,
     "٣.ab", f"{paxos.COUNTER_MAX + 1}.ab", "1" * 17 + ".ab", "1.ab" + " " * 60],
)  # fmt: skip
def test_malformed_ballots_are_refused(text: str | None) -> None:
    with pytest.raises(ProtocolError):
        Ballot.parse(text)


def test_ballots_round_trip() -> None:
    for ballot in (FAST, B1, Ballot(paxos.COUNTER_MAX, "f" * 32)):
        assert Ballot.parse(ballot.wire()) == ballot


def test_prepare_refuses_below_what_was_promised_or_accepted() -> None:
    """Breaks: prepares below, at and above a promise and an accepted ballot. Must hold:
    below is refused naming the highest; the same ballot (a resend) is promised again;
    above is promised; ballot 0 is never prepared."""
    promised = paxos.prepare(NOTHING, B2)
    assert promised == Slot(B2)
    assert paxos.prepare(promised, B1) == Preempted(B2)
    assert paxos.prepare(promised, B2) == promised
    assert paxos.prepare(promised, B3) == Slot(B3)
    accepted = Slot(B1, B2, V1)
    assert paxos.prepare(accepted, B1) == Preempted(B2)
    with pytest.raises(ProtocolError):
        paxos.prepare(NOTHING, FAST)


def test_accept_refuses_below_the_promise_and_promises_the_next_ballot() -> None:
    promised = Slot(B2)
    assert paxos.accept(promised, B1, V1, None, NOW) == Preempted(B2)
    accepted = paxos.accept(promised, B2, V1, B3, NOW)
    assert accepted == Slot(B3, B2, V1)
    assert paxos.accept(accepted, B2, V1, B3, NOW) == accepted  # a resend
    assert paxos.accept(accepted, B2, V2, None, NOW) == Preempted(B3)
    with pytest.raises(ProtocolError):
        paxos.accept(NOTHING, B2, V1, B1, NOW)


def test_fast_accept_only_on_a_pristine_slot() -> None:
    assert paxos.accept(NOTHING, FAST, V1, B1, NOW) == Slot(B1, FAST, V1)
    assert isinstance(paxos.accept(Slot(B1), FAST, V1, None, NOW), Preempted)
    assert isinstance(paxos.accept(Slot(FAST, FAST, V2), FAST, V1, None, NOW), Preempted)


def test_a_refused_fast_accept_names_a_ballot_that_parses() -> None:
    """Breaks: a fast create reaching a slot that took another fast value (nothing above
    ballot 0 promised or accepted there). Must hold: the refusal names a classic ballot
    valid on the wire (the peer sends it, the writer parses it and retries above it),
    not ``1.`` (counter 1 with no proposer), which ``Ballot.parse`` refuses."""
    refusal = paxos.accept(Slot(FAST, FAST, V2), FAST, V1, None, NOW)
    assert isinstance(refusal, Preempted)
    assert Ballot.parse(refusal.promised.wire(), "promised") == refusal.promised
    assert refusal.promised == paxos.CLASSIC_MIN and FAST < refusal.promised <= B1


def test_a_tombstone_keeps_the_time_it_was_first_stored() -> None:
    tombstone = Value(2, b"", (), True, "02")
    first = paxos.accept(Slot(B1, B1, V1), B2, tombstone, None, NOW)
    assert isinstance(first, Slot) and first.deleted_at == NOW
    again = paxos.accept(first, B3, tombstone, None, NOW + 50)
    assert isinstance(again, Slot) and again.deleted_at == NOW
    live = paxos.accept(first, B3, V2, None, NOW + 60)
    assert isinstance(live, Slot) and live.deleted_at is None


def test_recovery_takes_the_highest_classic_ballot() -> None:
    promises = [Slot(B3, B1, V1), Slot(B3, B2, V2), Slot(B3)]
    assert paxos.recovered_value(promises) == (B2, V2)
    assert paxos.recovered_value([Slot(B3), NOTHING]) == (None, EMPTY)


def test_recovery_takes_a_fast_value_only_if_every_promise_holds_it() -> None:
    """Breaks: ballot-0 values among promises. Must hold: a value every promise holds
    is recovered (it may be chosen); otherwise none was chosen (a refusal kept it from
    all R), and a classic value beats any ballot-0 value."""
    fast = Slot(B3, FAST, V1)
    assert paxos.recovered_value([fast, fast]) == (FAST, V1)
    assert paxos.recovered_value([fast, Slot(B3)]) == (None, EMPTY)
    assert paxos.recovered_value([fast, Slot(B3, FAST, V2)]) == (None, EMPTY)
    assert paxos.recovered_value([fast, Slot(B3, B1, V2)]) == (B1, V2)


@pytest.mark.parametrize("group", range(1, 10))
def test_fast_quorums_meet_every_promise_quorum_twice_and_are_the_smallest(group: int) -> None:
    """Breaks: every group size and promise quorum. Must hold: any promise quorum meets
    any two fast quorums (P + 2F > 2n), and no smaller F does; 4 of 5 and 3 of 3 for the
    quorums records use (majority writes)."""
    for promise_quorum in range(1, group + 1):
        fast = paxos.fast_quorum(group, promise_quorum)
        assert promise_quorum + 2 * fast > 2 * group
        assert fast == group or promise_quorum + 2 * (fast - 1) <= 2 * group
    assert paxos.fast_quorum(5, 5 - paxos.majority(5) + 1) == 4
    assert paxos.fast_quorum(3, 3 - paxos.majority(3) + 1) == 3
    with pytest.raises(ValueError):
        paxos.fast_quorum(3, 0)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7])
def test_recovery_finds_every_fast_value_a_fast_quorum_could_choose(group: int) -> None:
    """Breaks: every way ``group`` acceptors can hold two racing fast creates (V1, V2 or
    nothing), and every promise quorum of them, at the quorums records use. Must hold: a
    value held by a fast quorum is recovered from every promise quorum; no promise quorum
    recovers two values (no AssertionError); a value recovered is one a fast quorum could
    still complete (the promises refuse ballot 0, so it is held by at least
    ``len(Q) - (n - F)`` of them)."""
    write_quorum = paxos.majority(group)
    promise_quorum = group - write_quorum + 1
    fast = paxos.fast_quorum(group, promise_quorum)
    for holding in itertools.product((None, V1, V2), repeat=group):
        slots = [NOTHING if value is None else Slot(FAST, FAST, value) for value in holding]
        chosen = next((v for v in (V1, V2) if holding.count(v) >= fast), None)
        for size in range(promise_quorum, group + 1):
            for quorum in itertools.combinations(range(group), size):
                promises = [replace(slots[i], promised=B1) for i in quorum]
                ballot, value = paxos.recovered_value(promises, group, fast)
                if chosen is not None:
                    assert (ballot, value) == (FAST, chosen), (holding, quorum)
                if ballot is not None:
                    held = sum(1 for i in quorum if holding[i] == value)
                    assert held + (group - size) >= fast, (holding, quorum)


def test_a_fast_value_on_four_of_five_is_chosen_and_on_three_needs_a_round() -> None:
    """Breaks: five acceptors (records' groups for R = 3) answering a read after a fast
    create. Must hold: four at ballot 0 with one value are chosen; three with two empty
    need a round (neither chosen nor absent); three empty are absent."""
    fast = Slot(FAST, FAST, V1)
    assert paxos.chosen_value([fast] * 4 + [NOTHING], 5, 3) == V1
    assert paxos.chosen_value([fast] * 3 + [NOTHING] * 2, 5, 3) is None
    assert paxos.chosen_value([fast] * 3 + [Slot(FAST, FAST, V2)], 5, 3) is None
    assert paxos.chosen_value([fast] * 2 + [NOTHING] * 3, 5, 3) == EMPTY


@pytest.mark.parametrize(
    ("answers", "chosen"),
    [
        ([Slot(B1, B1, V1), Slot(B1, B1, V1)], V1),
        ([Slot(B1, B1, V1), Slot(B2, B2, V2)], None),
        ([Slot(B1, B1, V1)], None),
        ([NOTHING, NOTHING], EMPTY),
        ([NOTHING, Slot(B1, B1, V1)], None),
        ([Slot(B1, FAST, V1), Slot(B1, FAST, V1)], None),
        ([Slot(B1, FAST, V1)] * 3, V1),
        ([Slot(B1, FAST, V1), Slot(B1, FAST, V1), Slot(B1, FAST, V2)], None),
        ([Slot(B2), Slot(B2)], EMPTY),
    ],
)
def test_a_read_sees_a_value_chosen_only_from_enough_identical_answers(
    answers: list[Slot], chosen: Value | None
) -> None:
    """R=3, W=2: two identical classic answers, all three at ballot 0, or two that
    accepted nothing; anything else needs a round."""
    assert paxos.chosen_value(answers, 3, 2) == chosen


def test_view_digest_names_the_acceptors_in_order() -> None:
    digest = paxos.view_digest(["p1", "p2", "p3"])
    assert len(digest) == 16 and digest == paxos.view_digest(["p1", "p2", "p3"])
    assert digest != paxos.view_digest(["p2", "p1", "p3"])
    assert digest != paxos.view_digest(["p1", "p2"])


# -- codec ------------------------------------------------------------------------------

proposers = st.text("0123456789abcdef", min_size=1, max_size=32)
ballots = st.one_of(st.just(FAST), st.builds(Ballot, st.integers(1, paxos.COUNTER_MAX), proposers))
refs = st.lists(st.binary(min_size=16, max_size=16).map(bytes.hex), max_size=4).map(tuple)
ops = st.text("0123456789abcdef", max_size=64)


@st.composite
def slots(draw: st.DrawFn) -> Slot:
    accepted = draw(st.one_of(st.none(), ballots))
    if accepted is None:
        return Slot(draw(ballots))
    deleted = draw(st.booleans())
    value = Value(
        draw(st.integers(0, paxos.VERSION_MAX)),
        b"" if deleted else draw(st.binary(max_size=64)),
        () if deleted else draw(refs),
        deleted,
        draw(ops),
    )
    deleted_at = draw(st.one_of(st.none(), st.floats(0, 2e9))) if deleted else None
    return Slot(max(draw(ballots), accepted), accepted, value, deleted_at)


@given(slots())
def test_slots_round_trip(slot: Slot) -> None:
    decoded, _meta = paxos.decode_slot(paxos.encode_slot(slot), 1024)
    assert decoded == slot


def _meta_slot(**meta: object) -> bytes:
    base: dict[str, object] = {
        "promised": "1.aa", "accepted": "1.aa", "version": 1, "op": "01", "value_bytes": 1,
        "value_xxh3": "x", "refs": 0, "refs_xxh3": "x",
    }  # fmt: skip
    encoded = json.dumps({**base, **meta}).encode()
    return b"SR3P" + struct.pack("<I", len(encoded)) + encoded + b"v"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"SR3",
        b"SR3X\x00\x00\x00\x00",
        b"SR3P\xff\xff\xff\x7f{}",
        b"SR3P\x02\x00\x00\x00[]",
        b'SR3P\x05\x00\x00\x00{"a":',
        _meta_slot(),  # checksums wrong
        _meta_slot(version=-1),
        _meta_slot(version=True),
        _meta_slot(version=2**60),
        _meta_slot(value_bytes=2),
        _meta_slot(refs=70_000),
        _meta_slot(op="XYZ"),
        _meta_slot(promised="abc"),
        _meta_slot(accepted=5),
        _meta_slot(deleted_at="soon"),
    ],
)
def test_malformed_slots_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        paxos.decode_slot(data, 1024)


def _rewritten(slot: Slot, **changes: object) -> bytes:
    """``slot`` encoded, then its metadata changed (checksums stay valid)."""
    data = paxos.encode_slot(slot)
    meta_len = struct.unpack_from("<I", data, 4)[0]
    meta = {**json.loads(data[8 : 8 + meta_len]), **changes}
    encoded = json.dumps(meta).encode()
    return b"SR3P" + struct.pack("<I", len(encoded)) + encoded + data[8 + meta_len :]


TOMBSTONE = Slot(B1, B1, Value(1, b"", (), True, "01"), 1_700_000_000.0)


@pytest.mark.parametrize(
    "data",
    [
        _rewritten(Slot(B1, B1, V1), deleted=2),
        _rewritten(TOMBSTONE, deleted=2),
        _rewritten(TOMBSTONE, deleted=1),
        _rewritten(TOMBSTONE, deleted="true"),
        _rewritten(TOMBSTONE, deleted_at=-1),
        _rewritten(TOMBSTONE, deleted_at=1e300),
        _rewritten(TOMBSTONE, deleted_at=True),
        _rewritten(Slot(B1, B1, V1), deleted_at=1_700_000_000.0),
        _rewritten(Slot(B1, B1, V1), value_xxh3=5),
        _rewritten(Slot(B1, B1, V1), refs_xxh3=None),
    ],
)
def test_every_field_of_a_slot_is_checked_even_with_valid_checksums(data: bytes) -> None:
    """Breaks: a slot whose checksums match but a field has the wrong type or range
    (``"deleted": 2`` was taken as "not deleted"). Must hold: ProtocolError."""
    with pytest.raises(ProtocolError):
        paxos.decode_slot(data, 1024)
    assert paxos.decode_slot(_rewritten(TOMBSTONE), 1024)[0] == TOMBSTONE


def test_a_tombstone_with_data_and_a_value_without_acceptance_are_refused() -> None:
    tombstone = paxos.encode_slot(Slot(B1, B1, Value(1, b"", (), True, "01")))
    meta_len = struct.unpack_from("<I", tombstone, 4)[0]
    meta = json.loads(tombstone[8 : 8 + meta_len])
    meta.update(value_bytes=1)
    encoded = json.dumps(meta).encode()
    with pytest.raises(ProtocolError):
        paxos.decode_slot(b"SR3P" + struct.pack("<I", len(encoded)) + encoded + b"x", 1024)
    lone = paxos.encode_slot(Slot(B1, B1, V1))
    meta_len = struct.unpack_from("<I", lone, 4)[0]
    meta = json.loads(lone[8 : 8 + meta_len])
    del meta["accepted"]
    encoded = json.dumps(meta).encode()
    with pytest.raises(ProtocolError):
        paxos.decode_slot(
            b"SR3P" + struct.pack("<I", len(encoded)) + encoded + lone[8 + meta_len :], 1024
        )


@settings(max_examples=300)
@given(st.data())
def test_mutated_slots_decode_or_raise_protocol_errors(data: st.DataObject) -> None:
    """Breaks: random bytes, and valid encodings with bytes flipped, cut or appended.
    Must hold: ``decode_slot`` returns a slot or raises ProtocolError, nothing else."""
    encoded = paxos.encode_slot(data.draw(slots()))
    choice = data.draw(st.sampled_from(["random", "flip", "cut", "append"]))
    if choice == "random":
        mutated = data.draw(st.binary(max_size=256))
    elif choice == "flip":
        index = data.draw(st.integers(0, len(encoded) - 1))
        mutated = encoded[:index] + bytes([encoded[index] ^ 0xFF]) + encoded[index + 1 :]
    elif choice == "cut":
        mutated = encoded[: data.draw(st.integers(0, len(encoded)))]
    else:
        mutated = encoded + data.draw(st.binary(min_size=1, max_size=16))
    with contextlib.suppress(ProtocolError):
        paxos.decode_slot(mutated, 1024)


@given(slots(), ballots, st.one_of(st.none(), ballots), st.booleans())
def test_every_refusal_names_a_ballot_valid_on_the_wire(
    slot: Slot, ballot: Ballot, following: Ballot | None, preparing: bool
) -> None:
    """Breaks: prepares and accepts at any ballot against any slot. Must hold: a refusal
    names a ballot whose wire form parses back to itself (the peer sends it in a 409 and
    the proposer parses it), above the refused ballot (a retry above it goes above both)."""
    try:
        if preparing:
            outcome = paxos.prepare(slot, ballot)
        else:
            outcome = paxos.accept(slot, ballot, V1, following, NOW)
    except ProtocolError:  # a prepare at ballot 0, a next ballot not above the accept's
        return
    if isinstance(outcome, Preempted):
        assert Ballot.parse(outcome.promised.wire(), "promised") == outcome.promised
        assert outcome.promised > ballot
