"""The linearizability checker (tests/linearizability.py) judged on histories whose answer
is known: small hand-written ones, random histories of a correct register with and
without one injected anomaly, a size that later tests will record, and a simulation of
today's per-replica compare-and-set, which issue 16 says is not linearizable and the
checker must catch.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Generator
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from linearizability import CheckResult, Kind, Operation, Outcome, Record, check, check_key

INF = math.inf


def write(
    client: int, at: tuple[float, float], expected: int, value: str, outcome: Outcome = "ok"
) -> Operation:
    return Operation(client, "k", "write", at[0], at[1], outcome, expected, value)


def read(client: int, at: tuple[float, float], seen: Record | None) -> Operation:
    return Operation(client, "k", "read", at[0], at[1], "ok", observed=seen)


def delete(
    client: int, at: tuple[float, float], expected: int, outcome: Outcome = "ok"
) -> Operation:
    return Operation(client, "k", "delete", at[0], at[1], outcome, expected)


def assert_verdict(result: CheckResult, verdict: str) -> None:
    assert result.verdict == verdict, result.describe()


def test_a_sequential_history_is_linearizable() -> None:
    history = [
        read(1, (0, 1), None),
        write(1, (2, 3), 0, "a"),
        read(2, (4, 5), Record(1, "a")),
        write(2, (6, 7), 1, "b"),
        write(1, (8, 9), 1, "c", "fail"),
        read(1, (10, 11), Record(2, "b")),
    ]
    assert_verdict(check(history), "ok")


def test_two_writers_both_acknowledged_at_one_version_is_a_violation() -> None:
    history = [write(1, (0, 5), 0, "a"), write(2, (1, 6), 0, "b")]
    result = check(history)
    assert_verdict(result, "violation")
    assert len(result.prefix) == 1 and len(result.stuck) == 1
    assert "expected version 0" in result.describe()


def test_a_compare_and_set_refused_at_the_current_version_is_a_violation() -> None:
    history = [write(1, (0, 1), 0, "a"), write(2, (2, 3), 1, "b", "fail")]
    assert_verdict(check(history), "violation")
    # Refused while another writer moves the version on: fine.
    racing = [*history, write(3, (1.5, 4), 1, "c")]
    assert_verdict(check(racing), "ok")


def test_a_read_of_a_value_never_written_is_a_violation() -> None:
    history = [write(1, (0, 1), 0, "a"), read(2, (2, 3), Record(1, "z"))]
    assert_verdict(check(history), "violation")


def test_a_read_of_the_losing_writers_value_is_a_violation() -> None:
    history = [
        write(1, (0, 5), 0, "winner"),
        write(2, (1, 6), 0, "loser", "fail"),
        read(3, (7, 8), Record(1, "loser")),
    ]
    assert_verdict(check(history), "violation")


def test_a_stale_read_after_a_newer_write_completed_is_a_violation() -> None:
    history = [
        write(1, (0, 1), 0, "a"),
        write(1, (2, 3), 1, "b"),
        read(2, (4, 5), Record(1, "a")),
    ]
    result = check(history)
    assert_verdict(result, "violation")
    assert result.stuck == (history[2],)


def test_the_same_stale_read_overlapping_the_newer_write_is_fine() -> None:
    history = [
        write(1, (0, 1), 0, "a"),
        write(1, (2, 5), 1, "b"),
        read(2, (3, 4), Record(1, "a")),
    ]
    assert_verdict(check(history), "ok")


def test_a_timed_out_write_that_shows_up_later_is_fine() -> None:
    history = [
        write(1, (0, INF), 0, "a", "unknown"),
        read(2, (5, 6), Record(1, "a")),
        write(2, (7, 8), 1, "b"),
    ]
    assert_verdict(check(history), "ok")


def test_a_timed_out_write_that_never_shows_up_is_fine() -> None:
    history = [write(1, (0, INF), 0, "a", "unknown"), read(2, (5, 6), None)]
    assert_verdict(check(history), "ok")


def test_a_timed_out_write_cannot_explain_a_value_it_did_not_write() -> None:
    history = [write(1, (0, INF), 0, "a", "unknown"), read(2, (5, 6), Record(1, "b"))]
    assert_verdict(check(history), "violation")


def test_overlapping_calls_with_one_valid_interleaving_are_fine() -> None:
    # Only the order b-write, read(b), a-write at version 1, read(a) explains this.
    history = [
        write(1, (0, 10), 1, "a"),
        write(2, (0, 10), 0, "b"),
        read(3, (1, 9), Record(1, "b")),
        read(4, (2, 11), Record(2, "a")),
        write(5, (0, 10), 0, "c", "fail"),
    ]
    assert_verdict(check(history), "ok")


def test_deletes_are_a_compare_and_set_writing_a_tombstone() -> None:
    history = [
        write(1, (0, 1), 0, "a"),
        delete(1, (2, 3), 1),
        read(2, (4, 5), None),
        delete(2, (6, 7), 1, "fail"),
        write(2, (8, 9), 2, "b"),
        read(1, (10, 11), Record(3, "b")),
    ]
    assert_verdict(check(history), "ok")
    resurrected = [*history[:2], read(2, (4, 5), Record(1, "a"))]
    assert_verdict(check(resurrected), "violation")
    assert_verdict(check([*history[:2], delete(2, (4, 5), 1)]), "violation")


def test_keys_are_checked_apart() -> None:
    other = Operation(9, "other", "write", 0, 1, "ok", 0, "x")
    history = [write(1, (0, 1), 0, "a"), other, read(2, (2, 3), Record(1, "a"))]
    assert_verdict(check(history), "ok")
    # The same read on the other key would see a value that was never written there.
    wrong = Operation(2, "other", "read", 2, 3, "ok", observed=Record(1, "a"))
    result = check([*history, wrong])
    assert_verdict(result, "violation")
    assert result.key == "other"


def test_past_the_step_budget_the_verdict_is_unknown_never_ok() -> None:
    # Twelve concurrent writes that only go in one order, then a read nothing explains.
    history = [write(c, (0, 10), c, f"v{c}") for c in range(12)]
    history.append(read(99, (11, 12), Record(1, "never")))
    assert_verdict(check_key(history, step_budget=5), "unknown")
    assert_verdict(check_key(history), "violation")


# Random histories of a correct register: each call takes effect at time i, and its
# interval is drawn around that point, so calls overlap but their order is legal.


@dataclass(frozen=True)
class Planned:
    """One call of a random sequential run before it is given an interval."""

    kind: Kind
    expected_version: int
    value: str | None
    outcome: Outcome
    observed: Record | None


def sequential_run(rng: random.Random, length: int) -> list[Planned]:
    """What a correct register answers to ``length`` random calls, in order."""
    version, value = 0, None
    planned: list[Planned] = []
    for i in range(length):
        kind: Kind = rng.choice(["read", "read", "write", "write", "delete"])
        if kind == "read":
            seen = None if value is None else Record(version, value)
            planned.append(Planned("read", 0, None, "ok", seen))
            continue
        expected = version if rng.random() < 0.7 else rng.randrange(version + 2)
        new_value = f"v{i}" if kind == "write" else None
        if expected == version:
            version, value = version + 1, new_value
            planned.append(Planned(kind, expected, new_value, "ok", None))
        else:
            planned.append(Planned(kind, expected, new_value, "fail", None))
    return planned


def timed_history(rng: random.Random, planned: list[Planned]) -> list[Operation]:
    """Intervals around each call's point of effect; some writes time out."""
    history = []
    for i, call in enumerate(planned):
        invoke_s = i - rng.uniform(0, 3)
        return_s = i + rng.uniform(0, 3)
        outcome = call.outcome
        if call.kind != "read" and rng.random() < 0.1:
            outcome, return_s = "unknown", INF
        history.append(
            Operation(
                i % 8,
                "k",
                call.kind,
                invoke_s,
                return_s,
                outcome,
                call.expected_version,
                call.value,
                call.observed,
            )
        )
    return history


def inject_anomaly(rng: random.Random, history: list[Operation], kind: str) -> list[Operation]:
    """``history`` with one call added that no register can explain."""
    end_s = max((op.return_s for op in history if op.return_s != INF), default=0) + 1
    wins = [op for op in history if op.kind != "read" and op.outcome == "ok"]
    if kind == "stale_read":
        written = [op for op in wins if op.kind == "write" and op.expected_version + 1 < len(wins)]
        if written:
            old = rng.choice(written)
            assert old.value is not None
            seen = Record(old.expected_version + 1, old.value)
            return [*history, read(99, (end_s, end_s + 1), seen)]
    if kind == "double_win" and wins:
        twin = rng.choice(wins)
        at = (twin.invoke_s, twin.return_s + 1)
        return [*history, write(99, at, twin.expected_version, "twin")]
    return [*history, read(99, (end_s, end_s + 1), Record(1, "never written"))]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 40))
def test_random_histories_of_a_correct_register_are_linearizable(seed: int, length: int) -> None:
    rng = random.Random(seed)
    history = timed_history(rng, sequential_run(rng, length))
    assert_verdict(check(history), "ok")


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(1, 40),
    anomaly=st.sampled_from(["bogus_value", "stale_read", "double_win"]),
)
def test_one_injected_anomaly_is_always_found(seed: int, length: int, anomaly: str) -> None:
    rng = random.Random(seed)
    history = inject_anomaly(rng, timed_history(rng, sequential_run(rng, length)), anomaly)
    assert_verdict(check(history), "violation")


# A simulated ring: replicas that each do compare-and-set on their own (today's records)
# and clients interleaved one replica message at a time by a seeded scheduler.


@dataclass
class Ring:
    """Replicas as dicts of key -> (version, value); the clock counts scheduler steps."""

    replica_count: int
    read_quorum: int
    write_quorum: int
    replicas: list[dict[str, tuple[int, str | None]]] = field(default_factory=list)
    clock: int = 0
    history: list[Operation] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replicas = [{} for _ in range(self.replica_count)]


Client = Generator[None, None, None]


def quorum_read(
    ring: Ring, rng: random.Random, key: str
) -> Generator[None, None, tuple[int, str | None]]:
    """The newest of the first ``read_quorum`` answers, one replica per step."""
    answers = []
    for replica in rng.sample(ring.replicas, ring.read_quorum):
        answers.append(replica.get(key, (0, None)))
        yield
    newest = max(version for version, _ in answers)
    return next(answer for answer in answers if answer[0] == newest)


def per_replica_cas(
    ring: Ring, rng: random.Random, key: str, expected: int, value: str
) -> Generator[None, None, bool]:
    """A CAS sent to every replica, each applying it if its own version matches (never
    undone when the write as a whole fails); ok with ``write_quorum`` acks."""
    acks = 0
    for replica in rng.sample(ring.replicas, len(ring.replicas)):
        if replica.get(key, (0, None))[0] == expected:
            replica[key] = (expected + 1, value)
            acks += 1
        yield
    return acks >= ring.write_quorum


def writer(ring: Ring, rng: random.Random, client: int, keys: list[str], rounds: int) -> Client:
    """Reads a key, then writes its own value at the version it read."""
    for round_index in range(rounds):
        key = rng.choice(keys)
        invoke_s = float(ring.clock)
        version, value = yield from quorum_read(ring, rng, key)
        seen = None if value is None else Record(version, value)
        ring.history.append(
            Operation(client, key, "read", invoke_s, float(ring.clock), "ok", observed=seen)
        )
        invoke_s = float(ring.clock)
        new_value = f"c{client}r{round_index}"
        won = yield from per_replica_cas(ring, rng, key, version, new_value)
        ring.history.append(
            Operation(
                client,
                key,
                "write",
                invoke_s,
                float(ring.clock),
                "ok" if won else "fail",
                version,
                new_value,
            )
        )


def simulate(
    seed: int, replica_count: int, quorum: int, keys: list[str], rounds: int
) -> list[Operation]:
    """8 writers on ``keys``, one replica message per step, in a seeded random order."""
    rng = random.Random(seed)
    ring = Ring(replica_count, quorum, quorum)
    clients = [writer(ring, rng, client, keys, rounds) for client in range(8)]
    while clients:
        client = rng.choice(clients)
        ring.clock += 1
        try:
            next(client)
        except StopIteration:
            clients.remove(client)
    return ring.history


SEEDS = list(range(20))


def test_per_replica_compare_and_set_is_caught_for_some_seed() -> None:
    found = []
    for seed in SEEDS:
        result = check(simulate(seed, replica_count=3, quorum=2, keys=["k"], rounds=3))
        assert result.verdict != "unknown", f"seed {seed}: {result.describe()}"
        if result.verdict == "violation":
            found.append(seed)
    assert found, f"no violation in seeds {SEEDS}"


def test_one_replica_is_an_atomic_register_and_passes() -> None:
    for seed in SEEDS:
        result = check(simulate(seed, replica_count=1, quorum=1, keys=["k"], rounds=3))
        assert_verdict(result, "ok")


def test_a_thousand_calls_over_three_keys_check_in_seconds() -> None:
    history = simulate(7, replica_count=1, quorum=1, keys=["a", "b", "c"], rounds=63)
    assert len(history) >= 1000
    started_s = time.monotonic()
    result = check(history)
    elapsed_s = time.monotonic() - started_s
    assert_verdict(result, "ok")
    assert elapsed_s < 3, f"took {elapsed_s:.1f}s"
