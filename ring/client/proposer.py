"""The client's side of record rounds: a CASPaxos proposer (rules in ``ring.paxos``).

``Proposer.run(key, step)`` decides the next value of one record: ``step`` maps the
register's current state to the proposal and whether the caller's operation succeeded
(a compare-and-set that finds another version proposes the state unchanged and fails, so
that the state it reports is chosen before it says so). A round is a prepare on the key's
R preferred peers, answered by ``R - W + 1`` promises, and an accept acknowledged by W.
A proposer pre-empted by a higher ballot backs off (randomized, doubling) and retries
above it, at most ``ROUND_ATTEMPTS_MAX`` times; under contention exactly one compare-and-
set of a version wins, and the others fail with ``RecordConflict``.

One round trip per replica in the common cases: a create may try the fast round first
(sent to a fast quorum of the acceptors, 4 of 5, each of which must accept; the last
acceptor is asked only in place of one that fails or stays silent past the hedge
delay, and repair copies the value to it later), and a writer that holds the promise
of its next ballot on a key (``_Held``, given with its last accept) skips the prepare
for its next change there.
Reads that find the value chosen need no round at all (``ring.client.records``).
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ring import api, paxos, records_api
from ring.client.view import Early, LatencyWindow, RingTracker, RingView
from ring.errors import ProtocolError, QuorumError, RecordContention, SR3Error
from ring.paxos import FAST, Ballot, Preempted, Slot, Value
from ring.placement import Member
from ring.transport import Transport

__all__ = ["Acceptors", "Proposer", "RoundStats", "Step"]

# Rounds one operation may take (pre-empted, or told to refresh its member table)
# before it gives up with ``RecordContention``; the backoff between them doubles from
# BACKOFF_S_MIN up to BACKOFF_S_MAX, randomized so that duelling proposers separate.
ROUND_ATTEMPTS_MAX = 24
BACKOFF_S_MIN = 0.004
BACKOFF_S_MAX = 0.4
# Keys whose next ballot (and last value) a proposer remembers for the one-round-trip
# path; the least recently used is forgotten past this.
HELD_KEYS_MAX = 4096
# ... and for at most this long: a promise is not a lease, but an old one is unlikely to
# still stand, and a slot collected since (a tombstone's TTL) must not take a stale value.
HELD_FOR_S = 60.0
SLOT_ANSWER_BYTES_MAX = paxos.SLOT_BYTES_MAX
# How long an operation waits out acceptors that answer 503 "syncing" (catching up on
# the key after a membership change) before it gives up with the QuorumError.
TRANSIENT_WAIT_S = 10.0


def transient_failure(causes: Sequence[str]) -> bool:
    return any("503 syncing" in cause for cause in causes)


# What ``step`` returns: the value to propose, and whether the operation succeeded.
Step = Callable[[Value], tuple[Value, bool]]


@dataclass(frozen=True, slots=True)
class Acceptors:
    """A key's acceptors as this client computes them."""

    members: tuple[Member, ...]
    replication: int
    write_quorum: int
    view: str
    # The configuration epoch the acceptors were computed under.
    epoch: int = 0

    @property
    def promise_quorum(self) -> int:
        return self.replication - self.write_quorum + 1

    @property
    def fast_quorum(self) -> int:
        """Acceptors that must take a ballot-0 value for it to be chosen (``paxos``)."""
        return paxos.fast_quorum(self.replication, self.promise_quorum)

    @property
    def fast_recoverable(self) -> int:
        """The fewest holders of a ballot-0 value that a recovery can take it from (a
        promise quorum less the acceptors a fast quorum leaves out): a fast value that
        fewer acceptors can ever hold is never chosen."""
        return max(1, self.promise_quorum - (self.replication - self.fast_quorum))

    @classmethod
    def of(cls, ring_view: RingView, key: str) -> Acceptors:
        group, _quorum = ring_view.record_quorums()
        members = ring_view.ring.preference_list(key, group)
        view = paxos.view_digest([member.peer_id for member in members])
        # A ring smaller than the group: every peer is an acceptor, and the quorums are
        # drawn from all of them.
        return cls(members, len(members), paxos.majority(len(members)), view, ring_view.epoch)


@dataclass(slots=True)
class RoundStats:
    """How record operations went, for benchmarks and ``sr3 status``-like reports."""

    operations: int = 0
    rounds: int = 0
    fast_creates: int = 0
    held_writes: int = 0
    preempted: int = 0
    # Fast rounds that asked the acceptor left out beside one silent past the hedge
    # delay, and those given up on for a classic round where no acceptor was left out.
    fast_hedges: int = 0
    fast_abandoned: int = 0
    rounds_histogram: dict[int, int] = field(default_factory=dict)

    def count(self, rounds: int) -> None:
        self.operations += 1
        self.rounds += rounds
        self.rounds_histogram[rounds] = self.rounds_histogram.get(rounds, 0) + 1


@dataclass(frozen=True, slots=True)
class _Held:
    """A promise this proposer holds on a key: ``ballot`` was promised, together with
    accepting ``value``, by at least ``R - W + 1`` of the acceptors ``view`` names."""

    ballot: Ballot
    value: Value
    view: str
    at: float


class _Refresh(SR3Error):
    """An acceptor computes other acceptors for the key, or is at another configuration
    epoch: refresh the member table (or give the acceptor time to learn the newer one)."""


@dataclass(frozen=True, slots=True)
class _ViewRefused:
    """An accept refused because the acceptor computes other acceptors for the key: an
    answer like the others, so that the acceptors that did accept are counted."""

    reason: str


class Proposer:
    def __init__(self, transport: Transport, view: RingTracker) -> None:
        self._transport = transport
        self._view = view
        self.id = secrets.token_hex(8)
        self._counters: OrderedDict[str, int] = OrderedDict()
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._rng = random.Random()
        self.read_latency = LatencyWindow()
        self.prepare_latency = LatencyWindow()
        self.accept_latency = LatencyWindow()
        self.stats = RoundStats()
        # Set by an accept of a value that may have reached an acceptor without being
        # known chosen: the operation's outcome is then unknown if it later finds another
        # value chosen above its own version (its write may be under it).
        self.exposed = False

    def new_op(self) -> str:
        """An id for one operation: its value names it, so a retried round knows it."""
        return secrets.token_hex(12)

    # -- one operation ------------------------------------------------------------------

    async def run(self, key: str, step: Step, *, create: Value | None = None) -> tuple[Value, bool]:
        """Decide ``key``'s next value with ``step``; the value chosen and whether the
        operation succeeded. ``create``: the value of a create, tried in the fast round
        first (it succeeds only if a fast quorum of acceptors never held the key)."""
        refresh = False
        causes: list[str] = []
        self.exposed = False
        mismatches = 0
        deadline = self._view.clock() + TRANSIENT_WAIT_S
        for attempt in range(1, ROUND_ATTEMPTS_MAX + 1):
            acceptors = await self.acceptors(key, mismatches if refresh else 0)
            refresh = False
            try:
                if attempt == 1:
                    shortcut = await self._shortcut(key, acceptors, step, create)
                    if shortcut is not None:
                        self.stats.count(attempt)
                        return shortcut
                outcome = await self._round(key, acceptors, step, causes)
            except _Refresh as exc:
                causes.append(str(exc))
                refresh = True
                mismatches += 1
                outcome = None
            except QuorumError as exc:
                # Acceptors that are catching up after a membership change (503 syncing)
                # answer within moments: wait them out, within TRANSIENT_WAIT_S.
                if not transient_failure(exc.causes) or self._view.clock() >= deadline:
                    raise
                causes.append(str(exc))
                await asyncio.sleep(self._backoff_s(attempt))
                continue
            if outcome is None and not refresh:
                outcome = await self._settled_by_others(key, acceptors, step)
            if outcome is not None:
                self.stats.count(attempt)
                return outcome
            await asyncio.sleep(self._backoff_s(attempt))
        raise RecordContention(
            f"record {key!r}: no round decided it in {ROUND_ATTEMPTS_MAX} attempts "
            f"(pre-empted by other writers, or acceptors disagreeing on the ring): "
            + "; ".join(causes[-3:])
        )

    async def acceptors(self, key: str, mismatches: int = 0) -> Acceptors:
        """The key's acceptors, from a member table refreshed after one acceptor named
        others (or another epoch), and from the newest configuration any peer serves
        after two: a seed that has not learned the newest epoch would otherwise be asked
        again."""
        if mismatches == 0:
            return Acceptors.of(await self._view.ring(), key)
        if mismatches == 1:
            return Acceptors.of(await self._view.ring(refresh=True), key)
        seen = await self._view.ring()
        wider = await self._view.wider_ring(seen)
        return Acceptors.of(wider or seen, key)

    # -- reading slots ------------------------------------------------------------------

    async def _slot_at(self, member: Member, key: str, acceptors: Acceptors) -> Slot:
        answer = await self._transport.request(
            member.address,
            api.RECORD_GET.method,
            records_api.record_round_path(key, acceptors.view, acceptors.epoch),
            body_bytes_max=SLOT_ANSWER_BYTES_MAX,
        )
        slot, _meta = paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)
        return slot

    async def read_slots(self, key: str, acceptors: Acceptors) -> tuple[list[Slot], list[str]]:
        """The acceptors' slots for ``key`` (returning as soon as they show the value
        chosen), and why the others failed."""

        def enough(answers: Sequence[tuple[Member, Slot]], _running: int) -> bool:
            slots = [slot for _m, slot in answers]
            chosen = paxos.chosen_value(slots, acceptors.replication, acceptors.write_quorum)
            return chosen is not None

        def will_do(answers: Sequence[tuple[Member, Slot]], _running: int) -> bool:
            # Enough for a round: when the others stay silent past the patience (a
            # frozen acceptor whose slot might have shown the value chosen), the caller
            # runs one instead of waiting out the attempt.
            return len(answers) >= acceptors.promise_quorum

        result = await self._view.fan_out(
            acceptors.members,
            acceptors.replication,
            lambda member, _hint: self._slot_at(member, key, acceptors),
            strict=True,
            # Stragglers finish in the background: a cancelled request costs its
            # connection (over TLS, a new handshake for the next round).
            early=Early(
                enough,
                grace_s=0.0,
                background=True,
                will_do=will_do,
                patience_s=self.read_latency.delay_s(),
            ),
            attempt_s=self._view.options.read_attempt_s,
            latency=self.read_latency,
        )
        return [slot for _m, slot in result.answers], result.causes

    async def _settled_by_others(
        self, key: str, acceptors: Acceptors, step: Step
    ) -> tuple[Value, bool] | None:
        """After a pre-emption: the outcome, if the value another writer got chosen
        already decides it (a compare-and-set it defeats, this writer's own value, or a
        read), so that a loser learns it lost from one read instead of more rounds."""
        slots, _failed = await self.read_slots(key, acceptors)
        chosen = paxos.chosen_value(slots, acceptors.replication, acceptors.write_quorum)
        if chosen is None:
            return None
        proposal, ok = step(chosen)
        return (chosen, ok) if proposal == chosen else None

    def _backoff_s(self, attempt: int) -> float:
        ceiling = min(BACKOFF_S_MAX, BACKOFF_S_MIN * 2 ** (attempt - 1))
        return self._rng.uniform(ceiling / 2, ceiling)

    async def _shortcut(
        self, key: str, acceptors: Acceptors, step: Step, create: Value | None
    ) -> tuple[Value, bool] | None:
        """One round trip instead of two: the promise this writer holds, or a fast
        create. None when neither applies or it did not decide the value."""
        held = self._held.pop(key, None)
        fresh_enough = held is not None and self._view.clock() - held.at < HELD_FOR_S
        if held is not None and fresh_enough and held.view == acceptors.view:
            proposal, ok = step(held.value)
            fresh = ok and proposal != held.value
            if fresh and await self._accept(
                key, acceptors, held.ballot, proposal, hold=True, mine=True
            ):
                self.stats.held_writes += 1
                return proposal, True
            return None
        if (
            create is not None
            and key not in self._counters
            and await self._accept(key, acceptors, FAST, create, hold=True, mine=True)
        ):
            self.stats.fast_creates += 1
            return create, True
        return None

    async def _round(
        self, key: str, acceptors: Acceptors, step: Step, causes: list[str]
    ) -> tuple[Value, bool] | None:
        """Prepare and accept at one ballot; None when pre-empted (retry higher)."""
        ballot = self._next_ballot(key)
        promises = await self._prepare(key, acceptors, ballot, causes)
        if promises is None:
            return None
        _ballot, current = paxos.recovered_value(
            promises, acceptors.replication, acceptors.fast_quorum
        )
        proposal, ok = step(current)
        mine = ok and proposal != current
        if await self._accept(key, acceptors, ballot, proposal, hold=ok, mine=mine, causes=causes):
            return proposal, ok
        return None

    def _next_ballot(self, key: str) -> Ballot:
        counter = self._counters.get(key, 0) + 1
        if counter > paxos.COUNTER_MAX:
            raise ProtocolError(f"record {key!r}: its ballots reached {paxos.COUNTER_MAX}")
        self._note_counter(key, counter)
        return Ballot(counter, self.id)

    def _note_counter(self, key: str, counter: int) -> None:
        if counter > self._counters.get(key, 0):
            self._counters[key] = counter
        self._counters.move_to_end(key)
        while len(self._counters) > HELD_KEYS_MAX:
            self._counters.popitem(last=False)

    def _preempted_by(self, key: str, ballot: Ballot) -> None:
        self.stats.preempted += 1
        self._note_counter(key, ballot.counter)

    # -- prepare ------------------------------------------------------------------------

    async def _prepare_at(
        self, member: Member, key: str, ballot: Ballot, acceptors: Acceptors
    ) -> Slot | Preempted:
        answer = await self._transport.request(
            member.address,
            api.PAXOS_PREPARE.method,
            records_api.prepare_path(key, ballot.wire(), acceptors.view, acceptors.epoch),
            body_bytes_max=SLOT_ANSWER_BYTES_MAX,
            ok=(200, 409),
        )
        if answer.status == 409:
            return _refusal(answer.body)
        slot, _meta = paxos.decode_slot(answer.body, api.RECORD_BYTES_MAX)
        return slot

    async def _prepare(
        self, key: str, acceptors: Acceptors, ballot: Ballot, causes: list[str]
    ) -> list[Slot] | None:
        needed = acceptors.promise_quorum

        def settled(answers: Sequence[tuple[Member, Slot | Preempted]], running: int) -> bool:
            promised = sum(1 for _m, answer in answers if isinstance(answer, Slot))
            return promised >= needed or promised + running < needed

        result = await self._view.fan_out(
            acceptors.members,
            acceptors.replication,
            lambda member, _hint: self._prepare_at(member, key, ballot, acceptors),
            strict=True,
            early=Early(settled, grace_s=0.0, background=True),
            attempt_s=self._view.options.write_attempt_s,
            latency=self.prepare_latency,
        )
        promises = [answer for _m, answer in result.answers if isinstance(answer, Slot)]
        refusals = [answer for _m, answer in result.answers if isinstance(answer, Preempted)]
        if len(promises) >= needed:
            return promises
        if refusals:
            self._preempted_by(key, max(refusal.promised for refusal in refusals))
            causes.append(f"ballot {ballot.wire()} pre-empted")
            return None
        causes.extend(result.causes)
        raise QuorumError(f"record {key!r} (prepare)", len(promises), needed, result.causes)

    # -- accept -------------------------------------------------------------------------

    async def _accept_at(
        self,
        member: Member,
        key: str,
        ballot: Ballot,
        body: bytes,
        acceptors: Acceptors,
        following: str | None,
    ) -> bool | Preempted | _ViewRefused:
        answer = await self._transport.request(
            member.address,
            api.PAXOS_ACCEPT.method,
            records_api.accept_path(key, ballot.wire(), acceptors.view, following, acceptors.epoch),
            body=body,
            ok=(200, 409),
        )
        if answer.status == 409:
            try:
                return _refusal(answer.body)
            except _Refresh as exc:
                return _ViewRefused(str(exc))
        return True

    async def _accept(
        self,
        key: str,
        acceptors: Acceptors,
        ballot: Ballot,
        value: Value,
        *,
        hold: bool,
        mine: bool = False,
        causes: list[str] | None = None,
    ) -> bool:
        """Whether ``value`` was chosen at ``ballot``: accepted by W acceptors, or by a
        fast quorum at ballot 0. The fast round asks only a fast quorum of them (the
        others stand in for one that fails or is silent past the hedge delay): every one
        must accept, and asking the rest would only cost their work. With ``hold``, each
        accept also promises this proposer's next ballot, which it keeps for the next
        change when enough acceptors gave it."""
        fast = ballot == FAST
        needed = acceptors.fast_quorum if fast else acceptors.write_quorum
        holding = max(acceptors.write_quorum, acceptors.promise_quorum)
        counter = max(ballot.counter, self._counters.get(key, 0)) + 1
        # None past the last ballot there is: nothing to promise after it.
        following = Ballot(counter, self.id) if counter <= paxos.COUNTER_MAX else None
        if following is not None:
            # Noted before sending: a later prepare of this proposer goes above it.
            self._note_counter(key, following.counter)
        next_wire = None if following is None else following.wire()
        body = paxos.encode_slot(Slot(ballot, ballot, value))

        def settled(
            answers: Sequence[tuple[Member, bool | Preempted | _ViewRefused]], running: int
        ) -> bool:
            acks = sum(1 for _m, answer in answers if answer is True)
            if acks >= needed:
                return acks >= holding or running == 0
            # A failed fast round hears every acceptor it asked: how many refused tells
            # whether its value can still be chosen (``fast_refused`` below).
            return running == 0 if fast else acks + running < needed

        # The fast round's lanes move on to the acceptors it did not ask first, and one
        # silent past the hedge delay has the next of those asked beside it; where there
        # is none (groups of three or fewer: every acceptor is in the fast quorum), the
        # round is given up on after that delay and a classic round, which needs only a
        # majority, decides (``run``).
        delay_s = self.accept_latency.delay_s()
        spare = fast and acceptors.replication > needed
        result = await self._view.fan_out(
            acceptors.members,
            needed if fast else acceptors.replication,
            lambda member, _hint: self._accept_at(member, key, ballot, body, acceptors, next_wire),
            strict=not fast,
            early=Early(
                settled,
                grace_s=0.0,
                background=True,
                will_do=_anything if fast and not spare else None,
                patience_s=delay_s,
            ),
            attempt_s=self._view.options.write_attempt_s,
            latency=self.accept_latency,
            hedge_s=delay_s if spare else None,
        )
        acks = sum(1 for _m, answer in result.answers if answer is True)
        if result.hedged:
            self.stats.fast_hedges += 1
        elif fast and result.unfinished and acks < needed:
            self.stats.fast_abandoned += 1
        refusals = [answer for _m, answer in result.answers if isinstance(answer, Preempted)]
        if acks >= needed:
            if hold and following is not None and acks >= holding:
                self._held[key] = _Held(following, value, acceptors.view, self._view.clock())
                self._held.move_to_end(key)
                while len(self._held) > HELD_KEYS_MAX:
                    self._held.popitem(last=False)
            return True
        # A fast-round value that no acceptor took, or that fewer acceptors than a
        # recovery takes it from can ever hold (those that refused it hold another or
        # promised a classic ballot; the others may still take it, from this accept or
        # from repair copying it from one that did), is never chosen; any other value
        # that reached an acceptor, or may have, can still be chosen by a later round.
        unsure = bool(result.unfinished or result.causes)
        none_took = len(refusals) == len(result.answers) and not unsure
        fast_refused = fast and (
            none_took or acceptors.replication - len(refusals) < acceptors.fast_recoverable
        )
        if mine and not fast_refused and (acks or unsure):
            self.exposed = True
        if refusals:
            self._preempted_by(key, max(refusal.promised for refusal in refusals))
            if causes is not None:
                causes.append(f"ballot {ballot.wire()} pre-empted at accept")
            return False
        if fast:
            return False
        views = [answer for _m, answer in result.answers if isinstance(answer, _ViewRefused)]
        if views:
            # Raised only now: the exposure above must be noted first (a write that some
            # acceptors took may be chosen by the rounds that follow the refresh).
            raise _Refresh(views[0].reason)
        if causes is not None:
            causes.extend(result.causes)
        raise QuorumError(f"record {key!r}", acks, needed, result.causes)

    def forget(self, key: str) -> None:
        """Drop the promise held on ``key`` (its value may have changed elsewhere)."""
        self._held.pop(key, None)


def _anything(_answers: Sequence[tuple[Member, object]], _running: int) -> bool:
    """Any answers will do (once the patience ran out, the caller goes on without)."""
    return True


def _refusal(body: bytes) -> Preempted:
    """A 409's ballot (pre-empted), or ``_Refresh`` (the acceptor names other peers)."""
    error = api.parse_error(body)
    if error.code in ("view", "epoch"):
        raise _Refresh(error.message)
    if error.code != "preempted":
        raise ProtocolError(f"unexpected 409 from an acceptor: {error.code}")
    try:
        promised = api.load_json(body).get("promised")
    except (ProtocolError, AttributeError) as exc:
        raise ProtocolError("a pre-emption names the ballot promised") from exc
    return Preempted(Ballot.parse(promised if isinstance(promised, str) else None, "promised"))
