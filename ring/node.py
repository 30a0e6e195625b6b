"""One peer's moving parts, apart from HTTP: stores, member table, gossip, repair,
scrubbing and the discovery overlay, and their lifecycle.

``Node.open`` prepares the stores and the identity (``<data>/peer.json``: the peer id
and an epoch that grows on every start, so that the ring tells a restarted peer from
its previous life). ``Node.run`` runs the background loops in one task group until
cancelled. ``Node.stop`` tells the ring this peer stops (it is then ``down`` at once, not
after the failure timeout); ``Node.leave`` hands everything it holds over to the peers
that take its place (``ring.handover``), then tells the ring it left.

A full disk does not stop a peer (``ring.files``): ``members.json`` and ``peer.json``
are saved best effort, kept in memory while the disk is full and saved by a retry loop
(every ``SAVE_RETRY_INTERVAL_S``) or on the next member change once there is room. A
peer's epoch is ``max(saved epoch + 1, wall-clock milliseconds)`` on every start, saved
once it can be. The wall clock keeps the epoch growing across restarts even when one
could not be saved (a start on a full disk, then a stop before the retry saved it):
were it only ``saved + 1``, the next life's epoch would fall below the unsaved one that
other peers hold, and they would ignore it until they removed the peer. Only a wall
clock stepped back past an unsaved epoch would reuse one; then the ring sees the peer
``down`` until its heartbeat catches up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Callable
from pathlib import Path

from ring import paxos
from ring.api import LeaveProgress, member_table_body, parse_member_table
from ring.chunkstore import ChunkStore
from ring.clock import Clocks
from ring.cluster import Configuration
from ring.consensus import Acceptor, AcceptorSettings
from ring.errors import ConfigError, ProtocolError, SR3Error
from ring.files import PendingWrite, make_folders
from ring.gc import ChunkCollector, GcSettings
from ring.gossip import Gossiper
from ring.handover import HandOver
from ring.hints import HintStore
from ring.loops import run_periodic
from ring.membership import Entry, MemberTable, Timeouts
from ring.metadata import Metadata
from ring.overlay import Overlay
from ring.parse import json_int, load_json
from ring.peer_config import PeerConfig
from ring.placement import Member, Ring
from ring.ratelimit import ForegroundGate, TokenBucket
from ring.records import RecordStore
from ring.repair import Repairer, RepairSettings
from ring.scrubber import Scrubber
from ring.settle import SETTLE_INTERVAL_S, Settler
from ring.steward import Steward, StewardSettings
from ring.tls import client_context
from ring.transport import Timeouts as TransportTimeouts
from ring.transport import Transport

__all__ = ["Node", "OwnChunks"]

log = logging.getLogger(__name__)

ANNOUNCE_TIMEOUT_S = 2.0
LEAVE_TIMEOUT_S = 600.0
# After announcing ``left``, how long a peer waits for a client to read that its
# hand-over is done before it exits anyway (``sr3 peer leave --no-wait``).
LEFT_LINGER_S = 10.0
# How long a leaving peer, its data handed over, waits for every remaining member to
# have caught up on its records at the epoch without it (``ring.settle``).
LEAVE_SETTLE_WAIT_S = 60.0
CONTROL_TIMEOUTS = TransportTimeouts(connect_s=1.0, read_s=3.0)
# Burst of the emulated egress link: small next to a chunk, so the cap holds over
# fractions of a second.
EGRESS_BURST_BYTES = 64 * 1024
# How often a member table or identity that could not be saved (full disk) is retried.
SAVE_RETRY_INTERVAL_S = 2.0
# Joining the overlay again while no seed answered: the pause doubles between these.
OVERLAY_JOIN_PAUSE_S_MIN = 1.0
OVERLAY_JOIN_PAUSE_S_MAX = 30.0


def _saved_epoch(path: Path, peer_id: str) -> int:
    """The epoch ``peer.json`` holds (0 if absent); refuse a foreign or broken identity."""
    if not path.exists():
        return 0
    try:
        identity = load_json(path.read_bytes())
        owner, epoch = str(identity["peer_id"]), json_int(identity["epoch"], "epoch")
    except (OSError, KeyError, TypeError, ValueError, ProtocolError) as exc:
        raise ConfigError(f"{path} is not a valid peer identity: {exc}") from exc
    if owner != peer_id:
        raise ConfigError(f"{path.parent} holds the data of peer {owner!r}, not {peer_id!r}")
    return epoch


def _identity(peer_id: str, epoch: int) -> bytes:
    return json.dumps({"peer_id": peer_id, "epoch": epoch}).encode()


def _next_epoch(identity: PendingWrite, peer_id: str, wall_clock: Callable[[], float]) -> int:
    """Bump and durably write this data folder's epoch. On a full disk: the fallback of
    the module docstring, left pending in ``identity`` for the retry loop."""
    epoch = max(_saved_epoch(identity.path, peer_id) + 1, int(wall_clock() * 1000))
    identity.set(_identity(peer_id, epoch))
    if not identity.flush():
        log.warning("running with unsaved epoch %d until there is room to save it", epoch)
    return epoch


def _load_members(path: Path) -> list[Entry]:
    """The member table saved by a previous run; nothing if absent or unreadable."""
    if not path.exists():
        return []
    try:
        return parse_member_table(load_json(path.read_bytes()))
    except (OSError, ValueError, ProtocolError) as exc:
        log.warning("ignoring saved member table %s: %s", path, exc)
        return []


class OwnChunks:
    """This peer's chunk store as a client running in the peer reads it (the file
    namespace: ``ring.client.LocalChunks``). A read is foreground traffic, as a chunk GET
    is: repair and scrubbing wait for it. ``bytes_read``: the stored bytes it gave."""

    def __init__(self, chunks: ChunkStore, foreground: ForegroundGate) -> None:
        self._chunks = chunks
        self._foreground = foreground
        self.bytes_read = 0

    def has(self, chunk_id: str) -> bool:
        return self._chunks.has(chunk_id)

    async def read_local(self, chunk_id: str) -> bytes | None:
        self._foreground.enter()
        try:
            stored = await self._chunks.get(chunk_id)
        finally:
            self._foreground.leave()
        if stored is not None:
            self.bytes_read += len(stored)
        return stored


class Node:
    def __init__(self, config: PeerConfig, clocks: Clocks) -> None:
        self.config = config
        # Durations (liveness, rate limits, pacing, grace periods held in memory) run on
        # clocks.monotonic; clocks.wall is for what is stored or compared elsewhere.
        self.clocks = clocks
        # The wall clock: request signatures are checked against it (ring.peer).
        self.clock = clocks.wall
        self.chunks = ChunkStore(
            config.data_dir,
            capacity_bytes=config.capacity_bytes,
            io_concurrency=config.io_concurrency,
            direct_io=config.direct_io,
            clock=clocks.monotonic,
        )
        self.records = RecordStore(
            config.data_dir,
            tombstone_ttl_s=config.tombstone_ttl_s,
            wall_clock=clocks.wall,
            clock=clocks.monotonic,
        )
        self.hints = HintStore(config.data_dir)
        # The cluster configuration this peer learned and its vote on the next one.
        self.metadata = Metadata(config.data_dir, config.peer_id, clocks.wall)
        # Signatures carry unix time: the peers that check them compare it with theirs.
        # With TLS, this peer calls others over HTTPS, trusting the cluster CA and
        # presenting its own certificate (peers may require one).
        tls = config.tls
        outgoing = None if tls is None else client_context(tls.as_client)
        self.data_transport = Transport(config.secret, clock=clocks.wall, tls=outgoing)
        self.control_transport = Transport(
            config.secret, timeouts=CONTROL_TIMEOUTS, clock=clocks.wall, tls=outgoing
        )
        # Emulated egress link (``--egress-rate``), shared by chunk reads and recovery
        # streams so that both draw on one budget.
        self.egress = TokenBucket(config.egress_rate_bytes_s, EGRESS_BURST_BYTES, clocks.monotonic)
        # Foreground reads in flight: repair and scrubbing yield to them.
        self.foreground = ForegroundGate(clocks.monotonic)
        # The chunk store as this peer's own file namespace reads it.
        self.own_chunks = OwnChunks(self.chunks, self.foreground)
        # The overlay stamps signed datagrams that other machines check against their
        # clocks (wall time) and ages the values it stores (monotonic).
        self.overlay: Overlay | None = (
            Overlay(config.secret, config.peer_id, clock=clocks.wall, monotonic=clocks.monotonic)
            if config.overlay
            else None
        )
        self.epoch = 0
        tmp_dir = config.data_dir / "tmp"
        self._identity = PendingWrite(tmp_dir, config.data_dir / "peer.json", "the peer identity")
        self._members_file = PendingWrite(
            tmp_dir, config.data_dir / "members.json", "the member table"
        )
        self.leaving = asyncio.Event()
        self.left = asyncio.Event()
        self.handover = HandOver(self.chunks, self.records)
        self._table: MemberTable | None = None
        self._gossiper: Gossiper | None = None
        self._repairer: Repairer | None = None
        self._scrubber: Scrubber | None = None
        self._collector: ChunkCollector | None = None
        self._acceptor: Acceptor | None = None
        self._steward: Steward | None = None
        self._settler: Settler | None = None

    # Built in open(): they need the epoch read from disk.
    @property
    def table(self) -> MemberTable:
        assert self._table is not None, "Node.open() first"
        return self._table

    @property
    def gossiper(self) -> Gossiper:
        assert self._gossiper is not None, "Node.open() first"
        return self._gossiper

    @property
    def acceptor(self) -> Acceptor:
        assert self._acceptor is not None, "open() first"
        return self._acceptor

    @property
    def steward(self) -> Steward:
        assert self._steward is not None, "Node.open() first"
        return self._steward

    @property
    def repairer(self) -> Repairer:
        assert self._repairer is not None, "Node.open() first"
        return self._repairer

    @property
    def collector(self) -> ChunkCollector:
        assert self._collector is not None, "Node.open() first"
        return self._collector

    @property
    def scrubber(self) -> Scrubber:
        assert self._scrubber is not None, "Node.open() first"
        return self._scrubber

    def open(self) -> None:
        config = self.config
        make_folders([config.data_dir / "tmp"])
        self.epoch = _next_epoch(self._identity, config.peer_id, self.clocks.wall)
        self.chunks.open()
        self.records.open()
        self.hints.open()
        self.metadata.open()
        me = Entry(
            config.peer_id, config.address, config.zone, "up", self.epoch, 0,
            networks=config.networks,
        )  # fmt: skip
        timeouts = Timeouts(config.failure_timeout_s, config.removal_grace_s)
        self._table = MemberTable(me, self.clocks.monotonic, timeouts)
        self._table.configuration = self.metadata.current
        self.metadata.listeners.append(self._learned)
        self._table.merge(_load_members(self._members_file.path))
        self._gossiper = Gossiper(
            self._table,
            self.control_transport,
            seeds=config.seeds,
            contacts=self._overlay_contacts,
            rng=random.Random(config.rng_seed),
            interval_s=config.gossip_interval_s,
            ready_after_s=config.failure_timeout_s,
            clock=self.clocks.monotonic,
        )
        self._gossiper.on_change = self._save_members
        self._gossiper.epoch = lambda: self.metadata.epoch
        self._gossiper.on_epoch = self._partner_epoch
        self._steward = Steward(
            Member(config.peer_id, config.address, config.zone), self.metadata, self._table,
            self.control_transport,
            StewardSettings(config.gossip_interval_s, config.removal_grace_s),
            seeds=config.seeds, contacts=self._overlay_contacts,
            rng=random.Random(config.rng_seed), clock=self.clocks.monotonic,
        )  # fmt: skip
        self._repairer = Repairer(
            config.peer_id, self._table, self.chunks, self.records, self.hints,
            self.data_transport,
            RepairSettings(
                replication=config.replication, vnodes=config.vnodes,
                zone_aware=config.zone_aware, interval_s=config.repair_interval_s,
                rate_bytes_s=config.repair_rate_bytes_s, settle_s=config.repair_settle_s,
            ),
            clock=self.clocks.monotonic, wall_clock=self.clocks.wall, foreground=self.foreground,
        )  # fmt: skip
        self._repairer.epoch = lambda: self.metadata.epoch
        self._scrubber = Scrubber(
            config.peer_id, self.chunks, self._table, self.ring, self.data_transport,
            replication=config.replication, rate_bytes_s=config.scrub_rate_bytes_s,
            interval_s=config.scrub_interval_s, foreground=self.foreground,
            clock=self.clocks.monotonic,
        )  # fmt: skip

        # A peer that newly answers for a key catches up on it first, for as long as
        # repair may take to move records after a change: it notices the change within
        # the failure timeout and pushes within a round or two (ring.consensus).
        sync_window_s = config.failure_timeout_s + 3 * config.repair_interval_s
        self._acceptor = Acceptor(
            config.peer_id, self.records, lambda: self.table, self.data_transport,
            AcceptorSettings(
                group=paxos.record_group(config.replication), vnodes=config.vnodes,
                zone_aware=config.zone_aware,
                sync_window_s=sync_window_s,
            ),
            self.clocks.monotonic,
            epoch=lambda: self.metadata.epoch,
            settled_epoch=lambda: self.metadata.settled_epoch,
            history=self._history_at_start(sync_window_s),
        )  # fmt: skip
        self.metadata.listeners.append(self._acceptor.learned)
        self._settler = Settler(
            config.peer_id, self._acceptor, lambda: self.table, self.data_transport,
            epoch=lambda: self.metadata.epoch, group=paxos.record_group(config.replication),
            interval_s=min(SETTLE_INTERVAL_S, config.gossip_interval_s),
            on_all_settled=self.metadata.settled,
        )  # fmt: skip
        self._collector = ChunkCollector(
            config.peer_id, self._table, self.chunks, self.records, self.control_transport,
            GcSettings(config.gc_interval_s, config.gc_grace_s),
            self.clocks.monotonic, wall_clock=self.clocks.wall,
        )  # fmt: skip

    def _history_at_start(self, window_s: float) -> list[Configuration | None]:
        """What a starting peer may not have caught up on: the configurations replaced
        within the catch-up window before it stopped (their catch-ups may not have
        finished), or, with records but no configuration saved (written before
        configurations existed), an unknown past."""
        if self.metadata.current is None:
            return [None] if self.records.keys() else []
        return list(self.metadata.replaced_since(self.clocks.wall() - window_s))

    def _learned(self, config: Configuration, _gap: bool) -> None:
        self.table.configuration = config

    async def _partner_epoch(self, address: str, epoch: int) -> None:
        """A gossip partner is at another configuration epoch: learn from it if it is
        ahead, tell it ours if it is behind."""
        if epoch > self.metadata.epoch:
            await self.steward.pull(address, epoch)
        elif self.metadata.current is not None:
            await self.steward.push_to(address)

    async def _save_members(self) -> None:
        """Remember the member table, so that a restarted peer knows the ring at once.
        Best effort: on a full disk it stays pending for ``_save_pending``."""
        self._members_file.set(json.dumps(member_table_body(self.table.entries())).encode())
        await asyncio.to_thread(self._members_file.flush)

    @property
    def saves_pending(self) -> bool:
        """Whether the member table or the identity waits for room on the disk."""
        return self._members_file.pending or self._identity.pending or self.metadata.saves_pending

    async def _save_pending(self) -> None:
        """Retry what a full disk kept from being saved (the newest member table)."""
        if self._identity.pending:
            await asyncio.to_thread(self._identity.flush)
        if self._members_file.pending:
            await self._save_members()
        await self.metadata.save_pending()

    async def _retry_saves(self) -> None:
        await run_periodic(
            "saving the member table",
            self._save_pending,
            SAVE_RETRY_INTERVAL_S,
            first_at_once=False,
            tolerated=(SR3Error,),
            clock=self.clocks.monotonic,
        )

    async def emulate_latency(self) -> None:
        """Wait ``--added-latency`` (network emulation) before answering a data request."""
        if self.config.added_latency_ms > 0:
            await asyncio.sleep(self.config.added_latency_ms / 1000.0)

    def ring(self) -> Ring:
        return Ring.build(
            self.table.placement(), vnodes=self.config.vnodes, zone_aware=self.config.zone_aware
        )

    def _overlay_contacts(self) -> list[str]:
        if self.overlay is None:
            return []
        return [f"{host}:{port}" for host, port in self.overlay.contacts()]

    async def start_overlay(self) -> None:
        if self.overlay is None:
            return
        # Datagrams sign the address other peers reach this one at (the advertised one,
        # when the peer binds 0.0.0.0 in a container).
        await self.overlay.start(self.config.host, self.config.port, advertise=self.config.address)

    async def run(self) -> None:
        """The background loops, until cancelled (or until the peer has left)."""
        async with asyncio.TaskGroup() as group:
            if self.overlay is not None:
                group.create_task(self.overlay.run())
                group.create_task(self._join_overlay())
            group.create_task(self.gossiper.run())
            group.create_task(self.steward.run())
            group.create_task(self._repair_when_ready())
            assert self._settler is not None, "Node.open() first"
            group.create_task(self._settler.run())
            group.create_task(self.scrubber.run())
            group.create_task(self.scrubber.run_restores())
            group.create_task(self._collect_when_ready())
            group.create_task(self._leave_when_asked())
            group.create_task(self._retry_saves())

    async def _join_overlay(self) -> None:
        """Join the overlay through the seeds; while it finds no contact (the seeds start
        later, or their names do not resolve yet), again after a pause that doubles from
        ``OVERLAY_JOIN_PAUSE_S_MIN`` to ``OVERLAY_JOIN_PAUSE_S_MAX``."""
        assert self.overlay is not None
        config = self.config
        others = [
            s for s in config.seeds if s not in (config.address, f"{config.host}:{config.port}")
        ]
        pause_s = OVERLAY_JOIN_PAUSE_S_MIN
        while True:
            contacts = await self.overlay.bootstrap(list(config.seeds))
            if contacts or not others:
                break
            log.info(
                "overlay: 0 contacts after joining through %d seeds; trying again in %.0f s",
                len(config.seeds),
                pause_s,
            )
            await asyncio.sleep(pause_s)
            pause_s = min(OVERLAY_JOIN_PAUSE_S_MAX, 2 * pause_s)
        own = json.dumps({"peer_id": config.peer_id, "address": config.address})
        await self.overlay.announce(f"sr3/peer/{config.peer_id}", own.encode())
        log.info("overlay: %d contacts after joining through %d seeds", contacts, len(config.seeds))

    async def _repair_when_ready(self) -> None:
        await self.gossiper.ready.wait()
        await self.repairer.run()

    async def _collect_when_ready(self) -> None:
        await self.gossiper.ready.wait()
        await self.collector.run()

    async def _leave_when_asked(self) -> None:
        # A leave that did not finish leaves the peer up: it may be asked again.
        while not self.left.is_set():
            await self.leaving.wait()
            await self.leave()

    def leave_refused(self) -> str | None:
        """Why this peer cannot start leaving now (fewer than R peers would remain)."""
        # Peers that are up now: a down member cannot take a copy. (Two leaves racing
        # before gossip tells them of each other are kept safe by repair's plan, which
        # deletes an extra copy only once R live preference members hold it.)
        states = self.table.states()
        others = [
            m
            for m in self.table.placement()
            if m.peer_id != self.config.peer_id and states.get(m.peer_id) == "up"
        ]
        if self.handover.progress.state in ("handing_over", "done"):
            return None
        if len(others) < self.config.replication:
            return (
                f"only {len(others)} other peers would hold the data of "
                f"{self.config.peer_id}, fewer than the replication factor "
                f"{self.config.replication}"
            )
        return None

    def request_leave(self) -> LeaveProgress:
        """Start leaving (``POST /v1/admin/leave``); ``run`` does the hand-over."""
        progress = self.handover.start()
        self.leaving.set()
        return progress

    async def _wait_until_caught_up(self) -> None:
        """Until every member of the configuration without this peer announced that it
        caught up on its records there (so a leave leaves no catch-up behind it: two
        peers lost right after it cost no record its availability)."""

        def caught_up() -> bool:
            config = self.metadata.current
            return config is not None and self.table.all_settled(config)

        async def look() -> None:
            """Gossip brings the announcements; the loop only looks at them."""

        try:
            async with asyncio.timeout(LEAVE_SETTLE_WAIT_S):
                await run_periodic(
                    "waiting for the members to catch up", look,
                    min(0.2, self.config.gossip_interval_s), until=caught_up,
                    clock=self.clocks.monotonic,
                )  # fmt: skip
        except TimeoutError:
            log.warning(
                "leaving: not every member caught up on its records within %.0f s; the "
                "data is handed over, leaving anyway", LEAVE_SETTLE_WAIT_S,
            )  # fmt: skip

    async def leave(self) -> None:
        """Hand over every chunk and record, then announce ``left`` and exit; back
        ``up`` with its data if that does not finish within ``LEAVE_TIMEOUT_S``."""
        log.info("peer %s is leaving: handing its data over", self.config.peer_id)
        self.handover.start()
        self.steward.wants_membership = False
        try:
            await self.steward.propose(self._without_me)
        except SR3Error as exc:
            self.steward.wants_membership = True
            self.handover.fail(f"the ring did not decide the removal of this peer: {exc}")
            self.leaving.clear()
            return
        await self.gossiper.announce("leaving", ANNOUNCE_TIMEOUT_S)
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await run_periodic(
                    "hand-over",
                    self._hand_over_round,
                    min(1.0, self.config.repair_interval_s),
                    tolerated=(SR3Error,),
                    until=self.handover.account,
                    clock=self.clocks.monotonic,
                )
        except TimeoutError:
            await self._abandon_leave()
            return
        await self._wait_until_caught_up()
        done = self.handover.finish()
        log.info(
            "peer %s handed over %d chunks (%d bytes) and %d records",
            self.config.peer_id, done.chunks_moved, done.bytes_moved, done.records_moved,
        )  # fmt: skip
        await self.gossiper.announce("left", ANNOUNCE_TIMEOUT_S)
        log.info("peer %s has left the ring", self.config.peer_id)
        try:
            async with asyncio.timeout(LEFT_LINGER_S):
                await self.handover.reported.wait()
        except TimeoutError:
            log.info("nobody asked how the hand-over went: exiting anyway")
        self.left.set()

    def _without_me(self, config: Configuration) -> Configuration | None:
        if config.member(self.config.peer_id) is None:
            return None
        return config.without([self.config.peer_id])

    async def _hand_over_round(self) -> None:
        # Leaving, this peer is out of placement: these are the peers that take over.
        owners = len(self.table.placement())
        if owners < self.config.replication:
            self.handover.note(f"waiting: only {owners} peers to hand the data over to")
            return
        self.handover.note("")
        await self.repairer.round()

    async def _abandon_leave(self) -> None:
        left = self.handover.progress
        message = (
            f"the hand-over did not finish within {LEAVE_TIMEOUT_S:.0f} s: "
            f"{left.chunks_remaining} chunks and {left.records_remaining} records are not yet "
            f"on R peers without {self.config.peer_id}; it stays in the ring with its data"
        )
        log.error("leaving: %s", message)
        self.handover.fail(message)
        self.leaving.clear()
        # Back up: it asks to be a member again (``Steward``).
        self.steward.wants_membership = True
        await self.gossiper.announce("up", ANNOUNCE_TIMEOUT_S)

    async def stop(self) -> None:
        """Tell the ring this peer stops, then close outgoing connections."""
        if not self.left.is_set():
            await self.gossiper.announce("stopped", ANNOUNCE_TIMEOUT_S)
        if self.overlay is not None:
            await self.overlay.stop()
        await self.data_transport.close()
        await self.control_transport.close()
