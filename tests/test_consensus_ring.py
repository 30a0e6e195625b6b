"""Records by consensus on real peers, judged by the linearizability checker.

What breaks and what must hold:

- A 5-peer ring with short timings runs concurrent clients doing compare-and-set writes,
  deletes and reads on a few keys while a seeded nemesis SIGKILLs and restarts peers,
  freezes them (SIGSTOP/SIGCONT), adds a sixth peer and makes another leave. Every
  acknowledged write, every conflict and every read must fit one register per key
  (``tests/linearizability.py``); calls that failed without an answer count as unknown.
- The same kind of workload with a proposer that skips phase 1 (it accepts without
  asking for promises) must be caught: the checker has to find a violation, else it
  proves nothing about the healthy runs.
- Eight writers race to create the same key, round after round: exactly one wins, the
  others are told version 1 is chosen, the winner's value reads back, also after one of
  the key's acceptors was SIGKILLed.

Seeds come from the ``rng`` fixture (replay with ``SR3_TEST_SEED``); each test prints
what it did (calls, outcomes, nemesis steps) so a failure can be replayed and compared.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from linearizability import CheckResult, Kind, Operation, Outcome, Record, check_key
from support import SEED, SEED_ENV, MakeCluster

from ring import paxos
from ring.client import Client
from ring.client.proposer import Acceptors, Proposer
from ring.errors import RecordConflict, SR3Error
from ring.paxos import Ballot, Slot
from sr3.local import LocalCluster

# Short timings: a dead peer is suspected within 1.5 s and taken out of placement after
# 4 s more, so membership changes settle within the run.
PEER_FLAGS = [
    "--failure-timeout", "1.5",
    "--removal-grace", "4",
    "--gossip-interval", "0.2",
    "--repair-interval", "0.5",
    "--scrub-rate", "0",
]  # fmt: skip

# One call bounded in time: past this it is recorded as unknown (it may still land).
CALL_TIMEOUT_S = 30.0
STEP_BUDGET = 20_000_000
# Bounds of the history test: the nemesis script runs about NEMESIS_S, the clients stop
# with it or at CALLS_MAX calls, whichever comes first.
HISTORY_CLIENTS = 6
HISTORY_KEYS = ("lin/a", "lin/b", "lin/c", "lin/d")
NEMESIS_S = 75.0
CALLS_MAX = 12_000
# A client's pause between calls: paced so that the calls last through the nemesis script
# (join and leave included) on a fast machine too, about 100 calls a second in all.
CLIENT_PAUSE_S = (0.02, 0.08)
# Impairments the nemesis applies one at a time; how long each lasts.
KILL_S = (0.5, 6.0)
FREEZE_S = (0.5, 4.0)
PAUSE_S = (0.5, 2.5)
LEAVE_TIMEOUT_S = 90.0
RESTART_TIMEOUT_S = 60.0


# -- recording a history ---------------------------------------------------------------


@dataclass
class Workload:
    """The calls clients made (as checker operations) and what else was seen."""

    keys: tuple[str, ...]
    calls_max: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    history: list[Operation] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    # Answers no register gives, seen directly (a CAS acknowledged at another version).
    anomalies: list[str] = field(default_factory=list)
    started_s: float = field(default_factory=time.monotonic)

    def done(self) -> bool:
        return self.stop.is_set() or len(self.history) >= self.calls_max

    def now(self) -> float:
        return time.monotonic() - self.started_s

    def record(self, op: Operation) -> None:
        self.history.append(op)
        self.counts[f"{op.kind} {op.outcome}"] += 1


def seen_record(value: object) -> tuple[int, Record | None]:
    """The version a read found (to expect next) and what the model reads (None for
    absent or deleted)."""
    if value is None:
        return 0, None
    version: int = value.version  # type: ignore[attr-defined]
    if value.deleted:  # type: ignore[attr-defined]
        return version, None
    return version, Record(version, value.value.decode())  # type: ignore[attr-defined]


async def timed_read(client: Client, number: int, key: str, work: Workload) -> int | None:
    """One read, recorded; the version it found (None when it failed: dropped)."""
    invoke_s = work.now()
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            value = await client.get_record(key, include_deleted=True)
    except (SR3Error, TimeoutError) as exc:
        work.errors[f"read {type(exc).__name__}"] += 1
        work.counts["read failed"] += 1
        return None
    version, observed = seen_record(value)
    work.record(Operation(number, key, "read", invoke_s, work.now(), "ok", observed=observed))
    return version


async def timed_change(
    client: Client, number: int, key: str, expected: int, value: str | None, work: Workload
) -> int | None:
    """One compare-and-set write (``value``) or delete (None), recorded; the version the
    register is known to hold after it (None when unknown)."""
    kind: Kind = "delete" if value is None else "write"
    invoke_s = work.now()
    outcome: Outcome = "ok"
    known: int | None = expected + 1
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            if value is None:
                version = await client.delete_record(key, expected_version=expected)
            else:
                version = await client.put_record(key, value.encode(), expected_version=expected)
        if version != expected + 1:
            work.anomalies.append(f"{kind} of {key} at {expected} acknowledged as {version}")
    except RecordConflict as exc:
        outcome, known = "fail", exc.current
        if exc.current == expected:
            work.anomalies.append(f"{kind} of {key} refused at its own version {expected}")
    except (SR3Error, TimeoutError) as exc:
        work.errors[f"{kind} {type(exc).__name__}"] += 1
        outcome, known = "unknown", None
    return_s = math.inf if outcome == "unknown" else work.now()
    work.record(Operation(number, key, kind, invoke_s, return_s, outcome, expected, value))
    return known


async def client_loop(client: Client, number: int, rng: random.Random, work: Workload) -> None:
    """Reads, writes and deletes on random keys until the workload is done. A write
    expects the version this client last saw, now and then a guess around it."""
    known: dict[str, int | None] = dict.fromkeys(work.keys)
    serial = 0
    while not work.done():
        key = rng.choice(work.keys)
        last = known[key]
        roll = rng.random()
        if last is None or roll < 0.35:
            known[key] = await timed_read(client, number, key, work)
            continue
        expected = last if rng.random() < 0.8 else max(0, last + rng.choice([-1, 1, 2]))
        serial += 1
        value = None if roll > 0.88 and expected > 0 else f"c{number}.{serial}"
        known[key] = await timed_change(client, number, key, expected, value, work)
        await asyncio.sleep(rng.uniform(*CLIENT_PAUSE_S))


async def run_clients(clients: Sequence[Client], rng: random.Random, work: Workload) -> None:
    async with asyncio.TaskGroup() as group:
        for number, client in enumerate(clients):
            client_rng = random.Random(rng.randrange(2**32))
            group.create_task(client_loop(client, number, client_rng, work))


def verdicts(history: Sequence[Operation]) -> dict[str, CheckResult]:
    by_key: dict[str, list[Operation]] = collections.defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    return {key: check_key(ops, STEP_BUDGET) for key, ops in sorted(by_key.items())}


def summary(work: Workload, results: dict[str, CheckResult]) -> str:
    unknown = sum(1 for op in work.history if op.outcome == "unknown")
    lines = [
        f"seed {SEED} (replay with {SEED_ENV}={SEED}); {len(work.history)} calls checked "
        f"in {work.now():.1f} s, {unknown} unknown",
        f"outcomes: {dict(sorted(work.counts.items()))}",
        f"errors: {dict(sorted(work.errors.items()))}",
    ]
    lines += [f"{key}: {result.verdict} in {result.steps} steps" for key, result in results.items()]
    return "\n".join(lines)


def assert_linearizable(work: Workload, results: dict[str, CheckResult]) -> None:
    report = summary(work, results)
    print(report)
    assert not work.anomalies, f"{report}\n" + "\n".join(work.anomalies[:20])
    for result in results.values():
        # "unknown" (past the step budget) fails too: it proves nothing.
        assert result.verdict == "ok", f"{report}\n{result.describe()}"


# -- the nemesis -----------------------------------------------------------------------


@dataclass
class Nemesis:
    """Impairs one peer at a time, from a seeded script: kill and restart, freeze and
    thaw; once past a third of the run a new peer joins, past two thirds one leaves."""

    cluster: LocalCluster
    rng: random.Random
    work: Workload
    log: list[str] = field(default_factory=list)
    left: set[str] = field(default_factory=set)
    joined: str | None = None

    def note(self, what: str) -> None:
        self.log.append(f"{self.work.now():6.1f} s {what}")

    def candidates(self) -> list[str]:
        return [p.peer_id for p in self.cluster.cluster.peers if p.peer_id not in self.left]

    async def run(self, duration_s: float) -> None:
        started_s = time.monotonic()
        while not self.work.done():
            elapsed_s = time.monotonic() - started_s
            if elapsed_s > duration_s:
                break
            await asyncio.sleep(self.rng.uniform(*PAUSE_S))
            if self.joined is None and elapsed_s > duration_s / 3:
                await self.join()
            elif self.joined is not None and not self.left and elapsed_s > duration_s * 2 / 3:
                await self.leave()
            elif self.rng.random() < 0.5:
                await self.kill_and_restart(self.rng.choice(self.candidates()))
            else:
                await self.freeze_and_thaw(self.rng.choice(self.candidates()))

    async def kill_and_restart(self, victim: str) -> None:
        down_s = self.rng.uniform(*KILL_S)
        self.note(f"SIGKILL {victim} for {down_s:.1f} s")
        await asyncio.to_thread(self.cluster.kill, victim)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.cluster.start, victim)
        self.note(f"{victim} restarted")

    async def freeze_and_thaw(self, victim: str) -> None:
        frozen_s = self.rng.uniform(*FREEZE_S)
        self.note(f"SIGSTOP {victim} for {frozen_s:.1f} s")
        self.cluster.signal(victim, signal.SIGSTOP)
        try:
            await asyncio.sleep(frozen_s)
        finally:
            self.cluster.signal(victim, signal.SIGCONT)
        self.note(f"SIGCONT {victim}")

    async def join(self) -> None:
        self.note("a new peer joins")
        member = await asyncio.to_thread(self.cluster.add_peer)
        self.joined = member.peer_id
        self.note(f"{member.peer_id} joined")

    async def leave(self) -> None:
        # Not a seed (restarted peers join through the first two) nor the newcomer.
        seeds = {p.peer_id for p in self.cluster.cluster.peers[:2]}
        leaver = self.rng.choice(
            [p for p in self.candidates() if p not in seeds and p != self.joined]
        )
        self.note(f"{leaver} leaves")
        self.left.add(leaver)
        async with Client(self.cluster.ring, self.cluster.secret) as admin:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await admin.leave(leaver, timeout_s=LEAVE_TIMEOUT_S)
        for _ in range(int(RESTART_TIMEOUT_S / 0.2)):  # bounded: it exits once done
            if not self.cluster.running(leaver):
                break
            await asyncio.sleep(0.2)
        await asyncio.to_thread(self.cluster.stop, leaver)  # reaps it (or stops it)
        self.note(f"{leaver} has left")

    async def heal(self) -> None:
        """Every peer that did not leave running and thawed."""
        for peer_id in self.candidates():
            if self.cluster.running(peer_id):
                self.cluster.signal(peer_id, signal.SIGCONT)
            else:
                await asyncio.to_thread(self.cluster.start, peer_id)


# -- 1. a history under faults -----------------------------------------------------------


@pytest.mark.slow
async def test_records_stay_linearizable_through_kills_freezes_joins_and_leaves(
    make_cluster: MakeCluster, rng: random.Random
) -> None:
    """Breaks: peers SIGKILLed and restarted, frozen and thawed (one at a time), a peer
    joins and another leaves, while 6 clients write, delete and read 4 keys.
    Must hold: the history (thousands of calls) is linearizable per key; every write
    acknowledged is acknowledged at the version it expected plus one."""
    cluster = make_cluster(5, peer_flags=[*PEER_FLAGS, "--seed", str(rng.randrange(2**31))])
    work = Workload(HISTORY_KEYS, CALLS_MAX)
    nemesis = Nemesis(cluster, random.Random(rng.randrange(2**32)), work)
    clients = [Client(cluster.ring, cluster.secret) for _ in range(HISTORY_CLIENTS)]
    try:

        async def impair_then_stop() -> None:
            try:
                await nemesis.run(NEMESIS_S)
            finally:
                work.stop.set()

        async with asyncio.TaskGroup() as group:
            group.create_task(impair_then_stop())
            group.create_task(run_clients(clients, rng, work))
        await nemesis.heal()
        # After the faults: one more read of every key, from a fresh client.
        async with Client(cluster.ring, cluster.secret) as reader:
            for key in HISTORY_KEYS:
                await timed_read(reader, HISTORY_CLIENTS, key, work)
    finally:
        for client in clients:
            await client.close()
    print("\n".join(nemesis.log))
    rounds = [client.records.proposer.stats for client in clients]
    print(
        f"rounds: {sum(s.rounds for s in rounds)} for {sum(s.operations for s in rounds)} "
        f"operations; fast creates {sum(s.fast_creates for s in rounds)}, held writes "
        f"{sum(s.held_writes for s in rounds)}, pre-empted {sum(s.preempted for s in rounds)}"
    )
    assert nemesis.joined is not None and nemesis.left, nemesis.log
    results = await asyncio.to_thread(verdicts, work.history)
    assert_linearizable(work, results)
    assert len(work.history) >= 1000, summary(work, results)


# -- 2. the checker catches a proposer that skips phase 1 --------------------------------

BROKEN_CLIENTS = 4
BROKEN_KEYS = ("broken/a", "broken/b")
BROKEN_CALLS = 300
BROKEN_ATTEMPTS_MAX = 5


async def promises_without_asking(
    self: Proposer, key: str, acceptors: Acceptors, ballot: Ballot, causes: list[str]
) -> list[Slot] | None:
    """Phase 1 skipped: as if every acceptor promised and had accepted nothing."""
    return [paxos.NOTHING] * acceptors.promise_quorum


async def test_a_proposer_that_skips_phase_one_is_caught(
    ring: LocalCluster, rng: random.Random, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks: every client's proposer skips the prepare and proposes as if the key were
    new, with 4 concurrent writers on 2 keys.
    Must hold: the checker finds a violation within a few bounded runs."""
    monkeypatch.setattr(Proposer, "_prepare", promises_without_asking)
    tag = rng.randrange(10**9)
    found: list[str] = []
    for attempt in range(BROKEN_ATTEMPTS_MAX):
        keys = tuple(f"{key}/{tag}/{attempt}" for key in BROKEN_KEYS)
        work = Workload(keys, BROKEN_CALLS)
        clients = [Client(ring.ring, ring.secret) for _ in range(BROKEN_CLIENTS)]
        try:
            await run_clients(clients, rng, work)
        finally:
            for client in clients:
                await client.close()
        results = await asyncio.to_thread(verdicts, work.history)
        print(summary(work, results))
        found = [r.describe() for r in results.values() if r.verdict == "violation"]
        if found:
            print(f"caught in run {attempt + 1}:\n{found[0][:3000]}")
            break
    assert found, f"no violation found in {BROKEN_ATTEMPTS_MAX} runs (seed {SEED})"


# -- 3. eight writers race to create a key ------------------------------------------------

RACE_WRITERS = 8
RACE_ROUNDS = 50
RACE_KILL_EVERY = 10


async def race(clients: Sequence[Client], key: str) -> list[int | BaseException]:
    """Every client creates ``key`` with its own value, all released at once."""
    go = asyncio.Event()

    async def create(number: int) -> int:
        await go.wait()
        async with asyncio.timeout(CALL_TIMEOUT_S):
            return await clients[number].put_record(
                key, f"writer-{number}".encode(), expected_version=0
            )

    tasks = [asyncio.ensure_future(create(number)) for number in range(len(clients))]
    await asyncio.sleep(0)
    go.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


async def read_value(cluster: LocalCluster, client: Client | None, key: str) -> tuple[int, bytes]:
    if client is None:
        async with Client(cluster.ring, cluster.secret) as fresh:
            record = await fresh.get_record(key)
    else:
        record = await client.get_record(key)
    assert record is not None, key
    return record.version, record.value


async def test_eight_writers_creating_one_key_elect_exactly_one(
    ring: LocalCluster, rng: random.Random
) -> None:
    """Breaks: 8 clients create the same key at once, 50 times; every 10th time one of the
    key's acceptors is then SIGKILLed.
    Must hold: exactly one writer wins (version 1); every other is told version 1 is
    chosen (RecordConflict); the winner's value reads back, from a fresh client also
    with the acceptor dead."""
    tag = rng.randrange(10**9)
    clients = [Client(ring.ring, ring.secret) for _ in range(RACE_WRITERS)]
    outcomes: collections.Counter[str] = collections.Counter()
    problems: list[str] = []
    try:
        for round_number in range(RACE_ROUNDS):
            key = f"race/{tag}/{round_number}"
            answers = await race(clients, key)
            winners = [n for n, answer in enumerate(answers) if answer == 1]
            for answer in answers:
                outcomes[type(answer).__name__ if isinstance(answer, BaseException) else "won"] += 1
            losers = [a for a in answers if a != 1]
            wrong = [a for a in losers if not (isinstance(a, RecordConflict) and a.current == 1)]
            if len(winners) != 1 or wrong:
                problems.append(f"round {round_number}: {answers!r}")
                continue
            expected = (1, f"writer-{winners[0]}".encode())
            reader = clients[rng.randrange(RACE_WRITERS)]
            assert await read_value(ring, reader, key) == expected, (round_number, SEED)
            if round_number % RACE_KILL_EVERY == RACE_KILL_EVERY // 2:
                view = await reader.ring()
                acceptors = view.ring.preference_list(key, view.record_quorums()[0])
                victim = rng.choice(acceptors).peer_id
                await asyncio.to_thread(ring.kill, victim)
                try:
                    seen = await read_value(ring, None, key)
                finally:
                    await asyncio.to_thread(ring.start, victim)
                assert seen == expected, (round_number, victim, SEED)
    finally:
        for client in clients:
            await client.close()
    print(f"seed {SEED}: {RACE_ROUNDS} rounds, outcomes {dict(outcomes)}")
    assert not problems, "\n".join(problems[:10])
