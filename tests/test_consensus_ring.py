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
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from histories import (
    CALL_TIMEOUT_S,
    Workload,
    assert_linearizable,
    run_clients,
    summary,
    timed_read,
    verdicts,
)
from support import SEED, MakeCluster

from ring import paxos
from ring.client import Client
from ring.client.proposer import Acceptors, Proposer
from ring.errors import RecordConflict
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

# Bounds of the history test: the nemesis script runs about NEMESIS_S, the clients stop
# with it or at CALLS_MAX calls, whichever comes first.
HISTORY_CLIENTS = 6
HISTORY_KEYS = ("lin/a", "lin/b", "lin/c", "lin/d")
NEMESIS_S = 75.0
CALLS_MAX = 12_000
# Impairments the nemesis applies one at a time; how long each lasts.
KILL_S = (0.5, 6.0)
FREEZE_S = (0.5, 4.0)
PAUSE_S = (0.5, 2.5)
LEAVE_TIMEOUT_S = 90.0
RESTART_TIMEOUT_S = 60.0


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
