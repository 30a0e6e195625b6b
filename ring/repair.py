"""Self-healing: re-replication, hinted handoff, collection of extra copies, audits.

Each peer runs rounds every ``interval_s``. A round looks at every chunk and record the
peer holds, under the placement its member table gives now:

1. asks the live peers that should also hold them which ones they have
   (``POST /v1/chunks/exists`` and ``/v1/records/versions``, batched);
2. applies ``ring.repair_plan``: the coordinator of each chunk pushes copies to live
   preference members that lack it, hinted chunks go to their peer first, and an extra
   copy is deleted once all R preference members are alive and hold it;
3. audits the records it coordinates: a chunk a record references that no live peer
   holds is counted as lost.

Pushes go through a token bucket (``rate_bytes_s``) with at most ``transfers_max`` in
flight, and each waits (up to ``ForegroundGate.WAIT_S_MAX``) for a pause in this peer's
foreground reads, so that those are not starved. The figures of the last finished round
(under-replicated and lost chunks, bytes moved) are what ``/v1/info`` and ``sr3 status``
report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ring import api, paxos, records_api
from ring.chunkstore import ChunkStore
from ring.errors import ChunkCorrupt, ProtocolError, SR3Error
from ring.hints import HintStore
from ring.loops import run_periodic
from ring.membership import MemberTable
from ring.paxos import Ballot
from ring.placement import Member, Ring
from ring.ratelimit import ForegroundGate, TokenBucket
from ring.records import RecordStore
from ring.repair_plan import plan_chunk, plan_record
from ring.transport import Transport

__all__ = ["RepairSettings", "Repairer", "RoundReport"]

log = logging.getLogger(__name__)

BATCH_IDS_MAX = api.EXISTS_IDS_MAX
BATCH_KEYS_MAX = api.LIST_LIMIT_MAX  # record keys per versions query
PUSH_BATCH_MAX = 64

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RepairSettings:
    replication: int
    vnodes: int
    zone_aware: bool
    interval_s: float = 10.0
    rate_bytes_s: float = 64e6
    transfers_max: int = 2
    # A chunk or record written here less than this long ago is not pushed yet: the
    # writer sent it to the other replicas at the same time, and those copies may still
    # be on their way (pushing it would send a second copy of each). The next round
    # pushes what is still missing then.
    settle_s: float = 2.0

    @property
    def record_group(self) -> int:
        """Acceptors per record (``paxos.record_group``)."""
        return paxos.record_group(self.replication)


@dataclass(slots=True)
class RoundReport:
    started_at: float = 0.0
    finished_at: float = 0.0
    chunks_checked: int = 0
    chunks_under_replicated: int = 0
    chunks_lost: int = 0
    records_under_replicated: int = 0
    chunks_pushed: int = 0
    bytes_pushed: int = 0
    extra_copies_deleted: int = 0
    hints_delivered: int = 0
    # Pushes left to the next round: the chunk or record was written here less than
    # ``settle_s`` ago.
    pushes_deferred: int = 0
    failures: int = 0
    lost_examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


class Repairer:
    def __init__(
        self,
        me: str,
        table: MemberTable,
        chunks: ChunkStore,
        records: RecordStore,
        hints: HintStore,
        transport: Transport,
        settings: RepairSettings,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
        foreground: ForegroundGate | None = None,
    ) -> None:
        self.me = me
        self._foreground = foreground
        self.table = table
        self.chunks = chunks
        self.records = records
        # The configuration epoch this peer is at: its pushes are rounds' accepts, bound
        # to it like a proposer's (set by ``ring.node``).
        self.epoch: Callable[[], int] = lambda: 0
        self.hints = hints
        self._transport = transport
        self.settings = settings
        self._clock = clock  # monotonic: pacing and the rate limit
        # Reports stamp rounds with unix time: read by other processes (sr3 status).
        self._wall_clock = wall_clock
        self._bucket = TokenBucket(settings.rate_bytes_s, 8 * 1024 * 1024, clock)
        self._slots = asyncio.Semaphore(settings.transfers_max)
        self.last: RoundReport | None = None
        self.rounds = 0
        self.totals = RoundReport()

    def ring(self) -> Ring:
        return Ring.build(
            self.table.placement(), vnodes=self.settings.vnodes, zone_aware=self.settings.zone_aware
        )

    async def run(self) -> None:
        """A round every ``interval_s``, the first one interval after start: a peer that
        just (re)joined lets its member table settle before it copies or deletes."""
        await run_periodic(
            "repair",
            self.round,
            self.settings.interval_s,
            first_at_once=False,
            tolerated=(SR3Error,),
            clock=self._clock,
        )

    async def round(self) -> RoundReport:
        report = RoundReport(started_at=self._wall_clock())
        ring = self.ring()
        live = set(self.table.live())
        if self.table.liveness(self.me) == "leaving":
            # A leaving peer is out of placement but still coordinates copies only it
            # holds: without this nobody pushes them (the extras rule picks live peers).
            live.add(self.me)
        members = {member.peer_id: member for member in ring.members}
        await self._deliver_hints(members, live, report)
        await self._repair_chunks(ring, members, live, report)
        await self._repair_records(ring, members, live, report)
        report.finished_at = self._wall_clock()
        self.last = report
        self.rounds += 1
        self._accumulate(report)
        return report

    def _accumulate(self, report: RoundReport) -> None:
        for name in (
            "chunks_pushed", "bytes_pushed", "extra_copies_deleted", "hints_delivered",
            "pushes_deferred",
        ):  # fmt: skip
            setattr(self.totals, name, getattr(self.totals, name) + getattr(report, name))

    # -- asking peers -------------------------------------------------------------------

    async def _ask(
        self, member: Member, route: api.Route, items: list[str], batch_max: int,
        request: Callable[[list[str]], bytes], parse: Callable[[Any], Iterable[_T]], what: str,
    ) -> list[_T] | None:  # fmt: skip
        """What ``member`` answers ``route`` about ``items`` (``parse`` of each answer),
        asked in batches of at most ``batch_max``; None if it did not answer them all."""
        found: list[_T] = []
        for start in range(0, len(items), batch_max):
            try:
                answer = await self._transport.request(
                    member.address,
                    route.method,
                    route.pattern,
                    body=request(items[start : start + batch_max]),
                )
                found.extend(parse(answer.json()))
            except (SR3Error, KeyError, TypeError, ValueError, AttributeError) as exc:
                log.info("repair: %s did not say %s: %s", member.peer_id, what, exc)
                return None
        return found

    async def _which_have(self, member: Member, ids: list[str]) -> set[str] | None:
        """The subset of ``ids`` that ``member`` holds, or None if it did not answer."""
        found = await self._ask(
            member, api.CHUNKS_EXIST, ids, BATCH_IDS_MAX, api.exists_request,
            api.parse_exists_answer, "which chunks it holds",
        )  # fmt: skip
        return None if found is None else set(found)

    async def _holders(
        self, wanted: Mapping[str, Collection[str]], members: Mapping[str, Member],
        live: set[str],
    ) -> dict[str, set[str]]:  # fmt: skip
        """For each chunk id, the live peers (of those asked) that hold it; peers that do
        not answer are dropped from ``live`` for the rest of the round."""
        asked: dict[str, list[str]] = {}
        for chunk_id, peers in wanted.items():
            for peer_id in peers:
                if peer_id != self.me and peer_id in live and peer_id in members:
                    asked.setdefault(peer_id, []).append(chunk_id)
        holders: dict[str, set[str]] = {chunk_id: set() for chunk_id in wanted}
        async with asyncio.TaskGroup() as group:
            tasks = {
                peer_id: group.create_task(self._which_have(members[peer_id], ids))
                for peer_id, ids in asked.items()
            }
        for peer_id, task in tasks.items():
            present = task.result()
            if present is None:
                live.discard(peer_id)
                continue
            for chunk_id in present:
                if chunk_id in holders:
                    holders[chunk_id].add(peer_id)
        return holders

    # -- chunks -------------------------------------------------------------------------

    async def _push_chunk(self, chunk_id: str, member: Member, report: RoundReport) -> bool:
        async with self._slots:
            try:
                stored = await self.chunks.get(chunk_id)
            except ChunkCorrupt:
                report.failures += 1
                return False
            if stored is None:
                return False
            if self._foreground is not None:
                await self._foreground.quiet()
            await self._bucket.acquire(len(stored))
            try:
                await self._transport.request(
                    member.address, api.CHUNK_PUT.method, api.chunk_path(chunk_id), body=stored
                )
            except SR3Error as exc:
                log.info("repair: pushing %s to %s failed: %s", chunk_id, member.peer_id, exc)
                report.failures += 1
                return False
        report.chunks_pushed += 1
        report.bytes_pushed += len(stored)
        return True

    async def _deliver_hints(
        self, members: Mapping[str, Member], live: set[str], report: RoundReport
    ) -> None:
        due = [(c, p) for c, p in self.hints.pending() if p in live and p in members]
        if not due:
            return

        async def deliver(chunk_id: str, peer_id: str) -> None:
            if not self.chunks.has(chunk_id) or await self._push_chunk(
                chunk_id, members[peer_id], report
            ):
                await self.hints.remove(chunk_id, peer_id)
                report.hints_delivered += 1

        for start in range(0, len(due), PUSH_BATCH_MAX):
            async with asyncio.TaskGroup() as group:
                for chunk_id, peer_id in due[start : start + PUSH_BATCH_MAX]:
                    group.create_task(deliver(chunk_id, peer_id))

    async def _repair_chunks(
        self, ring: Ring, members: Mapping[str, Member], live: set[str], report: RoundReport
    ) -> None:
        replication = self.settings.replication
        preference = {
            chunk_id: tuple(m.peer_id for m in ring.preference_list(chunk_id, replication))
            for chunk_id in self.chunks.ids()
        }
        holders = await self._holders(preference, members, live)
        report.chunks_checked = len(preference)
        pushes: list[tuple[str, Member]] = []
        for chunk_id, wanted in preference.items():
            action = plan_chunk(self.me, wanted, holders[chunk_id] | {self.me}, live, replication)
            report.chunks_under_replicated += action.under_replicated
            if action.push_to and self.chunks.stored_within(chunk_id, self.settings.settle_s):
                report.pushes_deferred += len(action.push_to)
            else:
                pushes.extend((chunk_id, members[peer_id]) for peer_id in action.push_to)
            if action.delete_local and await self.chunks.delete(chunk_id):
                report.extra_copies_deleted += 1
        # In batches, so that the tasks alive at once stay bounded however much moves.
        for start in range(0, len(pushes), PUSH_BATCH_MAX):
            async with asyncio.TaskGroup() as group:
                for chunk_id, member in pushes[start : start + PUSH_BATCH_MAX]:
                    group.create_task(self._push_chunk(chunk_id, member, report))

    # -- records ------------------------------------------------------------------------

    async def _ballots(self, member: Member, keys: list[str]) -> dict[str, str] | None:
        """The ballot ``member`` accepted each of ``keys`` at (absent: none), or None if
        it did not answer."""
        found = await self._ask(
            member, api.RECORD_VERSIONS, keys, BATCH_KEYS_MAX, records_api.versions_request,
            lambda answer: records_api.parse_ballots_answer(answer).items(),
            "which record ballots it holds",
        )  # fmt: skip
        return None if found is None else dict(found)

    async def _repair_records(
        self, ring: Ring, members: Mapping[str, Member], live: set[str], report: RoundReport
    ) -> None:
        """Bring the key's acceptors up to the value accepted at the highest ballot: a
        holder of it sends it as an accept at that ballot (``RecordStore.accept``), which
        an acceptor takes only if it promised nothing higher, as if the proposer's own
        accept had arrived late. Slots are compared by accepted ballot (``_ranks``)."""
        # A ring smaller than the group gives every record all of its members.
        group = min(self.settings.record_group, len(ring))
        keys = self.records.keys()
        preference = {
            key: tuple(m.peer_id for m in ring.preference_list(key, group)) for key in keys
        }
        asked: dict[str, list[str]] = {}
        for key, peers in preference.items():
            for peer_id in peers:
                if peer_id != self.me and peer_id in live:
                    asked.setdefault(peer_id, []).append(key)
        ballots: dict[str, dict[str, Ballot | None]] = {
            key: {self.me: _own_ballot(self.records.accepted(key))} for key in keys
        }
        # All peers at once, as for chunks: a slow peer costs the round its own timeout,
        # not one per peer asked after it.
        async with asyncio.TaskGroup() as queries:
            tasks = {
                peer_id: queries.create_task(self._ballots(members[peer_id], peer_keys))
                for peer_id, peer_keys in asked.items()
            }
        for peer_id, peer_keys in asked.items():
            answer = tasks[peer_id].result()
            if answer is None:
                live.discard(peer_id)
                continue
            for key in peer_keys:
                ballots[key][peer_id] = _parse_ballot(answer.get(key))
        versions = {key: _ranks(held) for key, held in ballots.items()}
        for key in keys:
            if versions[key][self.me] <= 0:
                # A bare promise, no value: it means something only on an acceptor.
                if self.me not in preference[key]:
                    await self.records.delete_local(key)
                continue
            action = plan_record(self.me, preference[key], versions[key], live, group)
            report.records_under_replicated += bool(action.push_to)
            if action.push_to and self.records.changed_within(key, self.settings.settle_s):
                report.pushes_deferred += len(action.push_to)
                continue
            for peer_id in action.push_to:
                await self._push_record(key, preference[key], members[peer_id], report)
            if action.delete_local:
                await self.records.delete_local(key)
        await self._audit_refs(ring, members, live, preference, versions, report)

    async def _push_record(
        self, key: str, preferred: tuple[str, ...], member: Member, report: RoundReport
    ) -> None:
        slot = await self.records.slot(key)
        if slot.accepted is None:
            return
        try:
            answer = await self._transport.request(
                member.address,
                api.PAXOS_ACCEPT.method,
                records_api.accept_path(
                    key,
                    slot.accepted.wire(),
                    paxos.view_digest(preferred),
                    epoch=self.epoch(),
                ),
                body=paxos.encode_slot(slot),
                ok=(200, 409),
            )
        except SR3Error as exc:
            log.info("repair: pushing record %s to %s failed: %s", key, member.peer_id, exc)
            report.failures += 1
            return
        if answer.status == 409:
            # A round at a higher ballot is under way there (or its member table differs):
            # that round, or the next repair, settles the key.
            log.info("repair: %s did not take record %s: %s", member.peer_id, key,
                     api.parse_error(answer.body).message)  # fmt: skip

    async def _audit_refs(
        self, ring: Ring, members: Mapping[str, Member], live: set[str],
        preference: Mapping[str, tuple[str, ...]], versions: Mapping[str, Mapping[str, int]],
        report: RoundReport,
    ) -> None:  # fmt: skip
        """Count chunks referenced by the records this peer coordinates that no live peer
        holds. The coordinator of a record is its first live preference member holding
        the newest version."""
        referenced: set[str] = set()
        for key, wanted in preference.items():
            newest = max(versions[key].values())
            coordinator = next(
                (p for p in wanted if p in live and versions[key].get(p, 0) == newest), None
            )
            if coordinator == self.me:
                referenced.update((await self.records.slot(key)).value.refs)
        missing = {chunk_id for chunk_id in referenced if not self.chunks.has(chunk_id)}
        if not missing:
            return
        everyone = {chunk_id: tuple(sorted(live)) for chunk_id in missing}
        holders = await self._holders(everyone, members, set(live))
        lost = sorted(chunk_id for chunk_id in missing if not holders[chunk_id])
        report.chunks_lost = len(lost)
        report.lost_examples = lost[:10]


def _own_ballot(accepted: tuple[Ballot, str] | None) -> Ballot | None:
    return None if accepted is None else accepted[0]


def _parse_ballot(text: str | None) -> Ballot | None:
    if text is None:
        return None
    try:
        return Ballot.parse(text)
    except ProtocolError:
        return None


def _ranks(held: Mapping[str, Ballot | None]) -> dict[str, int]:
    """Each peer's accepted ballot as a rank (0: none accepted), for ``plan_record``,
    which compares versions: a higher ballot is a newer state of the register."""
    order = sorted({ballot for ballot in held.values() if ballot is not None})
    rank = {ballot: index + 1 for index, ballot in enumerate(order)}
    return {peer: 0 if ballot is None else rank[ballot] for peer, ballot in held.items()}
