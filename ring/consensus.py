"""The peer's side of record rounds: an acceptor that knows which keys it answers for.

``ring.paxos`` has the rules and ``ring.records`` keeps the slots; this module adds what
a peer in a changing ring must check before it applies them.

**Whose round it is.** A proposer names the key's acceptors it computed (``view``: a
digest of the R preferred peer ids). An acceptor that computes other acceptors refuses
(409 ``view``): one of the two has a stale member table, and quorums drawn from two
different sets of peers need not meet. The proposer refreshes its table and retries.

**New owners catch up before they answer.** After a membership change a peer may be
preferred for keys whose slots are elsewhere (a join, a leave, a removal after the
grace); an empty slot there would count as a promise that never accepted anything and
could hide a chosen value. So for ``sync_window_s`` after a placement under which it was
not one of a key's acceptors, and after its own start unless it knows it was away too
briefly to be replaced (``start_known``), the first round that touches such a key here
first asks the peers that answered for it (that placement's acceptors; after a start,
the key's other candidates now: the other acceptors and the next peer in the walk, which
held the key before a join) for their slots and merges them (``RecordStore.merge``). It
needs a majority of each group (of its full size) that compute the same acceptors as it
does: those refuse proposers that still use the old ones, so no value can be chosen
among the old acceptors afterwards without one of them. Until it has them, it answers
503 ``syncing`` and the proposer counts it as unavailable. After the window, repair has
moved slots to their new owners (it pushes them as accepts, ``RecordStore.accept``).
Sooner, as a rule: every member catches up on all its keys in the background after each
epoch (``ring.settle``), and once every member announced it, the rings before that
epoch leave the history (``settled_epoch``).

Where this stops: more than a minority of a key's previous acceptors lost at once leaves
a new owner unable to catch up (it answers 503 ``syncing`` until enough come back).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ring import api, paxos, records_api
from ring.cluster import Configuration
from ring.errors import ProtocolError, SR3Error
from ring.membership import MemberTable
from ring.paxos import Ballot, Preempted, Slot, Value
from ring.placement import Member, Ring
from ring.records import RECORD_BYTES_MAX, RecordStore
from ring.transport import Transport

__all__ = [
    "Acceptor", "AcceptorSettings", "EpochMismatch", "RoundView", "Syncing", "ViewMismatch",
]  # fmt: skip

log = logging.getLogger(__name__)

# Keys remembered as caught up since the last placement change; past it, a key catches
# up again on its next round (correct, only slower).
SYNCED_KEYS_MAX = 65_536
SYNC_ATTEMPT_S = 2.0
# Rings a peer remembers from the window (a flapping membership beyond this counts as
# unknown).
RINGS_REMEMBERED_MAX = 16


class ViewMismatch(SR3Error):
    """A proposer computed other acceptors for a key than this peer did (409 ``view``)."""


class EpochMismatch(SR3Error):
    """A round planned under another configuration epoch than this peer's (409 ``epoch``,
    naming this peer's): the proposer refreshes its member table, or waits for this
    peer to learn the newer one, and retries."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class RoundView:
    """What a round's message says it was planned with: the digest of the key's
    acceptors, and the configuration epoch (None: a probe that does not say)."""

    digest: str
    epoch: int | None = None


class Syncing(SR3Error):
    """This peer could not yet catch up on a key it newly answers for (503 ``syncing``)."""


@dataclass(frozen=True, slots=True)
class AcceptorSettings:
    # Acceptors per record (``paxos.record_group``: 2R - 1), capped by the ring's size.
    group: int
    vnodes: int
    zone_aware: bool
    sync_window_s: float


class Acceptor:
    def __init__(
        self,
        me: str,
        records: RecordStore,
        table: Callable[[], MemberTable],
        transport: Transport,
        settings: AcceptorSettings,
        clock: Callable[[], float],
        *,
        history: Sequence[Configuration | None] = (),
        epoch: Callable[[], int] = lambda: 0,
        settled_epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        self._me = me
        self._records = records
        self._table = table
        self._transport = transport
        self._settings = settings
        self._clock = clock
        # The configuration epoch this peer is at (``ring.metadata``).
        self._epoch = epoch
        placement = table().placement()
        self._placement: tuple[Member, ...] | None = placement or None
        self._ring: Ring | None = self._build(placement) if placement else None
        # The rings that were current within the window, with when they stopped being
        # and the last epoch they stand for (None: unknown, epochs this peer missed).
        # ``history``: the configurations that stopped being current within the window
        # before this peer started (their window starts again now: their catch-ups may
        # not have finished). ``settled_epoch``: every member caught up on every record
        # at that epoch (``ring.settle``), so the rings of the epochs before are done.
        self._settled_epoch = settled_epoch
        self._history: list[tuple[float, Ring | None, int]] = [
            (clock(), None, 0) if config is None
            else (clock(), self._build(config.members), config.epoch)
            for config in history
        ]  # fmt: skip
        self._synced: set[str] = set()
        self._syncing: dict[str, asyncio.Lock] = {}
        self.syncs = 0
        # The epoch at which this peer caught up on every key it answers for
        # (``ring.settle``): no key needs catching up while it stays the epoch.
        self.covered_epoch = -1

    # -- who answers for a key ----------------------------------------------------------

    def _build(self, members: Sequence[Member]) -> Ring:
        settings = self._settings
        return Ring.build(members, vnodes=settings.vnodes, zone_aware=settings.zone_aware)

    def ring(self) -> Ring:
        placement = self._table().placement()
        if self._ring is None or placement != self._placement:
            self._placement = placement
            self._ring = self._build(placement)
        return self._ring

    def learned(self, config: Configuration, gap: bool) -> None:
        """A configuration was learned (``ring.metadata``, in epoch order): the ring
        before it joins the window's history (None when epochs between were missed:
        what they placed is unknown), so keys this peer gains are caught up on."""
        if self._ring is not None and self._placement:
            # The ring of the configuration before (``ring()`` would already place with
            # the table's, which is the new one).
            self._history.append((self._clock(), None if gap else self._ring, config.epoch - 1))
            if len(self._history) > RINGS_REMEMBERED_MAX:
                # Too many changes to keep each ring: forget them as unknown, so every
                # key is caught up on (slower, never wrong).
                self._history = [(self._clock(), None, config.epoch - 1)]
            self._synced.clear()
        self._placement = config.members
        self._ring = self._build(config.members)

    def preferred(self, key: str) -> tuple[str, ...]:
        members = self.ring().preference_list(key, self._settings.group)
        return tuple(member.peer_id for member in members)

    def digest(self, key: str) -> str:
        return paxos.view_digest(self.preferred(key))

    def placement_digest(self) -> str:
        """Names the member set this peer places keys with (``paxos.placement_digest``):
        a scan's client trusts this peer's slots only when it places keys alike."""
        self.ring()
        assert self._placement is not None
        return paxos.placement_digest(self._placement)

    def history(self) -> list[Ring | None]:
        """The rings within the window that may have placed keys elsewhere, oldest
        first (None: epochs this peer missed or a time it was not running)."""
        self.ring()
        horizon = self._clock() - self._settings.sync_window_s
        settled = self._settled_epoch()
        self._history = [
            (at, ring, epoch) for at, ring, epoch in self._history
            if at >= horizon and epoch >= settled
        ]  # fmt: skip
        return [ring for _at, ring, _epoch in self._history]

    def cover(self, epoch: int) -> None:
        """Every key this peer answers for at ``epoch`` was caught up on (``ring.settle``)."""
        self.covered_epoch = epoch

    def settled(self) -> bool:
        """Whether this peer holds what it should for every key it answers for (no
        catch-up pending for any key: it caught up at this epoch, or no ring within
        the window placed keys elsewhere and it did not start within it unless it knew
        it was away briefly)."""
        return not self.history() or self.covered_epoch == self._epoch()

    def _check_view(self, key: str, view: RoundView) -> None:
        epoch = self._epoch()
        if view.epoch is not None and view.epoch != epoch:
            raise EpochMismatch(
                f"record {key!r}: a round of configuration epoch {view.epoch} reached a peer "
                f"at epoch {epoch}; refresh the member table and retry",
                epoch,
            )
        preferred = self.preferred(key)
        if paxos.view_digest(preferred) != view.digest or self._me not in preferred:
            raise ViewMismatch(
                f"record {key!r}: this peer's member table names other acceptors "
                f"({', '.join(preferred)}); refresh the member table and retry"
            )

    # -- catching up --------------------------------------------------------------------

    def needs_catch_up(self, key: str) -> bool:
        """Whether this peer may hold less than it should for ``key``: a ring current
        within the window (or a time it was not running) had other acceptors for it."""
        if self.settled() or key in self._synced:
            return False
        return bool(self._sources(key))

    async def catch_up(self, key: str) -> None:
        """Catch up on ``key`` if it needs it (``Syncing`` if enough peers do not answer)."""
        if not self.needs_catch_up(key):
            return
        lock = self._syncing.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if self.needs_catch_up(key):
                    await self._catch_up(key)
        finally:
            if not lock.locked() and self._syncing.get(key) is lock:
                del self._syncing[key]

    def _sources(self, key: str) -> list[tuple[Member, ...]]:
        """The peer groups this peer must hear from to catch up on ``key``: for each ring
        of the window under which the key had other acceptors than now, those acceptors
        (all of them, removed ones too: they may still answer); for a time it was not
        running, the key's other candidates now (the other acceptors and the next peer
        in the walk, which held the key before a join).

        Every acceptor of a key whose group changed catches up, the ones that stay in
        it too: a value chosen by a majority of a larger group can sit on a minority of
        the smaller one (5 acceptors shrinking to 3 keeps as few as one of the three
        that accepted it), so a majority of the new group could otherwise choose over
        it."""
        size = self._settings.group
        current = {m.peer_id for m in self.ring().preference_list(key, size)}
        groups: list[tuple[Member, ...]] = []
        for ring in self.history():
            if ring is None:
                others = [m for m in self.ring().walk(key) if m.peer_id != self._me]
                if others:
                    groups.append(tuple(others[:size]))
                continue
            acceptors = ring.preference_list(key, size)
            if {m.peer_id for m in acceptors} != current:
                groups.append(acceptors)
        return groups

    async def _catch_up(self, key: str) -> None:
        """Merge the slots of a majority of each source group that compute the same
        acceptors as this peer; as soon as every group has them, without waiting on the
        slower ones. A majority of the group's full size, never of the members still up
        or still in the ring: a value chosen there is on a majority of it, and only a
        majority is sure to meet that one."""
        mine = self.digest(key)
        groups = self._sources(key)
        needed = [({m.peer_id for m in group}, paxos.majority(len(group))) for group in groups]
        members = {m.peer_id: m for group in groups for m in group if m.peer_id != self._me}
        # A peer that announced ``left`` handed every slot over to all of the key's
        # acceptors after it (this peer among them, or their group is a source too): it
        # counts as having answered, with nothing this peer lacks.
        table = self._table()
        handed_over = {p for p in members if table.entry(p) and table.liveness(p) == "left"}
        asked = sorted(members.keys() - handed_over)

        async def ask(member: Member) -> Slot | None:
            try:
                answer = await self._transport.request(
                    member.address,
                    api.RECORD_GET.method,
                    records_api.record_raw_path(key),
                    body_bytes_max=paxos.SLOT_BYTES_MAX,
                )
                # Counted only from a peer at this peer's epoch: it refuses rounds of
                # the epochs before, so nothing can be chosen without it afterwards.
                if answer.headers.get(api.HEADER_VIEW) != mine or answer.headers.get(
                    api.HEADER_EPOCH
                ) != str(self._epoch()):
                    return None
                slot, _meta = paxos.decode_slot(answer.body, RECORD_BYTES_MAX)
            except (SR3Error, ProtocolError) as exc:
                log.info("catching up on %s: %s gave no slot: %s", key, member.peer_id, exc)
                return None
            return slot

        slots: dict[str, Slot] = {}

        def satisfied() -> bool:
            # This peer's own slot counts for a group it was in: merging keeps it.
            answered = slots.keys() | handed_over | {self._me}
            return all(len(group & answered) >= count for group, count in needed)

        tasks = {asyncio.create_task(ask(members[peer_id])): peer_id for peer_id in asked}
        try:
            async with asyncio.timeout(SYNC_ATTEMPT_S):
                pending = set(tasks)
                while pending and not satisfied():
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        if (slot := task.result()) is not None:
                            slots[tasks[task]] = slot
        except TimeoutError:
            pass
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if not satisfied():
            raise Syncing(
                f"record {key!r}: this peer newly answers for it and could not yet hear "
                f"from enough of the peers that answered for it before; retry"
            )
        await self._records.merge(key, list(slots.values()))
        self.syncs += 1
        if len(self._synced) < SYNCED_KEYS_MAX:
            self._synced.add(key)

    # -- the acceptor's messages --------------------------------------------------------

    async def read(self, key: str, view: RoundView | None) -> Slot:
        """This peer's slot for a proposer (``view`` given: caught up first) or for a
        peer catching up (``view`` None: as it is, never waiting on others)."""
        if view is not None:
            self._check_view(key, view)
            await self.catch_up(key)
        return await self._records.slot(key)

    async def prepare(self, key: str, ballot: Ballot, view: RoundView) -> Slot | Preempted:
        self._check_view(key, view)
        await self.catch_up(key)
        return await self._records.prepare(key, ballot)

    async def accept(
        self, key: str, ballot: Ballot, value: Value, following: Ballot | None, view: RoundView
    ) -> Slot | Preempted:
        self._check_view(key, view)
        await self.catch_up(key)
        return await self._records.accept(key, ballot, value, following)
