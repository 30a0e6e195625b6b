"""Heartbeats and member-table gossip over the peers' HTTP API.

Every ``interval_s`` a peer advances its own heartbeat and exchanges what it knows with
up to ``fanout`` peers chosen with a seeded generator (``POST /v1/gossip``): each side
merges what the other knows. An exchange carries a digest of the table and how long ago
the sender heard from each peer, and the whole table only when the digests differ
(``ring.gossip_wire``). A peer that knows nobody yet (it is joining)
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
from ring.gossip_wire import (
    AGE_NONE,
    AGE_UNIT_S,
    GossipMessage,
    decode_message,
    encode_ages,
    encode_message,
    table_digest,
)  # fmt: skip
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

    def _message(self, *, full: bool, want: bool = False) -> bytes:
        entries = self.table.entries()
        message = GossipMessage(
            self.epoch(), table_digest(entries), encode_ages(self.table.heard_ago()),
            tuple(entries) if full else None, want,
        )  # fmt: skip
        return compact_json(encode_message(message))

    def _take(self, message: GossipMessage) -> list[str]:
        """Merge a partner's message: its entries if it sent them, and the ages it
        heard each peer at (by its table's order: the entries it sent, or ours when the
        digests match). The peer ids that are new or changed."""
        changed: list[str] = []
        if message.members is not None:
            ages = None
            if len(message.ages) == len(message.members):
                # "Not heard within 25.4 s, or never" (AGE_NONE) counts as that old.
                ages = [age * AGE_UNIT_S for age in message.ages]
            changed = self.table.merge(message.members, ages)
            ids = [entry.peer_id for entry in message.members]
        elif message.digest == table_digest(self.table.entries()):
            ids = [entry.peer_id for entry in self.table.entries()]
        else:
            ids = []
        if len(message.ages) == len(ids):
            for peer_id, age in zip(ids, message.ages, strict=True):
                if age != AGE_NONE:
                    self.table.heard(peer_id, age * AGE_UNIT_S)
        if changed:
            log.info("member table: learned %s", ", ".join(changed))
            self._changed = True
        return changed

    def receive(self, body: bytes) -> bytes:
        """Handle an incoming exchange: merge it, answer with our ages, and with our
        whole table when the digests differ (asking for the partner's if it sent only
        its digest). The partner compares configuration epochs: it starts the exchange,
        so it pulls or pushes."""
        message = decode_message(api.parse_json_object(body))
        self._take(message)
        if not message.digest:
            # A peer before digests: it reads whole tables only.
            answer = compact_json(api.member_table_body(self.table.entries(), self.epoch()))
        else:
            # Compared after merging what it sent: when it sent its table and ours held
            # nothing more, the tables agree now and ours need not go back.
            differ = message.digest != table_digest(self.table.entries())
            answer = self._message(full=differ, want=differ and message.members is None)
        self.traffic.count(received=len(body), sent=len(answer))
        return answer

    _changed = False

    async def _send(self, address: str, body: bytes) -> GossipMessage:
        answer = await self._transport.request(
            address, api.GOSSIP.method, api.GOSSIP.pattern, body=body, any_target=True
        )
        self.traffic.count(received=len(answer.body), sent=len(body))
        return decode_message(api.parse_json_object(answer.body))

    async def exchange(self, address: str, *, full: bool = False) -> bool:
        """One exchange with ``address`` (``full``: send the whole table at once)."""
        try:
            async with asyncio.timeout(EXCHANGE_TIMEOUT_S):
                message = await self._send(address, self._message(full=full))
                changed = self._take(message)
                if message.want:
                    # The digests differed: it sent its table and wants ours.
                    message = await self._send(address, self._message(full=True))
                    changed += self._take(message)
            if message.cluster_epoch != self.epoch() and self.on_epoch is not None:
                await self.on_epoch(address, message.cluster_epoch)
        except (SR3Error, TimeoutError) as exc:
            log.debug("gossip with %s failed: %s", address, exc)
            return False
        entries = self.table.entries()
        same = (
            message.digest == table_digest(entries)
            if message.digest
            else message.members is not None and _ids(message.members) == _ids(entries)
        )
        if not changed and same and self.table.configuration is not None:
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
                    group.create_task(self.exchange(address, full=True))
        except TimeoutError:
            log.warning("announcing %s did not reach every peer within %.0f s", status, timeout_s)
