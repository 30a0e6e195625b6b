"""Histories of record operations recorded from real clients, for the linearizability
checker (``tests/linearizability.py``).

What it is for: a test runs clients doing compare-and-set writes, deletes and reads on a
few keys and records every call as it went (``Call``: the checker's ``Operation``, when
the call really returned and what it raised), then asks the checker about each key.
``tests/test_consensus_ring.py`` runs its clients in the test's own process;
``tests/fault_client.py`` runs them in a host of the network fault lab and writes the
calls as JSON lines (``call_to_json``) that the test reads back (``call_from_json``).

How outcomes are classified: an acknowledged write or delete is ``ok``; a
``RecordConflict`` is ``fail`` (definitely not applied: the register holds another
version); any other error, or no answer within the workload's call timeout, is
``unknown`` (it may still take effect: ``RecordUnknown``, ``RecordContention``, and a
``QuorumError`` or ``DataUnavailable`` whose value reached one acceptor). A read that
failed changed nothing: it is kept as a call (``fail``) but the checker drops it.

Times are ``time.monotonic()`` minus the workload's origin. The monotonic clock is one
for every process on the machine, network namespaces included, so a workload with
origin 0 records times that compare across processes.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from linearizability import CheckResult, Kind, Operation, Outcome, Record, check_key
from support import SEED, SEED_ENV

from ring.client import Client, RecordValue
from ring.errors import RecordConflict, SR3Error

__all__ = [
    "CALL_TIMEOUT_S",
    "CLIENT_PAUSE_S",
    "STEP_BUDGET",
    "Call",
    "Workload",
    "assert_linearizable",
    "call_from_json",
    "call_to_json",
    "client_loop",
    "run_clients",
    "seen_record",
    "summary",
    "timed_change",
    "timed_read",
    "verdicts",
]

# One call bounded in time: past this it is recorded as unknown (it may still land).
CALL_TIMEOUT_S = 30.0
# Steps of the checker's search per key before its verdict is "unknown".
STEP_BUDGET = 20_000_000
# A client's pause between changes: about 100 calls a second from 6 clients.
CLIENT_PAUSE_S = (0.02, 0.08)
MESSAGE_CHARS_MAX = 300


@dataclass(frozen=True)
class Call:
    """One call as it went: the operation the checker judges (an unknown outcome returns
    at +inf there), when the call really returned, and the error it raised ("" if none)."""

    op: Operation
    ended_s: float
    error: str = ""
    # The error's text, cut to ``MESSAGE_CHARS_MAX`` (what a failure report shows).
    message: str = ""

    @property
    def answered(self) -> bool:
        """Whether the ring gave a definite answer: an acknowledged write, a conflict,
        or a read that returned."""
        return self.op.outcome == "ok" or (self.op.kind != "read" and self.op.outcome == "fail")

    @property
    def failed_read(self) -> bool:
        return self.op.kind == "read" and self.op.outcome != "ok"


@dataclass
class Workload:
    """The calls clients made and what else was seen, with the bounds they run under."""

    keys: tuple[str, ...]
    calls_max: int
    call_timeout_s: float = CALL_TIMEOUT_S
    pause_s: tuple[float, float] = CLIENT_PAUSE_S
    # About this share of the calls are deletes (a third are reads, the rest writes).
    delete_share: float = 0.12
    origin_s: float = field(default_factory=time.monotonic)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[Call] = field(default_factory=list)
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    # Answers no register gives, seen directly (a CAS acknowledged at another version).
    anomalies: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def history(self) -> list[Operation]:
        """The operations the checker takes: every call but the failed reads."""
        return [call.op for call in self.calls if not call.failed_read]

    def done(self) -> bool:
        return self.stop.is_set() or self.checked >= self.calls_max

    def now(self) -> float:
        return time.monotonic() - self.origin_s

    def record(self, op: Operation, ended_s: float, error: BaseException | None = None) -> None:
        name = "" if error is None else type(error).__name__
        message = "" if error is None else str(error)[:MESSAGE_CHARS_MAX]
        self.calls.append(Call(op, ended_s, name, message))
        if op.kind == "read" and op.outcome != "ok":
            self.counts["read failed"] += 1
        else:
            self.checked += 1
            self.counts[f"{op.kind} {op.outcome}"] += 1
        if error:
            self.errors[f"{op.kind} {name}"] += 1


def seen_record(value: RecordValue | None) -> tuple[int, Record | None]:
    """The version a read found (to expect next) and what the model reads (None for
    absent or deleted)."""
    if value is None:
        return 0, None
    if value.deleted:
        return value.version, None
    return value.version, Record(value.version, value.value.decode())


async def timed_read(client: Client, number: int, key: str, work: Workload) -> int | None:
    """One read, recorded; the version it found (None when it failed)."""
    invoke_s = work.now()
    try:
        async with asyncio.timeout(work.call_timeout_s):
            value = await client.get_record(key, include_deleted=True)
    except (SR3Error, TimeoutError) as exc:
        ended_s = work.now()
        failed = Operation(number, key, "read", invoke_s, ended_s, "fail")
        work.record(failed, ended_s, exc)
        return None
    version, observed = seen_record(value)
    ended_s = work.now()
    work.record(Operation(number, key, "read", invoke_s, ended_s, "ok", observed=observed), ended_s)
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
    error: BaseException | None = None
    try:
        async with asyncio.timeout(work.call_timeout_s):
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
        outcome, known, error = "unknown", None, exc
    ended_s = work.now()
    return_s = math.inf if outcome == "unknown" else ended_s
    work.record(
        Operation(number, key, kind, invoke_s, return_s, outcome, expected, value), ended_s, error
    )
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
            if known[key] is None:  # no answer: do not spin on a ring that gives none
                await asyncio.sleep(rng.uniform(*work.pause_s))
            continue
        expected = last if rng.random() < 0.8 else max(0, last + rng.choice([-1, 1, 2]))
        serial += 1
        delete = roll > 1.0 - work.delete_share and expected > 0
        value = None if delete else f"c{number}.{serial}"
        known[key] = await timed_change(client, number, key, expected, value, work)
        await asyncio.sleep(rng.uniform(*work.pause_s))


async def run_clients(
    clients: Sequence[Client], rng: random.Random, work: Workload, *, first_number: int = 0
) -> None:
    """Every client's loop at once, each with its own generator drawn from ``rng``;
    clients are numbered from ``first_number`` in the history."""
    async with asyncio.TaskGroup() as group:
        for number, client in enumerate(clients, start=first_number):
            client_rng = random.Random(rng.randrange(2**32))
            group.create_task(client_loop(client, number, client_rng, work))


def verdicts(history: Sequence[Operation]) -> dict[str, CheckResult]:
    """The checker's verdict for each key of ``history``."""
    by_key: dict[str, list[Operation]] = collections.defaultdict(list)
    for op in history:
        by_key[op.key].append(op)
    return {key: check_key(ops, STEP_BUDGET) for key, ops in sorted(by_key.items())}


def summary(work: Workload, results: dict[str, CheckResult]) -> str:
    history = work.history
    unknown = sum(1 for op in history if op.outcome == "unknown")
    lines = [
        f"seed {SEED} (replay with {SEED_ENV}={SEED}); {len(history)} calls checked "
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


# -- JSON lines ----------------------------------------------------------------------------


def call_to_json(call: Call) -> dict[str, Any]:
    """A call as a JSON object (an unknown outcome's +inf return as null)."""
    op = call.op
    observed = None if op.observed is None else [op.observed.version, op.observed.value]
    return {
        "client": op.client,
        "key": op.key,
        "kind": op.kind,
        "invoke_s": op.invoke_s,
        "return_s": None if op.return_s == math.inf else op.return_s,
        "outcome": op.outcome,
        "expected_version": op.expected_version,
        "value": op.value,
        "observed": observed,
        "ended_s": call.ended_s,
        "error": call.error,
        "message": call.message,
    }


def call_from_json(data: dict[str, Any]) -> Call:
    """The call ``call_to_json`` wrote (``ValueError`` or ``KeyError`` if malformed)."""
    observed = data["observed"]
    kind, outcome = data["kind"], data["outcome"]
    if kind not in {"read", "write", "delete"} or outcome not in {"ok", "fail", "unknown"}:
        raise ValueError(f"not a call: {data}")
    op = Operation(
        client=int(data["client"]),
        key=str(data["key"]),
        kind=kind,
        invoke_s=float(data["invoke_s"]),
        return_s=math.inf if data["return_s"] is None else float(data["return_s"]),
        outcome=outcome,
        expected_version=int(data["expected_version"]),
        value=None if data["value"] is None else str(data["value"]),
        observed=None if observed is None else Record(int(observed[0]), str(observed[1])),
    )
    return Call(op, float(data["ended_s"]), str(data["error"]), str(data.get("message", "")))
