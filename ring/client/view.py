"""The client's view of the ring: the member table it places with, which peers it
suspects down, and the fan-out of one operation over a key's replicas.

The member table comes from any reachable seed (``GET /v1/ring``) and is cached for
``ring_refresh_s``. A peer that could not be reached is tried last for ``down_retry_s``.
One peer's table can be partial (a peer that joined moments ago has not heard of every
member yet, or it has not learned the newest configuration), so after a miss
``wider_ring`` asks every known peer and keeps the newest configuration served.

A frozen peer (gray failure: it accepts connections but never answers) must not hold a
call for the transport's read timeout. ``fan_out`` may return early: a write once W
replicas acknowledged, a read once enough replicas answered, each after a short grace
for the others, measured (``LatencyWindow``: the p95 of recent answers, clamped). Write
lanes still running then finish in the background, at most ``background_lanes_max`` of
them, each attempt bounded by ``write_attempt_s`` (then a stand-in with a hint takes
over), and ``aclose`` awaits them; read lanes still running are cancelled. Where every
asked peer must answer (a create's fast round), a lane silent past the same measured
delay is hedged: the next candidate is asked beside it. Where answers that will do may
still be bettered by a silent peer's (a record read whose slots do not show the value
chosen yet), the silent ones get that delay as patience, and the caller goes on without
them (it runs a round). So a frozen peer costs a call at most ``HEDGE_DELAY_S_MAX``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ring import api, paxos
from ring.client.options import ClientOptions
from ring.cluster import INTERNAL_NETWORK
from ring.errors import ConfigError, PeerError, PeerUnavailable, ProtocolError
from ring.placement import Member, Ring
from ring.transport import Transport

__all__ = [
    "Early",
    "FanOut",
    "LatencyWindow",
    "RingTracker",
    "RingView",
    "added_members",
    "hedge_delay_s",
    "parse_seeds",
    "newest_view",
]

T = TypeVar("T")
log = logging.getLogger(__name__)

STATUS_TIMEOUT_S = 3.0
# Widening the member table after a miss (``RingTracker.wider_ring``): at most once per
# interval, at most this many peers asked at once, each within STATUS_TIMEOUT_S.
WIDEN_INTERVAL_S = 1.0
WIDEN_CONCURRENCY = 16
# Fetching the member table: at most this many peers asked at once, the next one asked
# when those were silent past the hedge delay of recent fetches.
RING_ASKS_MAX = 3
# Hedging and stragglers (``LatencyWindow``): the quantile of recent answer latencies
# after which a request still waiting is hedged, and its bounds. The floor keeps normal
# jitter from doubling the load; the ceiling bounds what a frozen peer costs a call.
HEDGE_QUANTILE = 0.95
HEDGE_DELAY_S_MIN = 0.005
HEDGE_DELAY_S_MAX = 1.0
HEDGE_DELAY_S_UNMEASURED = 0.25
LATENCY_SAMPLES_MAX = 256
LATENCY_SAMPLES_MIN = 16
LATENCY_RECOMPUTE_EVERY = 16


@dataclass(frozen=True, slots=True)
class RingView:
    ring: Ring
    replication: int
    write_quorum: int
    # peer id -> "up" / "down", as the answering peer sees it
    states: Mapping[str, str]
    fetched_at: float
    # The ring's own R and W (a client may choose others for chunks): records' consensus
    # rounds use these, so that every proposer's quorums meet every other's.
    ring_replication: int = 0
    ring_write_quorum: int = 0
    # The configuration epoch of these members: every record round carries it.
    epoch: int = 0
    # The network whose addresses the members carry, and the peer that described them.
    network: str = INTERNAL_NETWORK
    source: str = ""

    def record_quorums(self) -> tuple[int, int]:
        """A record's acceptors and the quorum of its rounds: ``2R - 1`` of the ring's
        own R (``paxos.record_group``), capped by the ring's size, and a majority of them.
        Every proposer and acceptor derives both from the configuration alone, never
        from which peers are up."""
        group = min(paxos.record_group(self.ring_replication or self.replication), len(self.ring))
        return group, paxos.majority(group)


def parse_seeds(ring: str | Sequence[str]) -> tuple[str, ...]:
    seeds = ring.split(",") if isinstance(ring, str) else list(ring)
    cleaned = tuple(seed.strip() for seed in seeds if seed.strip())
    if not cleaned:
        raise ConfigError("no ring address given (host:port of any peer)")
    for seed in cleaned:
        host, _, port = seed.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()):
            raise ConfigError(f"ring address {seed!r} is not host:port")
    return cleaned


def newest_view(views: Sequence[RingView]) -> RingView:
    """The view of the newest configuration among ``views`` (members are decided, one
    epoch at a time: an older view is a subset in time, never a part to merge)."""
    return max(views, key=lambda view: (view.epoch, len(view.ring)))


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
        self._slow_until: dict[str, float] = {}
        # Addresses that did not give their member table lately (``ring``).
        self._silent_until: dict[str, float] = {}
        self.ring_latency = LatencyWindow()
        # Write lanes still running after their call returned (``fan_out``).
        self._background: set[asyncio.Task[None]] = set()
        self.background_dropped = 0
        self._widening = asyncio.Lock()
        self._widened_at = float("-inf")
        # Member address -> where it came from, for errors that name it (the last view).
        self._advertised: dict[str, str] = {}
        transport.describe_address = self.describe_address

    def describe_address(self, address: str) -> str | None:
        """Where a member address came from ("peer-1's address on the 'internal'
        network, as 127.0.0.1:7401 described the ring"), or None for a seed."""
        return self._advertised.get(address)

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
        fetched = await self._first_ring(self._fetch_order([*self.seeds, *known]), causes)
        if fetched is None:
            raise PeerUnavailable(",".join(self.seeds), "no peer answered: " + "; ".join(causes))
        self._view = fetched
        return fetched

    def _fetch_order(self, addresses: Sequence[str]) -> list[str]:
        """``addresses`` once each, in order, those of peers believed down or silent
        lately last."""
        view = self._view
        members = view.ring.members if view is not None else []
        doubtful = {m.address for m in members if self.is_down(m) or self.is_slow(m)}
        now = self._clock()
        return sorted(
            dict.fromkeys(addresses),
            key=lambda a: a in doubtful or self._silent_until.get(a, 0.0) > now,
        )

    async def _first_ring(self, addresses: Sequence[str], causes: list[str]) -> RingView | None:
        """The member table of the first of ``addresses`` that answers. One silent past
        the ring's hedge delay does not hold the others: the next is asked too, at most
        ``RING_ASKS_MAX`` at once, each within ``STATUS_TIMEOUT_S``."""
        walk = iter(addresses)
        running: dict[asyncio.Task[RingView], tuple[str, float]] = {}

        async def ask(address: str) -> RingView:
            async with asyncio.timeout(STATUS_TIMEOUT_S):
                return await self._ring_from(address)

        def launch() -> bool:
            address = next(walk, None)
            if address is not None:
                running[asyncio.create_task(ask(address))] = (address, self._clock())
            return address is not None

        exhausted = not launch()
        try:
            while running:
                may_hedge = not exhausted and len(running) < RING_ASKS_MAX
                delay_s = self.ring_latency.delay_s() if may_hedge else None
                done, _ = await asyncio.wait(
                    running, timeout=delay_s, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    exhausted = not launch()
                for task in done:
                    address, started = running.pop(task)
                    try:
                        answer = task.result()
                    except (PeerError, TimeoutError) as exc:
                        causes.append(str(exc) or f"{address}: no answer in time")
                        self._silent_until[address] = self._clock() + self.options.down_retry_s
                        exhausted = exhausted or not launch()
                        continue
                    self.ring_latency.add(self._clock() - started)
                    for other, _started in running.values():
                        self._silent_until[other] = self._clock() + self.options.down_retry_s
                    return answer
            return None
        finally:
            await _cancel_all(running)

    async def wider_ring(self, seen: RingView) -> RingView | None:
        """After data was on no member of ``seen`` (or an acceptor was at another epoch):
        the newest configuration the seeds and every member of ``seen`` serve, if it is
        newer than ``seen`` or names members ``seen`` lacks.

        A peer that has not yet learned the newest epoch serves an older member set. The
        newest becomes this client's view. Widening asks every peer, so it runs at most
        once per ``WIDEN_INTERVAL_S``; calls in between get its result."""
        async with self._widening:
            if self._clock() - self._widened_at >= WIDEN_INTERVAL_S:
                addresses = [*self.seeds, *(member.address for member in seen.ring.members)]
                views = await self._ring_answers(list(dict.fromkeys(addresses)))
                self._widened_at = self._clock()
                if views:
                    newest = newest_view(views)
                    if self._view is None or newest.epoch >= self._view.epoch:
                        self._view = newest
            view = self._view
        if view is None:
            return None
        known = {member.peer_id for member in seen.ring.members}
        added = any(m.peer_id not in known for m in view.ring.members)
        return view if added or view.epoch > seen.epoch else None

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
        return self._parse_ring(answer.json(), address)

    def _network(self, description: api.RingDescription, source: str) -> str:
        """The network to reach members on: the one chosen (``ClientOptions.network``),
        else the one ``source`` (the address the description came from) is on, else
        the one used so far."""
        if self.options.network is not None:
            return self.options.network
        for member in description.members:
            if member.address == source:
                return INTERNAL_NETWORK
            for name, address in member.networks:
                if address == source:
                    return name
        return self._view.network if self._view is not None else INTERNAL_NETWORK

    def _parse_ring(self, answer: object, source: str) -> RingView:
        description = api.RingDescription.from_json(answer)
        network = self._network(description, source)
        members = [
            Member(m.peer_id, m.address_on(network) or m.address, m.zone)
            for m in description.members
        ]
        self._advertised = {
            member.address: f"{member.peer_id}'s address on the {network!r} network, "
            f"as {source} described the ring"
            for member in members
        }
        states = {m.peer_id: m.state for m in description.members}
        try:
            ring = Ring.build(members, vnodes=description.vnodes, zone_aware=description.zone_aware)
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed ring description: {exc!r}") from exc
        replication = self.options.replication or description.replication
        write_quorum = self.options.write_quorum or description.write_quorum
        if not 1 <= write_quorum <= replication:
            raise ConfigError(f"write quorum {write_quorum} must be in 1..R={replication}")
        return RingView(
            ring, replication, write_quorum, states, self._clock(),
            description.replication, description.write_quorum, description.epoch,
            network, source,
        )  # fmt: skip

    # -- suspicion ----------------------------------------------------------------------

    def mark_down(self, member: Member) -> None:
        self._down_until[member.peer_id] = self._clock() + self.options.down_retry_s

    def is_down(self, member: Member) -> bool:
        if self._down_until.get(member.peer_id, 0.0) > self._clock():
            return True
        view = self._view
        return view is not None and view.states.get(member.peer_id) == "down"

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def live_first(self, members: Sequence[Member]) -> list[Member]:
        """``members`` in order, those outpaced lately after the others and those believed
        down last."""
        return sorted(members, key=lambda m: 2 if self.is_down(m) else int(self.is_slow(m)))

    def probe_limit_s(self, member: Member) -> float | None:
        """How long ``member`` gets to answer: briefly if it is believed down (it may have
        come back, or it may be frozen and never answer), else the transport's timeouts."""
        return self.options.down_probe_s if self.is_down(member) else None

    def note_slow(self, member: Member) -> None:
        """``member`` was outpaced: a hedge to another replica answered first while it
        stayed silent. Reads ask it after the others for ``down_retry_s``; writes still
        use it (slow is not down)."""
        self._slow_until[member.peer_id] = self._clock() + self.options.down_retry_s

    def is_slow(self, member: Member) -> bool:
        return self._slow_until.get(member.peer_id, 0.0) > self._clock()

    # -- fan-out ------------------------------------------------------------------------

    async def fan_out(
        self,
        candidates: Sequence[Member],
        count: int,
        op: Callable[[Member, Member | None], Awaitable[T]],
        *,
        strict: bool = False,
        early: Early[T] | None = None,
        attempt_s: float | None = None,
        latency: LatencyWindow | None = None,
        hedge_s: float | None = None,
    ) -> FanOut[T]:
        """Run ``op`` on the first ``count`` candidates at once. A lane whose peer is
        known down, or fails (PeerError), or does not answer within ``attempt_s``, moves
        on to the next unused candidate, live ones first, and passes ``op`` the peer it
        stands in for (writes leave a hint for it). With ``strict``, only the preferred
        peers are asked, each whatever the client believes of it.

        Without ``early``, every lane is awaited. With it, the fan-out returns once
        ``early.enough`` holds and the lanes still running have had ``early.grace_s``:
        those are then handed to the background (``early.background``) or cancelled.
        ``latency`` hears how long each answer took.

        With ``hedge_s`` (not with ``strict``), lanes still running that long without
        ``early.enough`` each get a second lane on the next unused candidate, which
        stands in for the silent peer while its own request goes on (``hedged``)."""
        preferred = list(candidates[:count])
        last_resort = [member for member in preferred if self.is_down(member)]
        spares = iter(self.live_first(candidates[count:]) + last_resort)
        if strict:
            spares = iter(())
        result: FanOut[T] = FanOut()
        lanes = _Lanes(self, op, spares, attempt_s, latency, result)

        def first_peer(member: Member) -> Member | None:
            return next(spares, None) if self.is_down(member) and not strict else member

        first = {lanes.start(member, first_peer(member)) for member in preferred}
        try:
            running = await self._await_lanes(
                first, result, early, None if strict else hedge_s, lanes.hedge
            )
        except BaseException:
            await _cancel_all(lanes.tasks)
            raise
        result.unfinished = len(running)
        if running and early is not None and early.background:
            await self._to_background(running)
        else:
            await _cancel_all(running)
        return result

    async def _await_lanes(
        self,
        running: set[asyncio.Task[None]],
        result: FanOut[T],
        early: Early[T] | None,
        hedge_s: float | None,
        hedge: Callable[[set[asyncio.Task[None]]], set[asyncio.Task[None]]],
    ) -> set[asyncio.Task[None]]:
        """Wait until every lane ended, or ``early`` says the answers are enough and the
        grace has passed, or they will do and its patience ran out; the lanes still
        running. Once ``hedge_s`` passed, ``hedge`` adds lanes for the silent ones. A
        lane's unexpected error is raised."""
        hedge_at = None if hedge_s is None else self._clock() + hedge_s
        patience_ends: float | None = None
        while running:
            if early is not None and early.enough(result.answers, len(running)):
                if early.grace_s > 0:
                    done, running = await asyncio.wait(running, timeout=early.grace_s)
                    _raise_unexpected(done)
                break
            now = self._clock()
            patience_s = None if patience_ends is not None else _patience_s(early, result, running)
            if patience_s is not None:
                patience_ends = now + patience_s
            if patience_ends is not None and now >= patience_ends:
                break
            if hedge_at is not None and now >= hedge_at:
                hedge_at = None
                running |= hedge(running)
            wake = [at for at in (hedge_at, patience_ends) if at is not None]
            done, running = await asyncio.wait(
                running,
                timeout=max(0.0, min(wake) - now) if wake else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            _raise_unexpected(done)
        return running

    async def _to_background(self, lanes: set[asyncio.Task[None]]) -> None:
        """Keep lanes running after their call returned, tracked and bounded: past
        ``background_lanes_max`` they are cancelled (a write's copy is left to repair)."""
        room = max(0, self.options.background_lanes_max - len(self._background))
        kept = list(lanes)[:room]
        dropped = list(lanes)[room:]
        for task in kept:
            self._background.add(task)
            task.add_done_callback(self._background_done)
        if dropped:
            self.background_dropped += len(dropped)
            log.info("%d write lanes dropped: %d already in the background; repair restores "
                     "the copies", len(dropped), len(self._background))  # fmt: skip
            await _cancel_all(dropped)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.warning("a write lane in the background failed: %r", error)

    def background_lanes(self) -> int:
        """Write lanes still running after their call returned."""
        return len(self._background)

    async def aclose(self) -> None:
        """Let the write lanes still in the background finish (each attempt is bounded by
        ``write_attempt_s``), at most ``close_wait_s``; cancel the rest."""
        lanes = set(self._background)
        if lanes:
            _done, running = await asyncio.wait(lanes, timeout=self.options.close_wait_s)
            if running:
                log.info("closing: %d write lanes cancelled; repair restores the copies",
                         len(running))  # fmt: skip
            await _cancel_all(running)


class _Lanes(Generic[T]):
    """The lanes of one fan-out. A lane asks one peer, then, if that peer is silent past
    ``attempt_s`` or fails, the next unused candidate (``spares``), and passes ``op`` the
    preferred peer it stands in for. A hedge starts a second lane for a silent one."""

    def __init__(
        self,
        tracker: RingTracker,
        op: Callable[[Member, Member | None], Awaitable[T]],
        spares: Iterator[Member],
        attempt_s: float | None,
        latency: LatencyWindow | None,
        result: FanOut[T],
    ) -> None:
        self._tracker = tracker
        self._op = op
        self._spares = spares
        self._attempt_s = attempt_s
        self._latency = latency
        self._result = result
        # Every lane started, by the preferred peer it answers for, in order.
        self.tasks: dict[asyncio.Task[None], Member] = {}
        self._first: list[asyncio.Task[None]] = []

    def start(
        self, original: Member, first: Member | None, *, hedge: bool = False
    ) -> asyncio.Task[None]:
        """A lane for ``original`` that asks ``first`` first (a spare for a hedge)."""
        task = asyncio.create_task(self._lane(original, first))
        self.tasks[task] = original
        if not hedge:
            self._first.append(task)
        return task

    def hedge(self, running: set[asyncio.Task[None]]) -> set[asyncio.Task[None]]:
        """A lane on the next unused candidate beside each first lane still running, in
        preference order, while candidates are left."""
        hedges = set()
        for task in self._first:
            spare = next(self._spares, None) if task in running else None
            if spare is not None:
                hedges.add(self.start(self.tasks[task], spare, hedge=True))
        self._result.hedged += len(hedges)
        return hedges

    async def _lane(self, original: Member, member: Member | None) -> None:
        tracker, result = self._tracker, self._result
        while member is not None:
            limit_s = tracker.probe_limit_s(member)
            limit_s = self._attempt_s if limit_s is None else limit_s
            try:
                stand_in_for = None if member is original else original
                started = tracker.clock()
                async with asyncio.timeout(limit_s):
                    answer = await self._op(member, stand_in_for)
                if self._latency is not None:
                    self._latency.add(tracker.clock() - started)
                result.answers.append((member, answer))
                return
            except TimeoutError:
                result.causes.append(f"{member.address}: no answer within {limit_s} s")
                tracker.mark_down(member)
            except PeerError as exc:
                result.causes.append(str(exc))
                if isinstance(exc, PeerUnavailable):
                    tracker.mark_down(member)
            member = next(self._spares, None)


def _patience_s(
    early: Early[T] | None, result: FanOut[T], running: set[asyncio.Task[None]]
) -> float | None:
    """The patience the lanes still running get, once ``early.will_do`` holds; else None."""
    if early is None or early.will_do is None or not early.will_do(result.answers, len(running)):
        return None
    return early.patience_s


@dataclass(slots=True)
class FanOut(Generic[T]):
    """What a fan-out gathered: the answers (who gave each), why peers failed, and how
    many lanes were still running when it returned."""

    answers: list[tuple[Member, T]] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    unfinished: int = 0
    # Lanes started on a spare candidate because a lane was silent past ``hedge_s``.
    hedged: int = 0


@dataclass(frozen=True, slots=True)
class Early(Generic[T]):
    """When a fan-out may return before every lane ended: once ``enough(answers,
    lanes_running)`` holds, lanes still running get ``grace_s`` more, then go to the
    background (``background``: bounded and awaited on close; record rounds and writes,
    whose requests are small and sent already: cancelling one costs its connection, and
    over TLS a new handshake) or are cancelled.

    ``will_do``, when given, names answers that will do if ``enough`` does not come:
    once it holds, the lanes still running get ``patience_s`` to make ``enough`` hold,
    and then the fan-out returns with what it has (a record read whose answers do not
    show the value chosen runs a round rather than wait for a silent acceptor's slot)."""

    enough: Callable[[Sequence[tuple[Member, T]], int], bool]
    grace_s: float
    background: bool
    will_do: Callable[[Sequence[tuple[Member, T]], int], bool] | None = None
    patience_s: float = 0.0


class LatencyWindow:
    """The latencies of recent answers of one kind, and the delay after which a request
    still waiting is hedged (or its stragglers given up on): their ``HEDGE_QUANTILE``,
    clamped to [``HEDGE_DELAY_S_MIN``, ``HEDGE_DELAY_S_MAX``]; ``HEDGE_DELAY_S_UNMEASURED``
    until ``LATENCY_SAMPLES_MIN`` answers were seen."""

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=LATENCY_SAMPLES_MAX)
        self._delay_s = HEDGE_DELAY_S_UNMEASURED
        self._added = 0

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        self._added += 1
        # Sorting 256 floats per answer would cost more than the answers it hedges.
        if len(self._samples) >= LATENCY_SAMPLES_MIN and (
            self._added % LATENCY_RECOMPUTE_EVERY == 0 or len(self._samples) == LATENCY_SAMPLES_MIN
        ):
            self._delay_s = hedge_delay_s(list(self._samples))

    def delay_s(self) -> float:
        return self._delay_s


def hedge_delay_s(samples: Sequence[float]) -> float:
    """The ``HEDGE_QUANTILE`` of ``samples`` (nearest rank), clamped."""
    ordered = sorted(samples)
    rank = max(0, math.ceil(HEDGE_QUANTILE * len(ordered)) - 1)
    return min(HEDGE_DELAY_S_MAX, max(HEDGE_DELAY_S_MIN, ordered[rank]))


def _raise_unexpected(done: set[asyncio.Task[None]]) -> None:
    """Lanes handle peer failures; anything else (a bug, bad credentials) is raised."""
    errors = [task.exception() for task in done if not task.cancelled()]
    for error in errors:
        if error is not None:
            raise error


async def _cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until they ended (their errors are collected)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
