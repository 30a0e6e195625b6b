"""The client's operator side: the member table, a peer's leaving, drills' admin kill,
and the ring's status (each member's state and figures, like ``nodetool status``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ring import api
from ring.client.view import STATUS_TIMEOUT_S, RingTracker
from ring.errors import NotFound, PeerError, PeerUnavailable, ProtocolError, SR3Error
from ring.placement import Member
from ring.transport import Transport

__all__ = ["Admin", "PeerStatus", "RingStatus"]

# How often ``leave`` asks whether the peer has left.
LEAVE_POLL_S = 0.5


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


@dataclass(frozen=True, slots=True)
class RingStatus:
    replication: int
    write_quorum: int
    peers: tuple[PeerStatus, ...]
    chunks_under_replicated: int = 0
    chunks_lost: int = 0


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

    async def leave(self, peer_id: str, *, wait: bool = True, timeout_s: float = 600.0) -> None:
        """Ask ``peer_id`` to hand its data over and leave the ring; wait until it has."""
        member = await self._member(peer_id, refresh=True)
        route = api.ADMIN_LEAVE
        await self._transport.request(member.address, route.method, route.pattern, ok=(202,))
        if not wait:
            return
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    await asyncio.sleep(LEAVE_POLL_S)
                    states = {m["peer_id"]: m.get("state") for m in await self.members()}
                    if states.get(peer_id) == "left":
                        return
        except TimeoutError as exc:
            raise SR3Error(f"{peer_id} has not left the ring after {timeout_s:.0f} s") from exc

    async def admin_kill(self, peer_id: str) -> None:
        """Make ``peer_id`` exit at once, as if SIGKILLed (drills on a running ring). The
        peer must have been started with ``--enable-admin-kill``; otherwise it answers 403."""
        member = await self._member(peer_id, refresh=False)
        route = api.ADMIN_KILL
        await self._transport.request(member.address, route.method, route.pattern, ok=(202,))
        self._view.mark_down(member)

    async def _probe(self, entry: Mapping[str, Any], ownership: float) -> PeerStatus:
        peer_id, address = str(entry["peer_id"]), str(entry["address"])
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
            repair_rounds=info.repair_rounds,
        )  # fmt: skip

    async def status(self) -> RingStatus:
        """Every member's state and figures, like ``nodetool status``, with the ring's
        under-replicated and lost chunk counts (from each peer's last repair round)."""
        view = await self._view.ring(refresh=True)
        ownership = view.ring.ownership(view.replication)
        entries = await self.members()
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self._probe(entry, ownership.get(str(entry["peer_id"]), 0.0)))
                for entry in entries
            ]
        peers = tuple(task.result() for task in tasks)
        return RingStatus(
            view.replication,
            view.write_quorum,
            peers,
            chunks_under_replicated=sum(p.chunks_under_replicated or 0 for p in peers),
            chunks_lost=sum(p.chunks_lost or 0 for p in peers),
        )
