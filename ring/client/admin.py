"""The client's operator side: the member table, a peer's leaving, drills' admin kill,
and the ring's status (each member's state and figures, like ``nodetool status``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ring import api
from ring.client.view import STATUS_TIMEOUT_S, RingTracker
from ring.cluster import INTERNAL_NETWORK
from ring.errors import NotFound, PeerError, PeerUnavailable, ProtocolError, SR3Error
from ring.placement import Member
from ring.transport import Transport

__all__ = ["Admin", "LeaveReport", "PeerStatus", "RingStatus", "leave_summary"]

# How often ``leave`` asks the leaving peer how its hand-over goes.
LEAVE_POLL_S = 0.5
# A leaving peer that answers nothing for this long, without the ring saying it left
# after a complete hand-over, has died or stopped: the leave failed.
LEAVE_SILENCE_S_MAX = 5.0
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class LeaveReport:
    """What a peer handed over before it left: each chunk and record is on
    ``replication`` peers without it."""

    peer_id: str
    chunks: int
    bytes: int
    records: int
    replication: int


def leave_summary(report: LeaveReport) -> str:
    """One line for people (``sr3 peer leave``)."""
    return (
        f"{report.peer_id} has left the ring: handed over {report.chunks} chunks "
        f"({report.bytes / MIB:.1f} MiB) and {report.records} records; every one is on "
        f"{report.replication} peers without it"
    )


@dataclass(frozen=True, slots=True)
class PeerStatus:
    peer_id: str
    address: str
    zone: str
    # "up" or "down" as this client reaches it; "removed"/"left" for peers out of the ring
    state: str
    ownership: float
    stored_bytes: int | None
    chunk_count: int | None
    record_count: int | None
    error: str | None = None
    # up / down / removed / left, as the ring's member table has it
    ring_state: str = "up"
    epoch: int | None = None
    chunks_under_replicated: int | None = None
    chunks_lost: int | None = None
    hints_pending: int | None = None
    repair_rounds: int | None = None
    # Chunks this peer found corrupt that no member had a good copy of.
    chunks_unrecoverable: tuple[str, ...] = ()
    disk_free_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class RingStatus:
    replication: int
    write_quorum: int
    peers: tuple[PeerStatus, ...]
    chunks_under_replicated: int = 0
    chunks_lost: int = 0
    # Distinct chunks some peer found corrupt with no good copy on any member.
    chunks_unrecoverable: tuple[str, ...] = ()


class Admin:
    """Membership and status requests, through a client's transport and ring view."""

    def __init__(self, transport: Transport, view: RingTracker) -> None:
        self._transport = transport
        self._view = view

    async def _member(self, peer_id: str, *, refresh: bool) -> Member:
        view = await self._view.ring(refresh=refresh)
        try:
            return view.ring.member(peer_id)
        except KeyError as exc:
            raise NotFound(f"no peer {peer_id!r} in the ring") from exc

    async def members(self) -> list[dict[str, Any]]:
        """The whole member table, with each peer's liveness, from the first peer that
        answers (it includes peers that left or were removed)."""
        view = await self._view.ring(refresh=True)
        causes: list[str] = []
        route = api.MEMBERS
        for member in self._view.live_first(view.ring.members):
            try:
                answer = await self._transport.request(member.address, route.method, route.pattern)
                return api.parse_members_answer(answer.json())
            except (PeerError, ProtocolError) as exc:
                causes.append(str(exc))
        raise PeerUnavailable("ring", "no peer gave its member table: " + "; ".join(causes))

    async def leave(
        self, peer_id: str, *, wait: bool = True, timeout_s: float = 600.0
    ) -> LeaveReport | None:
        """Ask ``peer_id`` to hand its data over and leave the ring. With ``wait``, return
        only once every chunk and record it held is on R peers without it (what it
        reports, and then announces as ``left``); ``SR3Error`` if the hand-over fails,
        the peer dies first, or ``timeout_s`` passes."""
        view = await self._view.ring(refresh=True)
        member = await self._member(peer_id, refresh=False)
        route = api.ADMIN_LEAVE
        answer = await self._transport.request(
            member.address, route.method, route.pattern, ok=(202,)
        )
        if not wait:
            return None
        try:
            async with asyncio.timeout(timeout_s):
                progress = await self._wait_handed_over(member, api.parse_leave_progress(
                    answer.json()))  # fmt: skip
        except TimeoutError as exc:
            raise SR3Error(f"{peer_id} has not left the ring after {timeout_s:.0f} s") from exc
        return LeaveReport(
            peer_id, progress.chunks_moved, progress.bytes_moved, progress.records_moved,
            view.replication,
        )  # fmt: skip

    async def _wait_handed_over(
        self, member: Member, progress: api.LeaveProgress
    ) -> api.LeaveProgress:
        """Poll the leaving peer until it says its hand-over is done; the last progress."""
        silent_since: float | None = None
        loop = asyncio.get_running_loop()
        while progress.state != "done":
            await asyncio.sleep(LEAVE_POLL_S)
            try:
                progress = await self._leave_progress(member)
                silent_since = None
            except (PeerError, ProtocolError) as exc:
                silent_since = loop.time() if silent_since is None else silent_since
                if await self._ring_state(member.peer_id) == "left":
                    return progress  # left only after a complete hand-over
                if loop.time() - silent_since > LEAVE_SILENCE_S_MAX:
                    raise SR3Error(_died_message(member.peer_id, progress, exc)) from exc
                continue
            if progress.state == "failed":
                raise SR3Error(f"{member.peer_id} did not leave: {progress.message}")
            if progress.state == "idle":
                raise SR3Error(f"{member.peer_id} is no longer leaving (it restarted?)")
        return progress

    async def _leave_progress(self, member: Member) -> api.LeaveProgress:
        route = api.INFO
        answer = await self._transport.request(member.address, route.method, route.pattern)
        return api.parse_leave_progress(answer.json())

    async def _ring_state(self, peer_id: str) -> str | None:
        """``peer_id``'s state in the member table of a peer that answers, if any does."""
        try:
            entries = await self.members()
        except PeerError:
            return None
        return next((str(e.get("state")) for e in entries if e.get("peer_id") == peer_id), None)

    async def admin_kill(self, peer_id: str) -> None:
        """Make ``peer_id`` exit at once, as if SIGKILLed (drills on a running ring). The
        peer must have been started with ``--enable-admin-kill``; otherwise it answers 403."""
        member = await self._member(peer_id, refresh=False)
        route = api.ADMIN_KILL
        await self._transport.request(member.address, route.method, route.pattern, ok=(202,))
        self._view.mark_down(member)

    async def _probe(self, entry: Mapping[str, Any], ownership: float, network: str) -> PeerStatus:
        peer_id, address = str(entry["peer_id"]), str(entry["address"])
        if network != INTERNAL_NETWORK:
            # The member's address on the network this client reaches the ring on.
            networks = entry.get("networks")
            if isinstance(networks, dict) and isinstance(networks.get(network), str):
                address = networks[network]
        ring_state = str(entry.get("state", "up"))
        try:
            async with asyncio.timeout(STATUS_TIMEOUT_S):
                route = api.INFO
                answer = await self._transport.request(address, route.method, route.pattern)
                info = api.parse_info(answer.json())
        except (PeerError, ProtocolError, TimeoutError) as exc:
            state = ring_state if ring_state in ("removed", "left") else "down"
            return PeerStatus(
                peer_id, address, str(entry.get("zone", "")), state, ownership,
                None, None, None, str(exc) or "timeout", ring_state=ring_state,
            )  # fmt: skip
        return PeerStatus(
            peer_id, address, str(entry.get("zone", "")), "up", ownership,
            info.stored_bytes, info.chunk_count, info.record_count,
            ring_state=ring_state, epoch=info.epoch,
            chunks_under_replicated=info.chunks_under_replicated,
            chunks_lost=info.chunks_lost, hints_pending=info.hints_pending,
            repair_rounds=info.repair_rounds, chunks_unrecoverable=info.chunks_unrecoverable,
            disk_free_bytes=info.disk_free_bytes,
        )  # fmt: skip

    async def status(self) -> RingStatus:
        """Every member's state and figures, like ``nodetool status``, with the ring's
        under-replicated and lost chunk counts (from each peer's last repair round)."""
        view = await self._view.ring(refresh=True)
        ownership = view.ring.ownership(view.replication)
        entries = await self.members()
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(
                    self._probe(entry, ownership.get(str(entry["peer_id"]), 0.0), view.network)
                )
                for entry in entries
            ]
        peers = tuple(task.result() for task in tasks)
        return RingStatus(
            view.replication,
            view.write_quorum,
            peers,
            chunks_under_replicated=sum(p.chunks_under_replicated or 0 for p in peers),
            chunks_lost=sum(p.chunks_lost or 0 for p in peers),
            chunks_unrecoverable=tuple(
                sorted({chunk_id for p in peers for chunk_id in p.chunks_unrecoverable})
            ),
        )


def _died_message(peer_id: str, progress: api.LeaveProgress, cause: Exception) -> str:
    return (
        f"{peer_id} stopped answering while handing its data over ({cause}); "
        f"{progress.chunks_remaining} chunks and {progress.records_remaining} records were "
        "not yet on R peers without it, so the leave did not complete: the ring "
        "re-replicates from the other copies (see `sr3 status`)"
    )
