"""Catching up on every record at once after a configuration change, so the rings
before can be forgotten.

``ring.consensus`` catches a key up lazily, on the first round that touches it, from a
majority of each group that held it under the rings of the window. That is correct but
leaves a peer needing those old groups for as long as the window lasts: a ring that
formed one peer at a time keeps, for every key, a group of one (the founder) in its
history, and losing that peer within the window made keys unwritable (503 ``syncing``)
although a majority of every current group was up.

So after each epoch change every peer, in the background, lists the records of the
peers of the rings it remembers (scan pages, at their epoch or later: those refuse the
old rounds, so nothing more can be chosen there without them), catches up on each key it
answers for whose group changed, and, once a majority of every old group answered in
full, announces in its gossip entry that it caught up at this epoch. A key none of them
holds was chosen nowhere. When every member of the configuration announced the same
epoch, each key's acceptors hold whatever was chosen before it, and every peer forgets
the rings before: later catch-ups need only a majority of the groups of this ring.

Until then nothing changes: lazy catch-up with the window as before. A peer that cannot
reach a majority of some old group stays uncaught-up and retries every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ring import api, paxos, records_api
from ring.consensus import Acceptor
from ring.errors import ProtocolError, SR3Error
from ring.loops import run_periodic
from ring.membership import MemberTable
from ring.placement import Ring
from ring.transport import Transport

__all__ = ["SETTLE_INTERVAL_S", "Settler"]

log = logging.getLogger(__name__)

SETTLE_INTERVAL_S = 1.0
# Records asked for per scan page, and pages per peer in one pass (a peer holding more
# than PAGE_RECORDS * PAGES_MAX records is caught up on lazily past that).
PAGE_RECORDS = 2_000
PAGES_MAX = 1_000
# Peers scanned at once, and keys caught up on at once.
SCANS_AT_ONCE = 4
CATCH_UPS_AT_ONCE = 8


class Settler:
    """One peer's background catch-up (see the module docstring)."""

    def __init__(
        self,
        me: str,
        acceptor: Acceptor,
        table: Callable[[], MemberTable],
        transport: Transport,
        epoch: Callable[[], int],
        group: int,
        interval_s: float = SETTLE_INTERVAL_S,
        on_all_settled: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self._me = me
        self._acceptor = acceptor
        self._table = table
        self._transport = transport
        self._epoch = epoch
        self._group = group
        self.interval_s = interval_s
        # Told each time every member announced the epoch (``Metadata.settled`` keeps it).
        self._on_all_settled = on_all_settled
        self.passes = 0
        self._last_said = ""

    async def run(self) -> None:
        await run_periodic(
            "catching up on every record", self.step, self.interval_s,
            tolerated=(SR3Error,),
        )  # fmt: skip

    async def step(self) -> None:
        """Catch up at this epoch if not done yet, then announce it; forget the rings
        before once every member announced it."""
        table = self._table()
        config = table.configuration
        if config is None or config.member(self._me) is None:
            return
        epoch = config.epoch
        if self._acceptor.covered_epoch != epoch:
            if not await self.settle(epoch):
                return
            self._acceptor.cover(epoch)
        if table.own.settled != epoch:
            table.set_settled(epoch)
            log.info("records: caught up on every key this peer answers for at epoch %d", epoch)
        if table.all_settled(config) and self._on_all_settled is not None:
            # Remembered (``Metadata.settled``): the acceptor's history drops the rings
            # of the epochs before.
            await self._on_all_settled(epoch)

    async def settle(self, epoch: int) -> bool:
        """One pass: whether every key this peer answers for at ``epoch`` was caught up on."""
        self.passes += 1
        history = self._acceptor.history()
        if not history:
            return True
        current = self._acceptor.ring()
        rings = [ring for ring in history if ring is not None]
        addresses = {m.peer_id: m.address for ring in [*rings, current] for m in ring.members}
        addresses.pop(self._me, None)
        limit = asyncio.Semaphore(SCANS_AT_ONCE)
        catch_ups = asyncio.Semaphore(CATCH_UPS_AT_ONCE)

        async def scan(peer_id: str) -> tuple[bool, bool]:
            async with limit:
                return await self._scan(peer_id, addresses[peer_id], epoch, current, catch_ups)

        peers = sorted(addresses)
        results = await asyncio.gather(*(scan(peer_id) for peer_id in peers))
        if any(caught_up is False for _listed, caught_up in results):
            # A key listed could not be caught up on: not done, whatever else answered.
            return False
        answered = {peer_id for peer_id, (listed, _) in zip(peers, results, strict=True) if listed}
        table = self._table()
        answered |= {p for p in addresses if table.entry(p) and table.liveness(p) == "left"}
        answered.add(self._me)
        if self._epoch() != epoch:
            return False
        missing = self._uncovered(history, current, answered)
        if missing:
            said = (
                f"catching up on every record at epoch {epoch}: no majority answered of "
                f"{len(missing)} old groups ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}); retrying"
            )
            # Once per change of what is missing, not every pass.
            (log.info if said != self._last_said else log.debug)(said)
            self._last_said = said
            return False
        return True

    def _uncovered(
        self, history: list[Ring | None], current: Ring, answered: set[str]
    ) -> list[str]:
        """The old groups of which fewer than a majority answered in full (described)."""
        missing: list[str] = []
        for ring in history:
            if ring is None:
                # A time this peer was not running: any current member may hold what
                # it lacks (``Acceptor._sources``), so all of them must answer.
                absent = [m.peer_id for m in current.members if m.peer_id not in answered]
                if absent:
                    missing.append(f"the members this peer was away from ({', '.join(absent)})")
                continue
            for group in sorted(ring.preference_sets(self._group)):
                if len(answered.intersection(group)) < paxos.majority(len(group)):
                    missing.append("(" + ", ".join(group) + ")")
        return missing

    def _answers_for(self, ring: Ring, key: str) -> bool:
        return any(m.peer_id == self._me for m in ring.preference_list(key, self._group))

    async def _scan(
        self, peer_id: str, address: str, epoch: int, current: Ring, catch_ups: asyncio.Semaphore
    ) -> tuple[bool, bool]:
        """List every record ``peer_id`` holds and catch up on those this peer answers
        for: whether it answered every page at ``epoch`` or later, and whether every
        catch-up of a key it listed succeeded."""
        after = ""
        for _page in range(PAGES_MAX):
            path = records_api.records_scan_path("", PAGE_RECORDS, after=after)
            try:
                answer = await self._transport.request(address, api.RECORDS_LIST.method, path)
                raw_epoch = answer.headers.get(api.HEADER_EPOCH, "")
                at = api.parse_ascii_int(raw_epoch, "epoch", api.VERSION_MAX) if raw_epoch else -1
                page = records_api.parse_scan_answer(answer.json(), PAGE_RECORDS)
            except (SR3Error, ProtocolError, ValueError) as exc:
                log.debug("catching up: %s gave no scan page: %s", peer_id, exc)
                return False, True
            if at < epoch:
                return False, True
            keys = [
                record.key
                for record in page.records
                if self._answers_for(current, record.key)
                and self._acceptor.needs_catch_up(record.key)
            ]

            async def catch_up(key: str) -> bool:
                async with catch_ups:
                    try:
                        await self._acceptor.catch_up(key)
                    except SR3Error as exc:
                        log.debug("catching up on %s: %s", key, exc)
                        return False
                    return True

            if not all(await asyncio.gather(*(catch_up(key) for key in keys))):
                return True, False
            if not page.truncated:
                return True, True
            after = page.last
        return False, True
