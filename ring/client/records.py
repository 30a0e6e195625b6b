"""The client's records: small versioned values with compare-and-set on the key's R
preferred peers, read back from the first R reachable replicas (newest version wins).

Neither waits for a silent replica. A compare-and-set returns once W replicas
acknowledged (or so many refused that W cannot be reached); the others finish in the
background. A read returns once R - W + 1 of the preferred replicas answered and agree on
the newest value, after a short grace for the others: every acknowledged write is on W
of the R, so any R - W + 1 of them include one that holds it. When the answers disagree
at the newest version (concurrent writers), the read waits for every replica, so that
the value most replicas hold, the one that won, is what it returns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import xxhash

from ring import api
from ring.client.options import RecordValue
from ring.client.view import Early, LatencyWindow, RingTracker, added_members
from ring.errors import DataUnavailable, PeerRejected, QuorumError, RecordConflict
from ring.placement import Member
from ring.transport import Transport

__all__ = ["RecordIO", "agreed", "newest"]

# A record answer's body: the value, at most RECORD_BYTES_MAX, and its envelope's refs.
RECORD_ANSWER_BYTES_MAX = 2 * api.RECORD_BYTES_MAX


class RecordIO:
    """Records on the ring, through a client's transport and ring view."""

    def __init__(self, transport: Transport, view: RingTracker) -> None:
        self._transport = transport
        self._view = view
        # How long recent record reads and writes took: the grace that the slower
        # replicas get once enough answered.
        self.read_latency = LatencyWindow()
        self.write_latency = LatencyWindow()

    async def _get_record_from(
        self, member: Member, key: str, _hint: Member | None = None
    ) -> RecordValue | None:
        try:
            answer = await self._transport.request(
                member.address,
                api.RECORD_GET.method,
                api.record_path(key),
                body_bytes_max=RECORD_ANSWER_BYTES_MAX,
            )
        except PeerRejected as exc:
            if exc.status == 404 and exc.code == "deleted":
                return RecordValue(key, exc.version, b"", deleted=True)
            if exc.status == 404:
                return None
            raise
        version = api.parse_int(answer.headers.get(api.HEADER_VERSION), api.HEADER_VERSION, 0)
        return RecordValue(key, version, answer.body)

    async def get_record(self, key: str, *, include_deleted: bool = False) -> RecordValue | None:
        """The newest version held by the first R reachable replicas, or None.

        A deleted record reads as None, unless ``include_deleted``: then its tombstone
        (``deleted=True``) comes back, whose version a compare-and-set write expects."""
        view = await self._view.ring()

        def read(member: Member, hint: Member | None) -> Awaitable[RecordValue | None]:
            return self._get_record_from(member, key, hint)

        candidates = view.ring.candidates(key, view.replication)
        preferred = {member.peer_id for member in candidates[: view.replication]}
        quorum = view.replication - view.write_quorum + 1

        def enough(answers: Sequence[tuple[Member, RecordValue | None]], _running: int) -> bool:
            # One answer per distinct preferred peer: a peer asked twice (as itself and
            # as a stand-in) is one copy.
            by_peer = {m.peer_id: value for m, value in answers if m.peer_id in preferred}
            return len(by_peer) >= quorum and agreed(list(by_peer.values()))

        result = await self._view.fan_out(
            candidates,
            view.replication,
            read,
            early=Early(enough, grace_s=self.read_latency.delay_s(), background=False),
            attempt_s=self._view.options.read_attempt_s,
            latency=self.read_latency,
        )
        answers, causes = result.answers, result.causes
        if len(answers) + result.unfinished < view.replication and all(
            value is None for _m, value in answers
        ):
            # Fewer than R peers of the view could answer and none had it: the view may
            # be a part of the ring (``wider_ring``); ask the members a wider one adds.
            wider = await self._view.wider_ring(view)
            if wider is not None:
                others = added_members(view, wider, key)
                more = await self._view.fan_out(
                    others, min(wider.replication - len(answers), len(others)), read
                )
                answers += more.answers
                causes += more.causes
        if not answers:
            raise DataUnavailable([key], causes)
        found = newest([value for _member, value in answers if value is not None])
        if found is not None and found.deleted and not include_deleted:
            return None
        return found

    async def _put_record_to(
        self, member: Member, key: str, body: bytes, expected_version: int, refs: int
    ) -> int:
        try:
            answer = await self._transport.request(
                member.address,
                api.RECORD_PUT.method,
                api.record_cas_path(key, expected_version, refs),
                body=body,
            )
        except PeerRejected as exc:
            if exc.status == 409:
                return -1
            raise
        return api.parse_written_version(answer.json())

    async def put_record(
        self, key: str, value: bytes, *, expected_version: int, refs: Sequence[str] = ()
    ) -> int:
        """Compare-and-set: store ``value`` as ``expected_version + 1`` on W..R replicas.

        Only the key's R preferred peers count (no stand-ins): a stand-in that never held
        the record would accept a stale version. So a write needs W of them reachable;
        after a failure the ring moves records to live peers within the removal grace.
        ``refs`` are the chunk ids the value points at: peers audit that they stay
        available (``chunks_lost``) without parsing values. Raises ``RecordConflict``
        when replicas hold a newer version than expected.
        """
        body = api.record_envelope(refs, value)
        return await self._compare_and_set(
            key,
            expected_version,
            lambda member: self._put_record_to(member, key, body, expected_version, len(refs)),
        )

    async def _compare_and_set(
        self, key: str, expected_version: int, write: Callable[[Member], Awaitable[int]]
    ) -> int:
        """Run ``write`` (its answer: the stored version, -1 for a conflict) on the key's
        preferred peers; ``expected_version + 1`` once W acknowledged."""
        view = await self._view.ring()
        quorum = view.write_quorum

        def settled(answers: Sequence[tuple[Member, int]], running: int) -> bool:
            acks = sum(1 for _member, version in answers if version >= 0)
            return acks >= quorum or acks + running < quorum

        result = await self._view.fan_out(
            view.ring.candidates(key, view.replication),
            view.replication,
            lambda member, _hint: write(member),
            strict=True,
            early=Early(settled, grace_s=self.write_latency.delay_s(), background=True),
            attempt_s=self._view.options.write_attempt_s,
            latency=self.write_latency,
        )
        acks = sum(1 for _member, version in result.answers if version >= 0)
        if acks >= quorum:
            return expected_version + 1
        if any(version < 0 for _member, version in result.answers):
            current = await self.get_record(key, include_deleted=True)
            raise RecordConflict(key, expected_version, current.version if current else 0)
        raise QuorumError(f"record {key!r}", acks, quorum, result.causes)

    async def _delete_record_at(self, member: Member, key: str, expected_version: int) -> int:
        try:
            answer = await self._transport.request(
                member.address,
                api.RECORD_DELETE.method,
                api.record_delete_path(key, expected_version),
            )
        except PeerRejected as exc:
            if exc.status == 409:
                return -1
            raise
        return api.parse_written_version(answer.json())

    async def delete_record(self, key: str, *, expected_version: int) -> int:
        """Compare-and-set delete: a tombstone as ``expected_version + 1`` on W..R of the
        key's preferred peers (as ``put_record``); the tombstone's version."""
        return await self._compare_and_set(
            key,
            expected_version,
            lambda member: self._delete_record_at(member, key, expected_version),
        )

    async def list_records(self, prefix: str = "", *, limit: int = 10_000) -> dict[str, int]:
        """Keys under ``prefix`` with the newest version any reachable peer knows (keys
        whose newest version is a delete left out)."""
        view = await self._view.ring()
        path = api.records_list_path(prefix, limit, include_deleted=True)

        async def one(member: Member, _hint: Member | None) -> list[tuple[str, int, bool]]:
            answer = await self._transport.request(member.address, api.RECORDS_LIST.method, path)
            return api.parse_records_list(answer.json())

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


def agreed(values: Sequence[RecordValue | None]) -> bool:
    """Whether every answer is the same: one version and value, or none holds the record.
    Only then may a read stop at R-W+1 answers. A stale or missing copy among them (a
    replica that missed a write, a new owner the record has not reached yet after a join)
    makes the read wait for every replica: the R-W+1 rule assumes the reader's preferred
    peers are those the write was acknowledged on, which a membership change breaks."""
    return len({None if v is None else (v.version, v.value, v.deleted) for v in values}) <= 1


def newest(values: Sequence[RecordValue]) -> RecordValue | None:
    """The newest version; among equal versions, the value most replicas hold."""
    if not values:
        return None
    top = max(value.version for value in values)
    candidates = [value for value in values if value.version == top]
    counts: dict[bytes, int] = {}
    for value in candidates:
        counts[value.value] = counts.get(value.value, 0) + 1
    best = max(counts, key=lambda value: (counts[value], xxhash.xxh3_64_hexdigest(value)))
    deleted = any(value.deleted and value.value == best for value in candidates)
    return RecordValue(candidates[0].key, top, best, conflict=len(counts) > 1, deleted=deleted)
