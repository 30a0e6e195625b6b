"""The client's view of the ring: the member table it places with, which peers it
suspects down, and the fan-out of one operation over a key's replicas.

The member table comes from any reachable seed (``GET /v1/ring``) and is cached for
``ring_refresh_s``. A peer that could not be reached is tried last for ``down_retry_s``.
One peer's table can be partial (a peer that joined moments ago has not heard of every
member yet), so after a miss ``wider_ring`` unions the tables that every known peer
serves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ring import api
from ring.client.options import ClientOptions
from ring.errors import ConfigError, PeerError, PeerUnavailable, ProtocolError
from ring.placement import Member, Ring
from ring.transport import Transport

__all__ = ["RingTracker", "RingView", "added_members", "parse_seeds", "union_views"]

T = TypeVar("T")
log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 3.0
# Widening the member table after a miss (``RingTracker.wider_ring``): at most once per
# interval, at most this many peers asked at once, each within STATUS_TIMEOUT_S.
WIDEN_INTERVAL_S = 1.0
WIDEN_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class RingView:
    ring: Ring
    replication: int
    write_quorum: int
    # peer id -> "up" / "down", as the answering peer sees it
    states: Mapping[str, str]
    fetched_at: float


def parse_seeds(ring: str | Sequence[str]) -> tuple[str, ...]:
    seeds = ring.split(",") if isinstance(ring, str) else list(ring)
    cleaned = tuple(seed.strip() for seed in seeds if seed.strip())
    if not cleaned:
        raise ConfigError("no ring address given (host:port of any peer)")
    for seed in cleaned:
        host, _, port = seed.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"ring address {seed!r} is not host:port")
    return cleaned


def union_views(views: Sequence[RingView], fetched_at: float) -> RingView:
    """One view naming every member any of ``views`` names; a member is up if any view
    has it up. Replication, quorum and vnodes are the first view's."""
    members: dict[str, Member] = {}
    states: dict[str, str] = {}
    for view in views:
        for member in view.ring.members:
            members.setdefault(member.peer_id, member)
            state = view.states.get(member.peer_id, "up")
            if states.get(member.peer_id) != "up":
                states[member.peer_id] = state
    first = views[0]
    ring = Ring.build(members.values(), vnodes=first.ring.vnodes, zone_aware=first.ring.zone_aware)
    return RingView(ring, first.replication, first.write_quorum, states, fetched_at)


def added_members(seen: RingView, wider: RingView, key: str) -> list[Member]:
    """``key``'s candidates in ``wider`` that ``seen`` does not name, in walk order."""
    named = {member.peer_id for member in seen.ring.members}
    candidates = wider.ring.candidates(key, wider.replication)
    return [member for member in candidates if member.peer_id not in named]


class RingTracker:
    """The member table a client places with, and the peers it suspects down."""

    def __init__(
        self,
        seeds: tuple[str, ...],
        transport: Transport,
        options: ClientOptions,
        clock: Callable[[], float],
    ) -> None:
        self.seeds = seeds
        self.options = options
        self._transport = transport
        self._clock = clock
        self._view: RingView | None = None
        self._down_until: dict[str, float] = {}
        self._widening = asyncio.Lock()
        self._widened_at = float("-inf")

    # -- the member table ---------------------------------------------------------------

    async def ring(self, *, refresh: bool = False) -> RingView:
        """The member table, from the first seed or known peer that answers; cached for
        ``ring_refresh_s`` so that a long-lived client follows membership changes."""
        view = self._view
        if (
            view is not None
            and not refresh
            and self._clock() - view.fetched_at < self.options.ring_refresh_s
        ):
            return view
        known = [member.address for member in view.ring.members] if view is not None else []
        causes: list[str] = []
        for address in dict.fromkeys([*self.seeds, *known]):
            try:
                self._view = await self._ring_from(address)
                return self._view
            except PeerError as exc:
                causes.append(str(exc))
        raise PeerUnavailable(",".join(self.seeds), "no peer answered: " + "; ".join(causes))

    async def wider_ring(self, seen: RingView) -> RingView | None:
        """After data was on no member of ``seen``: the union of the member tables that
        the seeds and every member of ``seen`` serve, if it names members ``seen`` lacks.

        A read that walks only a partial table's members misses data that sits on the
        others. The union becomes this client's view. Widening asks every peer, so it
        runs at most once per ``WIDEN_INTERVAL_S``; calls in between get its result."""
        async with self._widening:
            if self._clock() - self._widened_at >= WIDEN_INTERVAL_S:
                addresses = [*self.seeds, *(member.address for member in seen.ring.members)]
                views = await self._ring_answers(list(dict.fromkeys(addresses)))
                self._widened_at = self._clock()
                if views:
                    self._view = union_views(views, self._clock())
            view = self._view
        if view is None:
            return None
        known = {member.peer_id for member in seen.ring.members}
        return view if any(m.peer_id not in known for m in view.ring.members) else None

    async def _ring_answers(self, addresses: Sequence[str]) -> list[RingView]:
        slots = asyncio.Semaphore(WIDEN_CONCURRENCY)

        async def ask(address: str) -> RingView | None:
            async with slots:
                try:
                    async with asyncio.timeout(STATUS_TIMEOUT_S):
                        return await self._ring_from(address)
                except (PeerError, ProtocolError, TimeoutError) as exc:
                    log.info("widening the member table: %s did not answer: %s", address, exc)
                    return None

        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(ask(address)) for address in addresses]
        return [view for task in tasks if (view := task.result()) is not None]

    async def _ring_from(self, address: str) -> RingView:
        """The member table that the peer at ``address`` serves."""
        route = api.RING
        answer = await self._transport.request(
            address, route.method, route.pattern, any_target=True
        )
        return self._parse_ring(answer.json())

    def _parse_ring(self, answer: object) -> RingView:
        description = api.RingDescription.from_json(answer)
        members = [Member(m.peer_id, m.address, m.zone) for m in description.members]
        states = {m.peer_id: m.state for m in description.members}
        try:
            ring = Ring.build(members, vnodes=description.vnodes, zone_aware=description.zone_aware)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed ring description: {exc!r}") from exc
        replication = self.options.replication or description.replication
        write_quorum = self.options.write_quorum or description.write_quorum
        if not 1 <= write_quorum <= replication:
            raise ConfigError(f"write quorum {write_quorum} must be in 1..R={replication}")
        return RingView(ring, replication, write_quorum, states, self._clock())

    # -- suspicion ----------------------------------------------------------------------

    def mark_down(self, member: Member) -> None:
        self._down_until[member.peer_id] = self._clock() + self.options.down_retry_s

    def is_down(self, member: Member) -> bool:
        if self._down_until.get(member.peer_id, 0.0) > self._clock():
            return True
        view = self._view
        return view is not None and view.states.get(member.peer_id) == "down"

    def live_first(self, members: Sequence[Member]) -> list[Member]:
        return [m for m in members if not self.is_down(m)] + [m for m in members if self.is_down(m)]

    def probe_limit_s(self, member: Member) -> float | None:
        """How long ``member`` gets to answer: briefly if it is believed down (it may have
        come back, or it may be frozen and never answer), else the transport's timeouts."""
        return self.options.down_probe_s if self.is_down(member) else None

    # -- fan-out ------------------------------------------------------------------------

    async def fan_out(
        self,
        candidates: Sequence[Member],
        count: int,
        op: Callable[[Member, Member | None], Awaitable[T]],
        *,
        strict: bool = False,
    ) -> tuple[list[tuple[Member, T]], list[str]]:
        """Run ``op`` on the first ``count`` candidates at once. A lane whose peer is
        known down, or fails (PeerError), moves on to the next unused candidate, live ones
        first, and passes ``op`` the peer it stands in for (writes leave a hint for it).
        With ``strict``, only the preferred peers are asked, each whatever the client
        believes of it. Returns the answers and the failures."""
        preferred = list(candidates[:count])
        last_resort = [member for member in preferred if self.is_down(member)]
        spares = iter(self.live_first(candidates[count:]) + last_resort)
        if strict:
            last_resort, spares = [], iter(())
        answers: list[tuple[Member, T]] = []
        causes: list[str] = []

        async def lane(original: Member) -> None:
            member: Member | None = original
            if self.is_down(original) and not strict:
                member = next(spares, None)
            while member is not None:
                limit_s = self.probe_limit_s(member)
                try:
                    stand_in_for = None if member is original else original
                    async with asyncio.timeout(limit_s):
                        answers.append((member, await op(member, stand_in_for)))
                    return
                except TimeoutError:
                    causes.append(f"{member.address}: no answer within {limit_s} s")
                    self.mark_down(member)
                except PeerError as exc:
                    causes.append(str(exc))
                    if isinstance(exc, PeerUnavailable):
                        self.mark_down(member)
                member = next(spares, None)

        async with asyncio.TaskGroup() as group:
            for member in preferred:
                group.create_task(lane(member))
        return answers, causes
