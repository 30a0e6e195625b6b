"""Heartbeats and member-table gossip over the peers' HTTP API.

Every ``interval_s`` a peer advances its own heartbeat and exchanges its whole member
table with up to ``fanout`` peers chosen with a seeded generator (``POST /v1/gossip``):
each side merges what the other knows. A peer that knows nobody yet (it is joining)
gossips with its seeds and with the contacts the Kademlia overlay found. Tables are
bounded (``MEMBERS_MAX`` entries), so are requests (timeouts) and rounds (``fanout``).

Exchanges run alongside the beat, at most one per peer at a time: a peer that accepts
connections but never answers (frozen, SIGSTOPped) costs one exchange timeout in the
background. Waiting for it would slow this peer's own heartbeat below the failure
timeout's pace, and the others would take this healthy peer for down too.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass

from ring import api
from ring.codec import compact_json
from ring.errors import SR3Error
from ring.loops import run_periodic
from ring.membership import Entry, MemberTable
from ring.transport import Transport

__all__ = ["GossipTraffic", "Gossiper"]

log = logging.getLogger(__name__)

FANOUT_DEFAULT = 3
EXCHANGE_TIMEOUT_S = 2.0


def _ids(entries: Collection[Entry]) -> set[str]:
    return {entry.peer_id for entry in entries}


@dataclass(slots=True)
class GossipTraffic:
    """Bytes of gossip bodies a peer sent and received, and the messages."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages: int = 0

    def count(self, *, received: int, sent: int) -> None:
        self.bytes_received += received
        self.bytes_sent += sent
        self.messages += 2


class Gossiper:
    def __init__(
        self,
        table: MemberTable,
        transport: Transport,
        *,
        seeds: Sequence[str],
        contacts: Callable[[], list[str]],
        rng: random.Random,
        interval_s: float,
        fanout: int = FANOUT_DEFAULT,
        ready_after_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self._clock = clock  # monotonic: times the wait for readiness
        self._transport = transport
        self._seeds = [seed for seed in seeds if seed != table.own.address]
        self._contacts = contacts
        self._rng = rng
        self.interval_s = interval_s
        self.fanout = fanout
        self.rounds = 0
        # Set once an exchange found this peer's table and its partner's naming the same
        # members (or after ``ready_after_s`` without that): until then its view of the
        # ring may be partial, so it does not serve the ring to clients nor repair on it.
        self.ready = asyncio.Event()
        self.ready_after_s = ready_after_s
        self.on_change: Callable[[], Awaitable[None]] | None = None
        # The configuration epoch this peer is at, and what to do when a partner is at
        # another (pull the newer configuration, or push ours): every exchange carries
        # the epoch, so a peer that missed a decided change learns it within a round.
        self.epoch: Callable[[], int] = lambda: 0
        self.on_epoch: Callable[[str, int], Awaitable[None]] | None = None
        # Gossip traffic, both ways, as bodies (each message also carries about half a
        # kilobyte of HTTP and signing headers): exchanges this peer started and answered.
        self.traffic = GossipTraffic()

    def _body(self) -> bytes:
        return compact_json(api.member_table_body(self.table.entries(), self.epoch()))

    def receive(self, body: bytes) -> bytes:
        """Handle an incoming exchange: merge it, answer with our table (the partner
        compares configuration epochs: it starts the exchange, so it pulls or pushes)."""
        changed = self.table.merge(api.parse_member_table(api.parse_json_object(body)))
        if changed:
            log.info("member table: learned %s", ", ".join(changed))
            self._changed = True
        answer = self._body()
        self.traffic.count(received=len(body), sent=len(answer))
        return answer

    _changed = False

    async def exchange(self, address: str) -> bool:
        body = self._body()
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT_S):
                answer = await self._transport.request(
                    address, api.GOSSIP.method, api.GOSSIP.pattern, body=body, any_target=True
                )
            self.traffic.count(received=len(answer.body), sent=len(body))
            data = answer.json()
            theirs = api.parse_member_table(data)
            changed = self.table.merge(theirs)
            epoch = api.parse_cluster_epoch(data)
            if epoch != self.epoch() and self.on_epoch is not None:
                await self.on_epoch(address, epoch)
        except (SR3Error, TimeoutError) as exc:
            log.debug("gossip with %s failed: %s", address, exc)
            return False
        if changed:
            log.info("member table: learned %s from %s", ", ".join(changed), address)
            self._changed = True
        elif _ids(theirs) == _ids(self.table.entries()) and self.table.configuration is not None:
            # Ready once a partner's table and ours name the same members, not after the
            # first answer: a joining peer's first partner may itself know only part of
            # the ring, and a client handed that part places and looks for data wrongly.
            self.ready.set()
        return True

    def targets(self, busy: Collection[str] = ()) -> list[str]:
        """Up to ``fanout`` peers to exchange with, none of those in ``busy``."""
        me = self.table.me
        states = self.table.states()
        addresses = {
            entry.peer_id: entry.address
            for entry in self.table.entries()
            if entry.peer_id != me and states[entry.peer_id] not in ("removed", "left")
        }
        # Members of the decided configuration this peer has not heard from yet (it
        # learned the configuration first): gossiping with them is how it hears them.
        for member in self.table.placement():
            if member.peer_id != me and self.table.entry(member.peer_id) is None:
                addresses[member.peer_id] = member.address
        known = sorted(addresses.values())
        if not known:
            own = self.table.own.address
            known = sorted((set(self._seeds) | set(self._contacts())) - {own})
        idle = [address for address in known if address not in busy]
        return self._rng.sample(idle, min(self.fanout, len(idle)))

    async def _finish_round(self) -> None:
        self.rounds += 1
        if self._changed and self.on_change is not None:
            self._changed = False
            await self.on_change()

    async def run(self) -> None:
        """Beat every ``interval_s`` and start exchanges with peers not already being
        exchanged with; the exchanges finish (each within its timeout) in the background."""
        started = self._clock()
        busy: set[str] = set()

        async def exchange(address: str) -> None:
            try:
                await self.exchange(address)
            finally:
                busy.discard(address)

        async def beat(group: asyncio.TaskGroup) -> None:
            self.table.beat()
            for address in self.targets(busy):
                busy.add(address)
                group.create_task(exchange(address))
            await self._finish_round()
            if not self.ready.is_set() and self.table.configuration is not None:
                waited = self._clock() - started
                if not self.targets() or waited >= self.ready_after_s:
                    log.info(
                        "gossip: no partner agreed on the members within %.0f s; "
                        "serving with the table we have", self.ready_after_s,
                    )  # fmt: skip
                    self.ready.set()

        async with asyncio.TaskGroup() as group:
            await run_periodic("gossip", lambda: beat(group), self.interval_s, clock=self._clock)

    async def announce(self, status: str, timeout_s: float) -> None:
        """Set our status and tell every known peer at once (stop, leave)."""
        self.table.set_status(status)
        addresses = [e.address for e in self.table.entries() if e.peer_id != self.table.me]
        try:
            async with asyncio.timeout(timeout_s), asyncio.TaskGroup() as group:
                for address in addresses:
                    group.create_task(self.exchange(address))
        except TimeoutError:
            log.warning("announcing %s did not reach every peer within %.0f s", status, timeout_s)
