"""The client's records: registers decided by consensus on the key's R preferred peers.

Every change is a round of ``ring.client.proposer`` (CASPaxos): a compare-and-set or a
delete is acknowledged only once its value is chosen, and then every later read returns
it or a later value. A read asks the preferred peers for their slots and answers at once
when they show the value chosen (``ring.paxos.chosen_value``); when they disagree (a
round in flight, or one a writer left half done) it runs a round that proposes the state
it found, so that what it returns is chosen too.

Records always use the ring's R and W, whatever a client chose for chunks: quorums of
different sizes need not meet.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ring import api, paxos, records_api
from ring.client.chunks import first_error
from ring.client.options import RecordScan, RecordValue, ScannedRecord
from ring.client.proposer import (
    BACKOFF_S_MAX,
    BACKOFF_S_MIN,
    TRANSIENT_WAIT_S,
    Acceptors,
    Proposer,
    transient_failure,
)
from ring.client.view import RingTracker, RingView
from ring.errors import (
    DataUnavailable,
    PeerError,
    ProtocolError,
    QuorumError,
    RecordConflict,
    RecordUnknown,
)
from ring.paxos import Ballot, Slot, Value
from ring.placement import Member
from ring.transport import Transport

__all__ = ["RecordIO", "ScanVerdict", "scan_verdicts"]

# A read asks again with a refreshed member table at most this many times when an
# acceptor computes other acceptors for the key.
READ_REFRESHES_MAX = 2
# Slot reads one read may take, refreshes and waits for acceptors catching up included.
READ_ATTEMPTS_MAX = 16
# Operation ids, as ``Proposer.new_op`` makes them.
OP_PATTERN = re.compile(r"^[0-9a-f]{24}$")


# Records of one scan read one by one at once, when their acceptors' slots disagree.
SCAN_READS_MAX = 16


@dataclass(frozen=True, slots=True)
class ScanVerdict:
    """What the pages of a scan tell: the records whose acceptors' slots show the value
    chosen (EMPTY ones included, the caller drops them), the keys a read must settle,
    the rolled-up prefixes, and how far the pages reach together."""

    chosen: dict[str, Value]
    undecided: list[str]
    prefixes: list[str]
    truncated: bool
    last: str


def scan_verdicts(
    pages: Mapping[str, records_api.ScanAnswer],
    placement: str,
    acceptors_of: Callable[[str], Acceptors],
) -> ScanVerdict:
    """Judge each key the pages name, from the slots its acceptors reported, as a read
    would (``paxos.chosen_value``). A peer's slot counts only if it places keys as the
    client does (``placement``), covered the key (not past the end of a truncated page),
    and is caught up on it; a peer that lists nothing for a key counts as having
    accepted nothing only when it is settled (else it may not have caught up)."""
    truncated_at = [page.last for page in pages.values() if page.truncated]
    cut = min(truncated_at) if truncated_at else None
    index = {
        peer_id: {record.key: record for record in page.records} for peer_id, page in pages.items()
    }
    keys = sorted({key for held in index.values() for key in held if cut is None or key <= cut})
    chosen: dict[str, Value] = {}
    undecided: list[str] = []
    for key in keys:
        acceptors = acceptors_of(key)
        slots: list[Slot] = []
        for member in acceptors.members:
            page = pages.get(member.peer_id)
            if page is None or page.placement != placement:
                continue
            if page.truncated and key > page.last:
                continue
            record = index[member.peer_id].get(key)
            if record is None:
                if page.settled:
                    slots.append(paxos.NOTHING)
                continue
            if not record.synced:
                continue
            accepted = Ballot.parse(record.accepted) if record.accepted else None
            held = Value(record.version, record.head, (), record.deleted, record.op)
            slots.append(Slot(accepted or paxos.FAST, accepted, held))
        decided = paxos.chosen_value(slots, acceptors.replication, acceptors.write_quorum)
        if decided is None:
            undecided.append(key)
        else:
            chosen[key] = decided
    prefixes = sorted(
        {p for page in pages.values() for p in page.prefixes if cut is None or p <= cut}
    )
    return ScanVerdict(chosen, undecided, prefixes, cut is not None, cut or "")


def _covered(view: RingView, pages: Mapping[str, records_api.ScanAnswer], placement: str) -> bool:
    """Whether every chosen record is in some page: every member answered (a record is
    on W of its acceptors, or on the peers that held it before a join until repair moved
    it, all members), or else every group of peers some key is stored on has
    ``R - W + 1`` members whose page can be trusted to show what they accepted (same
    placement, caught up)."""
    answered = {peer_id for peer_id, page in pages.items() if page.placement == placement}
    if all(member.peer_id in answered for member in view.ring.members):
        return True
    count, write_quorum = view.record_quorums()
    needed = max(1, count - write_quorum + 1)
    trusted = {peer_id for peer_id in answered if pages[peer_id].settled}
    return all(
        len(trusted.intersection(group)) >= needed for group in view.ring.preference_sets(count)
    )


class RecordIO:
    """Records on the ring, through a client's transport and ring view."""

    def __init__(self, transport: Transport, view: RingTracker) -> None:
        self._transport = transport
        self._view = view
        self.proposer = Proposer(transport, view)
        self.rounds_for_reads = 0

    # -- reads --------------------------------------------------------------------------

    async def read_value(self, key: str, *, allow_stale: bool = False) -> tuple[Value, bool]:
        """The register's state, chosen: from the slots when they show it, else by a round
        that proposes what it finds; and whether it is (False: ``allow_stale`` and too few
        acceptors answered for a round, so the value at the highest accepted ballot among
        those that did)."""
        causes: list[str] = []
        refreshes = 0
        deadline = self._view.clock() + TRANSIENT_WAIT_S
        for attempt in range(1, READ_ATTEMPTS_MAX + 1):
            acceptors = await self.proposer.acceptors(key, refreshes)
            slots, failed = await self.proposer.read_slots(key, acceptors)
            causes += failed
            chosen = paxos.chosen_value(slots, acceptors.replication, acceptors.write_quorum)
            if chosen is not None:
                return chosen, True
            if any("409 view" in c or "409 epoch" in c for c in failed):
                refreshes += 1
                if refreshes > READ_REFRESHES_MAX:
                    break
            elif transient_failure(failed) and self._view.clock() < deadline:
                # Acceptors catching up after a membership change answer in moments.
                await asyncio.sleep(min(BACKOFF_S_MAX, BACKOFF_S_MIN * 2**attempt))
            else:
                break
        if not slots:
            raise DataUnavailable([key], causes, kind="record")
        self.rounds_for_reads += 1
        try:
            value, _ok = await self.proposer.run(key, lambda current: (current, True))
        except QuorumError as exc:
            if not allow_stale:
                raise DataUnavailable([key], [*causes, str(exc)], kind="record") from exc
            accepted = [slot for slot in slots if slot.accepted is not None]
            best = max(accepted, key=lambda slot: slot.accepted or paxos.FAST, default=None)
            return (paxos.EMPTY if best is None else best.value), False
        return value, True

    async def get_record(
        self, key: str, *, include_deleted: bool = False, allow_stale: bool = False
    ) -> RecordValue | None:
        """The record's value, or None if it is absent (or deleted).

        A deleted record reads as None, unless ``include_deleted``: then its tombstone
        (``deleted=True``) comes back, whose version a compare-and-set write expects.
        ``allow_stale``: when more than R - W of the key's acceptors are down, answer from
        those that are (``settled=False``: possibly not the last value) instead of
        raising ``DataUnavailable``; recovery reads of values written once use it."""
        value, settled = await self.read_value(key, allow_stale=allow_stale)
        if value.version == 0 or (value.deleted and not include_deleted):
            return None
        return RecordValue(
            key, value.version, value.data, deleted=value.deleted, settled=settled, op=value.op
        )

    # -- changes ------------------------------------------------------------------------

    async def _compare_and_set(self, key: str, expected_version: int, new: Value) -> int:
        """Choose ``new`` if the record's version is ``expected_version``."""
        if not 0 <= expected_version < api.VERSION_MAX:
            raise ProtocolError(f"an expected version is an integer in 0..{api.VERSION_MAX - 1}")
        if len(new.data) > api.RECORD_BYTES_MAX:
            raise ProtocolError(
                f"record value of {len(new.data)} bytes is above {api.RECORD_BYTES_MAX}"
            )
        op = new.op

        def step(current: Value) -> tuple[Value, bool]:
            if current.op == op:
                return current, True
            if current.version == expected_version:
                return new, True
            return current, False

        chosen, ok = await self.proposer.run(
            key, step, create=new if expected_version == 0 else None
        )
        if ok:
            return chosen.version
        # The register takes each version once: another value chosen at exactly the
        # version this write proposed means it lost; only a later one hides whether this
        # write took effect first.
        if self.proposer.exposed and chosen.version > expected_version + 1:
            raise RecordUnknown(
                f"record {key!r}: the write of version {expected_version + 1} was interrupted "
                f"and version {chosen.version} is now chosen; it may or may not have taken effect"
            )
        raise RecordConflict(key, expected_version, chosen.version)

    async def put_record(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int,
        refs: Sequence[str] = (),
        op: str | None = None,
    ) -> int:
        """Compare-and-set: store ``value`` as ``expected_version + 1``, once chosen.

        ``refs`` are the chunk ids the value points at: peers audit that they stay
        available (``chunks_lost``) and keep them from collection, without parsing values.
        ``op`` names the operation (24 lowercase hex digits, fresh when None): a caller
        that retries an operation whose outcome it lost passes the same one, and finds
        it in ``RecordValue.op`` if it took effect.
        Raises ``RecordConflict`` when another version is chosen (the current one named).
        """
        records_api.record_envelope(refs, b"")  # refs must be chunk ids
        new = Value(expected_version + 1, value, tuple(refs), False, self._op(op))
        return await self._compare_and_set(key, expected_version, new)

    async def delete_record(self, key: str, *, expected_version: int, op: str | None = None) -> int:
        """Compare-and-set delete: a tombstone as ``expected_version + 1``; its version."""
        new = Value(expected_version + 1, b"", (), True, self._op(op))
        return await self._compare_and_set(key, expected_version, new)

    def _op(self, op: str | None) -> str:
        if op is None:
            return self.proposer.new_op()
        if OP_PATTERN.fullmatch(op) is None:
            raise ProtocolError("an operation id is 24 lowercase hex digits")
        return op

    async def scan_records(
        self, prefix: str, *, limit: int = api.LIST_LIMIT_MAX, after: str = "",
        delimiter: bool = False, head_bytes: int = 0, include_deleted: bool = False,
        allow_stale: bool = False,
    ) -> RecordScan:  # fmt: skip
        """The records under ``prefix`` past ``after``, each as chosen, with the first
        ``head_bytes`` of its value: one request per peer, where listing and reading each
        record would cost a read of R acceptors per record. Every peer answers with its
        slots; a record whose acceptors' slots show its value chosen (as a read would
        see them) is taken from them, and the others are read one by one (a round when
        needed), so every record is what a read would have returned. With
        ``delimiter``, keys with a "/" past the prefix come back rolled up into
        ``prefixes``.

        A record held by none of the peers that answered cannot be seen, so a scan
        needs, for every group of peers some key is stored on, ``R - W + 1`` of them to
        answer, caught up: else ``DataUnavailable``, as a read of such a key would raise.
        ``allow_stale`` answers anyway (``complete=False``), and reads records whose
        acceptors disagree as ``get_record(allow_stale=True)`` does."""
        if not 0 < limit <= api.LIST_LIMIT_MAX:
            raise ProtocolError(f"a scan takes 1..{api.LIST_LIMIT_MAX} records at a time")
        view = await self._view.ring()
        path = records_api.records_scan_path(
            prefix, limit, after=after, delimiter=delimiter, head_bytes=head_bytes
        )

        async def one(member: Member, _hint: Member | None) -> records_api.ScanAnswer:
            answer = await self._transport.request(member.address, api.RECORDS_LIST.method, path)
            try:
                return records_api.parse_scan_answer(answer.json(), limit)
            except ProtocolError as exc:  # a peer of another version, say: not an answer
                raise PeerError(member.address, f"unusable scan page: {exc}") from exc

        result = await self._view.fan_out(
            view.ring.members, len(view.ring), one, attempt_s=self._view.options.list_attempt_s
        )
        pages = {member.peer_id: page for member, page in result.answers}
        placement = paxos.placement_digest(view.ring.members)
        complete = _covered(view, pages, placement)
        if not complete and not allow_stale:
            raise DataUnavailable(
                [prefix], ["too few peers answered the scan", *result.causes], kind="prefix"
            )
        verdict = scan_verdicts(pages, placement, lambda key: Acceptors.of(view, key))
        found = {key: (value, True) for key, value in verdict.chosen.items()}
        slots = asyncio.Semaphore(SCAN_READS_MAX)

        async def read(key: str) -> None:
            async with slots:
                found[key] = await self.read_value(key, allow_stale=allow_stale)

        try:
            async with asyncio.TaskGroup() as group:
                for key in verdict.undecided:
                    group.create_task(read(key))
        except BaseExceptionGroup as group_error:
            raise first_error(group_error) from None
        records = [
            ScannedRecord(
                key, value.version, value.data[:head_bytes], value.deleted, value.op, settled
            )
            for key, (value, settled) in sorted(found.items())
            if value.version > 0 and (include_deleted or not value.deleted)
        ]
        return RecordScan(
            records, verdict.prefixes, verdict.truncated, verdict.last, len(verdict.undecided),
            complete,
        )  # fmt: skip

    async def list_records(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, int]:
        """Keys under ``prefix`` with the newest version any reachable peer knows (keys
        whose newest version is a delete left out)."""
        view = await self._view.ring()
        path = records_api.records_list_path(prefix, limit, include_deleted=True)

        async def one(member: Member, _hint: Member | None) -> list[tuple[str, int, bool]]:
            answer = await self._transport.request(member.address, api.RECORDS_LIST.method, path)
            return records_api.parse_records_list(answer.json())

        result = await self._view.fan_out(
            view.ring.members,
            len(view.ring),
            one,
            attempt_s=self._view.options.list_attempt_s,
        )
        found: dict[str, tuple[int, bool]] = {}
        for _member, entries in result.answers:
            for key, version, deleted in entries:
                seen = (version, deleted)
                found[key] = max(found.get(key, seen), seen)
        live = {key: version for key, (version, deleted) in found.items() if not deleted}
        return dict(sorted(live.items())[:limit])
