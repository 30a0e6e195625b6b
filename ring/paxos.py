"""Consensus for records: the rules of CASPaxos over a key's R preferred peers, pure.

Each record is a register replicated on the key's R preferred peers, its *acceptors*.
A client changes it with one consensus round (CASPaxos, Rystsov 2018): the *proposer*
picks a ballot higher than any it has seen, asks the acceptors to promise it
(``prepare``), takes the value with the highest accepted ballot among ``R - W + 1``
promises as the register's current state, applies its change (compare-and-set, delete,
or nothing for a read) and asks the acceptors to accept the result at that ballot
(``accept``). Once ``W`` accepted, the value is *chosen*: every later round reads it or a
successor, because any ``R - W + 1`` promises meet any ``W`` acceptances (flexible
quorums, Howard et al. 2016). A refusal names the higher ballot that pre-empted the
proposer, which retries above it.

Three shortcuts keep the common cases to one round trip per replica, each safe for the
reason given:

- **Fast create** (ballot 0, the fast round of Fast Paxos, Lamport 2006): a writer
  creating a key sends ``accept`` at ballot 0 directly; an acceptor takes it only if it
  never promised or accepted anything for the key. The value counts as chosen once a
  *fast quorum* of ``F`` acceptors accepted it (``fast_quorum``: the smallest F such that
  any promise quorum meets any two fast quorums, ``P + 2F > n``; 4 of 5 for records, all
  3 of 3). A later proposer whose promises ``Q`` hold ballot-0 values (and no classic
  one) recovers value v only if at least ``|Q| - (n - F)`` of them hold it: if v was
  chosen, at most ``n - F`` acceptors lack it, so that many of ``Q`` hold it, and no
  other value can reach as many (``|Q| > 2(n - F)``); if none reaches it, none was
  chosen, and none can be (the promises refuse ballot 0 from then on).
- **A writer's next ballot**: an ``accept`` may carry ``next``, the writer's following
  ballot; an acceptor that accepts promises ``next`` at the same moment. When enough
  acceptors (``R - W + 1``, and ``W`` for the write itself) did, the writer's next change
  of the key may skip ``prepare``: those promises were given while the acceptors held the
  value the writer knows, which is what ``prepare`` would have returned.
- **Reads that find the value chosen**: answers from the preferred peers holding one
  accepted ballot and write at ``max(W, R - W + 1)`` of them (a fast quorum for ballot
  0), or
  ``R - W + 1`` holding nothing, are the register's state; only a read that finds replicas
  disagreeing runs a round (an accept of the state it found) before it answers.

Every value carries ``op``, the id of the write that made it, so that a writer whose
round was interrupted recognizes its own write when it finds it chosen, and never reports
a conflict for a write that took effect.

On the wire and on disk a slot (one acceptor's state for a key) is

    b"SR3P" | u32 metadata length | metadata JSON | refs | value

with the ballots, version, flags, op, and lengths and xxh3-64 of refs and value in the
metadata. ``decode_slot`` bounds every field before anything else reads it.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, replace

import xxhash

from ring.api import REF_BYTES, REFS_MAX, VERSION_MAX
from ring.cluster import majority
from ring.errors import ProtocolError
from ring.parse import load_json
from ring.placement import Member

__all__ = [
    "CLASSIC_MIN",
    "EMPTY",
    "FAST",
    "NOTHING",
    "Ballot",
    "Preempted",
    "Slot",
    "Value",
    "accept",
    "chosen_value",
    "decode_slot",
    "encode_slot",
    "fast_quorum",
    "majority",
    "prepare",
    "record_group",
    "recovered_value",
    "view_digest",
]

MAGIC = b"SR3P"
_LENGTH = struct.Struct("<I")
PROPOSER_PATTERN = re.compile(r"[0-9a-f]{1,32}")
OP_PATTERN = re.compile(r"[0-9a-f]{0,64}")
COUNTER_MAX = 2**53 - 1
META_BYTES_MAX = 4096
# A tombstone's wall-clock time of first storage, seconds since the epoch: year 9999.
DELETED_AT_MAX = 253_402_300_799
# A slot's value and refs together; the caller bounds the value itself (RECORD_BYTES_MAX).
SLOT_BYTES_MAX = 8 + META_BYTES_MAX + REFS_MAX * REF_BYTES + 2 * 1024 * 1024


@dataclass(frozen=True, order=True, slots=True)
class Ballot:
    """A proposal number: ``counter`` first, the proposer's id to break ties. Ballot 0
    (``FAST``) is the fast round that only a pristine acceptor accepts."""

    counter: int
    proposer: str = ""

    def wire(self) -> str:
        return f"{self.counter}.{self.proposer}"

    def following(self) -> Ballot:
        return Ballot(self.counter + 1, self.proposer)

    @classmethod
    def parse(cls, text: str | None, name: str = "ballot") -> Ballot:
        if text is None or len(text) > 60:
            raise ProtocolError(f"{name} is missing or too long")
        counter, _, proposer = text.partition(".")
        if not counter.isascii() or not counter.isdigit() or len(counter) > 16:
            raise ProtocolError(f"{name} {text[:60]!r} is not <counter>.<proposer>")
        value = int(counter)
        if value > COUNTER_MAX:
            raise ProtocolError(f"{name} counter is above {COUNTER_MAX}")
        if value == 0 and proposer == "":
            return FAST
        if value == 0 or PROPOSER_PATTERN.fullmatch(proposer) is None:
            raise ProtocolError(f"{name} {text[:60]!r}: a proposer is 1-32 hex digits")
        return cls(value, proposer)


FAST = Ballot(0, "")
# The lowest classic ballot: counter 1 and the smallest proposer id the wire allows ("0";
# 1-32 hex digits, so "" is not valid and Ballot(1, "") would not parse). A refused fast
# accept names at least this, since the slot may hold nothing above FAST (it took another
# fast value): the refusal parses, and the writer retries above it at a classic ballot.
# Every ballot a proposer picks (counter >= 1, a 16-hex-digit id) is above it. It equals
# records.LEGACY_BALLOT on purpose, as both mean "the lowest classic ballot": a refusal
# only bounds where the proposer retries, and a slot accepted at LEGACY_BALLOT is refused
# naming that same ballot, which bounds it the same way.
CLASSIC_MIN = Ballot(1, "0")


@dataclass(frozen=True, slots=True)
class Value:
    """The register's state: version 0 is absent; a delete is a value with ``deleted``."""

    version: int
    data: bytes = b""
    refs: tuple[str, ...] = ()
    deleted: bool = False
    op: str = ""


EMPTY = Value(0)


@dataclass(frozen=True, slots=True)
class Slot:
    """One acceptor's state for one key."""

    promised: Ballot = FAST
    accepted: Ballot | None = None
    value: Value = EMPTY
    # Wall-clock seconds when this acceptor first held the value as a tombstone.
    deleted_at: float | None = None

    @property
    def pristine(self) -> bool:
        return self.promised == FAST and self.accepted is None


NOTHING = Slot()


@dataclass(frozen=True, slots=True)
class Preempted:
    """An acceptor's refusal: ``promised`` is at or above every ballot it promised or
    accepted, and above the refused ballot (a refused fast accept names at least
    ``CLASSIC_MIN``), so the proposer retries above it; it is always valid on the wire."""

    promised: Ballot


def prepare(slot: Slot, ballot: Ballot) -> Slot | Preempted:
    """Promise ``ballot`` (a classic one) unless a higher ballot was promised or accepted
    here. The same ballot again is the same proposer's resent prepare (ballots are unique
    to a proposer, which never reuses one): it gets the same promise."""
    if ballot == FAST:
        raise ProtocolError("ballot 0 is only for a fast create's accept")
    if ballot < slot.promised or (slot.accepted is not None and ballot < slot.accepted):
        return Preempted(max(slot.promised, slot.accepted or FAST))
    return replace(slot, promised=ballot)


def accept(
    slot: Slot, ballot: Ballot, value: Value, following: Ballot | None, now: float
) -> Slot | Preempted:
    """Accept ``value`` at ``ballot`` if nothing higher was promised (ballot 0: only on a
    pristine slot), promising ``following`` with it when given. The same accept again
    (a resent message) is acknowledged and changes nothing."""
    if slot.accepted == ballot and slot.value == value:
        return slot
    if ballot == FAST:
        if not slot.pristine:
            return Preempted(max(slot.promised, slot.accepted or FAST, CLASSIC_MIN))
    elif ballot < slot.promised:
        return Preempted(slot.promised)
    if following is not None and following <= ballot:
        raise ProtocolError("the next ballot promised with an accept must be above it")
    promised = max(slot.promised, ballot, following or FAST)
    if not value.deleted:
        deleted_at = None
    elif slot.value.deleted and slot.value.op == value.op:
        deleted_at = slot.deleted_at
    else:
        deleted_at = now
    return Slot(promised, ballot, value, deleted_at)


def fast_quorum(group: int, promise_quorum: int) -> int:
    """Acceptors of ``group`` that must accept a ballot-0 value for it to be chosen: the
    smallest F with ``promise_quorum + 2F > 2 * group``, so that any promise quorum meets
    any two fast quorums (two fast values cannot both look chosen to a recovery). 4 of 5
    with promise quorums of 3; all of a group of 3 with promise quorums of 2."""
    if not 1 <= promise_quorum <= group:
        raise ValueError(f"a promise quorum of {promise_quorum} in a group of {group}")
    return min(group, (2 * group - promise_quorum) // 2 + 1)


def recovered_value(
    promises: Sequence[Slot], group: int | None = None, fast: int | None = None
) -> tuple[Ballot | None, Value]:
    """The register's state from a quorum of promises: the value at the highest classic
    ballot; else a fast-round value that may have been chosen: one held by at least
    ``len(promises) - (group - fast)`` of them (every promise when ``group`` and ``fast``,
    the fast quorum, are not given: a group without fast rounds); else absent."""
    classic = [s for s in promises if s.accepted is not None and s.accepted != FAST]
    if classic:
        best = max(classic, key=lambda s: s.accepted or FAST)
        return best.accepted, best.value
    missing = 0 if group is None or fast is None else group - fast
    needed = max(1, len(promises) - missing)
    counts: dict[Value, int] = {}
    for slot in promises:
        if slot.accepted == FAST:
            counts[slot.value] = counts.get(slot.value, 0) + 1
    candidates = [value for value, count in counts.items() if count >= needed]
    if len(candidates) > 1:
        # Impossible with quorums that meet (``fast_quorum``): a caller's sizes are wrong.
        raise AssertionError(f"{len(promises)} promises recover {len(candidates)} fast values")
    if candidates:
        return FAST, candidates[0]
    return None, EMPTY


def chosen_value(answers: Sequence[Slot], replication: int, write_quorum: int) -> Value | None:
    """The chosen value, if ``answers`` (one per distinct preferred peer) show it without a
    round: ``max(W, R - W + 1)`` at one classic ballot and value, a fast quorum at ballot
    0 (``fast_quorum``), or ``R - W + 1`` that never accepted anything (absent). None: a
    round must decide."""
    promise_quorum = replication - write_quorum + 1
    needed = max(write_quorum, promise_quorum)
    fast = fast_quorum(replication, promise_quorum)
    groups: dict[tuple[Ballot, Value], int] = {}
    empty = 0
    for slot in answers:
        if slot.accepted is None:
            empty += 1
        else:
            groups[(slot.accepted, slot.value)] = groups.get((slot.accepted, slot.value), 0) + 1
    for (ballot, value), count in groups.items():
        if count >= (fast if ballot == FAST else needed):
            return value
    if empty >= promise_quorum:
        return EMPTY
    return None


def record_group(replication: int) -> int:
    """Acceptors per record for replication factor R: 2R - 1, so that the R - 1
    simultaneous losses chunks survive leave a majority of every record's acceptors
    (tolerating f failures linearizably takes 2f + 1). A ring of fewer members gives every
    record all of them."""
    return 2 * replication - 1


def placement_digest(members: Sequence[Member]) -> str:
    """Names a placement: the member ids and zones that key placement is computed from
    (two peers with the same digest compute the same acceptors for every key)."""
    lines = sorted(f"{member.peer_id}\t{member.zone or ''}" for member in members)
    return xxhash.xxh3_64_hexdigest("\n".join(lines).encode())


def view_digest(preferred_ids: Sequence[str]) -> str:
    """Names a key's acceptors: an acceptor takes part in a round only when the proposer
    computed the same preferred peers as it did (else one of the two has a stale member
    table, and quorums of two different peer sets need not meet)."""
    return xxhash.xxh3_64_hexdigest(",".join(preferred_ids).encode())


# -- codec ------------------------------------------------------------------------------


def encode_slot(slot: Slot, key: str | None = None) -> bytes:
    """The slot's bytes; ``key`` is written into the metadata too (a record file names
    the key it holds; on the wire the path does)."""
    value = slot.value
    refs = b"".join(bytes.fromhex(ref) for ref in value.refs)
    meta = {
        "promised": slot.promised.wire(),
        "version": value.version,
        "op": value.op,
        "value_bytes": len(value.data),
        "value_xxh3": xxhash.xxh3_64_hexdigest(value.data),
        "refs": len(value.refs),
        "refs_xxh3": xxhash.xxh3_64_hexdigest(refs),
    }
    if slot.accepted is not None:
        meta["accepted"] = slot.accepted.wire()
    if value.deleted:
        meta["deleted"] = True
    if slot.deleted_at is not None:
        meta["deleted_at"] = slot.deleted_at
    if key is not None:
        meta["key"] = key
    encoded = json.dumps(meta, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(len(encoded)) + encoded + refs + value.data


def decode_slot(data: bytes, value_bytes_max: int) -> tuple[Slot, dict[str, object]]:
    """A slot and its metadata (callers may keep fields of their own there), verified."""
    if len(data) < 8 or data[:4] != MAGIC:
        raise ProtocolError("a record slot starts with SR3P")
    (meta_len,) = _LENGTH.unpack_from(data, 4)
    if meta_len > META_BYTES_MAX or 8 + meta_len > len(data):
        raise ProtocolError("a record slot's metadata is too long or cut")
    meta = load_json(data[8 : 8 + meta_len], bytes_max=META_BYTES_MAX)
    if not isinstance(meta, dict):
        raise ProtocolError("a record slot's metadata is a JSON object")
    body = data[8 + meta_len :]
    refs_count = _bounded_int(meta.get("refs", 0), "refs", REFS_MAX)
    value_bytes = _bounded_int(meta.get("value_bytes"), "value_bytes", value_bytes_max)
    version = _bounded_int(meta.get("version"), "version", VERSION_MAX)
    if len(body) != refs_count * REF_BYTES + value_bytes:
        raise ProtocolError("a record slot's body does not match its lengths")
    refs_raw, payload = body[: refs_count * REF_BYTES], body[refs_count * REF_BYTES :]
    if xxhash.xxh3_64_hexdigest(refs_raw) != meta.get("refs_xxh3"):
        raise ProtocolError("a record slot's refs fail their checksum")
    if xxhash.xxh3_64_hexdigest(payload) != meta.get("value_xxh3"):
        raise ProtocolError("a record slot's value fails its checksum")
    op = meta.get("op", "")
    if not isinstance(op, str) or OP_PATTERN.fullmatch(op) is None:
        raise ProtocolError("a record slot's op is up to 64 hex digits")
    deleted = meta.get("deleted", False)
    if not isinstance(deleted, bool):
        raise ProtocolError("a record slot's deleted is true or false")
    if deleted and (payload or refs_count):
        raise ProtocolError("a tombstone carries no value and no refs")
    refs = tuple(refs_raw[i : i + REF_BYTES].hex() for i in range(0, len(refs_raw), REF_BYTES))
    accepted_text = meta.get("accepted")
    accepted = None if accepted_text is None else Ballot.parse(_text(accepted_text), "accepted")
    if accepted is None and (version or deleted or payload or refs_count):
        raise ProtocolError("a record slot that accepted nothing holds no value")
    deleted_at = meta.get("deleted_at")
    if deleted_at is not None and (
        not deleted
        or not isinstance(deleted_at, (int, float))
        or isinstance(deleted_at, bool)
        or not 0 <= deleted_at <= DELETED_AT_MAX
    ):
        raise ProtocolError(
            f"a record slot's deleted_at is a number of seconds in 0..{DELETED_AT_MAX}, "
            "on a tombstone only"
        )
    for name in ("value_xxh3", "refs_xxh3"):
        if not isinstance(meta.get(name), str):
            raise ProtocolError(f"a record slot's {name} is 16 hex digits")
    slot = Slot(
        Ballot.parse(_text(meta.get("promised")), "promised"),
        accepted,
        Value(version, payload, refs, deleted, op),
        None if deleted_at is None else float(deleted_at),
    )
    return slot, meta


def _bounded_int(value: object, name: str, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise ProtocolError(f"a record slot's {name} is an integer in 0..{maximum}")
    return value


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
